"""Acknowledgement, clearing and escalation (docs/acknowledgement.md): who acknowledged a
notification and how, when it was cleared, a child's parent and step, a parent's next step;
each list's ack_required_from, escalation steps and repeat."""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    # The indexes are built CONCURRENTLY on PostgreSQL (no lock on a table of millions of rows),
    # which cannot run inside a transaction. The new columns are nullable or have a database
    # default: adding them changes only the catalogue, and web processes of the previous release
    # keep inserting rows while the deployment migrates.
    atomic = False


    dependencies = [
        ('notifications', '0024_delivered_locally'),
    ]

    operations = [
        migrations.AddField(
            model_name='notification',
            name='acknowledged_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='acknowledged_by',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AddField(
            model_name='notification',
            name='acknowledged_note',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='notification',
            name='acknowledged_via',
            field=models.CharField(blank=True, choices=[('link', 'the link in the message'), ('sms', 'an SMS reply'), ('teams', 'the Teams card'), ('console', 'the console'), ('api', 'the staff API'), ('site', 'the site (its HMI)')], db_default='', default='', max_length=16),
        ),
        migrations.AddField(
            model_name='notification',
            name='asks_ack',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='notification',
            name='cleared_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='cleared_note',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='notification',
            name='escalation_due_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='escalation_of',
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='escalation_step',
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='ack_required_from',
            field=models.CharField(choices=[('critical', 'critical only'), ('high', 'high and critical'), ('normal', 'normal, high and critical'), ('low', 'every notification'), ('none', 'none')], db_default='high', default='high', help_text='Notifications of this priority and above carry an acknowledgement link (email, Teams, SMS) and can escalate.', max_length=8, verbose_name='acknowledgement asked from'),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='escalation',
            field=models.JSONField(blank=True, db_default=models.Value([], output_field=models.JSONField()), default=list),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='repeat_last_every_seconds',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='After the last escalation step, repeat it this often until someone acknowledges; 0: never.'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(condition=models.Q(('escalation_due_at__isnull', False)), fields=['escalation_due_at'], name='notif_escalation_due_idx'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(condition=models.Q(('escalation_of__isnull', False)), fields=['escalation_of'], name='notif_escalation_of_idx'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(condition=models.Q(('acknowledged_at__isnull', True), ('asks_ack', True), ('cleared_at__isnull', True)), fields=['priority', 'created_at'], name='notif_unacknowledged_idx'),
        ),
    ]
