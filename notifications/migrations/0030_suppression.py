"""Suppression: the Suppressed status and why (suppressed_by), duplicates (dedup_key, the
occurrences counted on the row they repeat), flood digests (held_for_digest), silences,
maintenance windows and flood windows, and each list's dedup and flood settings.

The new columns have database defaults or allow NULL, so adding them changes only the
catalogue. The status check constraint is replaced NOT VALID here (a brief lock, no scan);
0028 validates it and builds the two new indexes concurrently.
"""

import django.core.validators
import django.utils.timezone
from django.db import migrations, models

from notifications.migration_operations import ReplaceCheckConstraintNotValid


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0029_escalation_step_unique'),
    ]

    operations = [
        migrations.CreateModel(
            name='FloodWindow',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('site', models.CharField(max_length=64)),
                ('list_name', models.CharField(max_length=200)),
                ('type', models.CharField(max_length=32)),
                ('started_at', models.DateTimeField()),
                ('ends_at', models.DateTimeField()),
                ('count', models.PositiveIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name='MaintenanceWindow',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('site', models.CharField(max_length=64, verbose_name='site id')),
                ('days', models.JSONField(default=list, help_text='Weekdays it starts on, 0 = Monday … 6 = Sunday.')),
                ('starts', models.TimeField()),
                ('ends', models.TimeField()),
                ('time_zone', models.CharField(default='UTC', help_text='IANA name, e.g. Europe/Berlin.', max_length=64)),
                ('reason', models.TextField(blank=True)),
                ('include_high', models.BooleanField(default=False)),
                ('include_critical', models.BooleanField(default=False)),
            ],
            options={
                'ordering': ['site', 'pk'],
            },
        ),
        migrations.CreateModel(
            name='Silence',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('site', models.CharField(blank=True, help_text='Blank: every site.', max_length=64, verbose_name='site id')),
                ('list_name', models.CharField(blank=True, help_text='Blank: every list.', max_length=200)),
                ('source_instance_id', models.CharField(blank=True, help_text='Blank: every source.', max_length=200)),
                ('subject_contains', models.CharField(blank=True, help_text='Case-insensitive; blank: every subject.', max_length=255)),
                ('starts_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('ends_at', models.DateTimeField()),
                ('reason', models.TextField()),
                ('created_by', models.CharField(blank=True, max_length=150)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('include_high', models.BooleanField(default=False)),
                ('include_critical', models.BooleanField(default=False)),
            ],
            options={
                'ordering': ['-starts_at'],
            },
        ),
        migrations.AddField(
            model_name='notification',
            name='dedup_key',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AddField(
            model_name='notification',
            name='held_for_digest',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='last_occurrence_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='occurrences',
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name='notification',
            name='suppressed_by',
            field=models.CharField(blank=True, db_default='', default='', max_length=80),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='dedup_window_seconds',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='A notification with the same dedup_key from the same site within this many seconds of the last one sent (and not acknowledged or cleared) is suppressed as its duplicate; 0: off.'),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='flood_threshold',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text="More notifications than this from one site per flood window are held and sent as one digest at the window's end (critical ones always singly); 0: off."),
        ),
        migrations.AddField(
            model_name='notificationlist',
            name='flood_window_seconds',
            field=models.PositiveIntegerField(db_default=60, default=60, help_text='The flood window, in seconds.', validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AlterField(
            model_name='notification',
            name='status',
            field=models.CharField(choices=[('Pending', 'Pending'), ('Retrying', 'Retrying'), ('Delivered', 'Delivered'), ('Parked', 'Parked'), ('Discarded', 'Discarded'), ('Suppressed', 'Suppressed')], default='Pending', max_length=16),
        ),
        migrations.AlterField(
            model_name='notificationcount',
            name='status',
            field=models.CharField(choices=[('Pending', 'Pending'), ('Retrying', 'Retrying'), ('Delivered', 'Delivered'), ('Parked', 'Parked'), ('Discarded', 'Discarded'), ('Suppressed', 'Suppressed')], max_length=16),
        ),
        ReplaceCheckConstraintNotValid(
            model_name='notification',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['Pending', 'Retrying', 'Delivered', 'Parked', 'Discarded', 'Suppressed'])), name='notif_status_valid'),
        ),
        migrations.AddConstraint(
            model_name='floodwindow',
            constraint=models.UniqueConstraint(fields=('site', 'list_name', 'type'), name='flood_window_unique_key'),
        ),
        migrations.AddIndex(
            model_name='silence',
            index=models.Index(fields=['ends_at'], name='silence_ends_idx'),
        ),
        migrations.AddConstraint(
            model_name='silence',
            constraint=models.CheckConstraint(condition=models.Q(('ends_at__gt', models.F('starts_at'))), name='silence_ends_after_start'),
        ),
    ]
