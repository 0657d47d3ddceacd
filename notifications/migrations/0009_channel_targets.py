"""Channels beyond email: typed list targets (Teams, webhooks, SMS, Apprise), per-channel
configuration and the provider message index for status callbacks; Administrators gain the
permissions to edit them (like lists and SMTP), idempotently, like 0004 and 0007."""

import django.core.validators
import django.db.models.deletion
import django.utils.timezone
import notifications.fields
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

CHANNEL_MODELS = ("teamstarget", "webhooktarget", "smstarget", "apprisetarget", "channelconfiguration")
# Like lists and the SMTP configuration: administrators only.
ADMINISTRATOR_PERMISSIONS = [
    ("notifications", f"{action}_{model}")
    for model in CHANNEL_MODELS
    for action in ("view", "add", "change", "delete")
]
GROUPS = {"Administrators": ADMINISTRATOR_PERMISSIONS}


def grant_roles(apps, schema_editor):
    app_config = apps.get_app_config("notifications")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # see 0004: migration state has no models module
    try:
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    finally:
        app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    for name, wanted in GROUPS.items():
        group = Group.objects.using(db).filter(name=name).first()
        if group is None:
            continue  # the roles were removed on purpose; do not bring them back
        for app_label, codename in wanted:
            permission = Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename)
            group.permissions.add(permission)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0008_recipient_state'),
    ]

    operations = [
        migrations.AlterField(
            model_name='channelhealth',
            name='channel',
            field=models.CharField(choices=[('email', 'email'), ('teams', 'teams'), ('webhook', 'webhook'), ('sms', 'sms'), ('apprise', 'apprise')], max_length=32),
        ),
        migrations.AlterField(
            model_name='deliverypolicy',
            name='channel',
            field=models.CharField(choices=[('email', 'email'), ('teams', 'teams'), ('webhook', 'webhook'), ('sms', 'sms'), ('apprise', 'apprise')], max_length=32, unique=True),
        ),
        migrations.AlterField(
            model_name='notification',
            name='type',
            field=models.CharField(choices=[('email', 'email'), ('teams', 'teams'), ('webhook', 'webhook'), ('sms', 'sms'), ('apprise', 'apprise')], default='email', max_length=32),
        ),
        migrations.CreateModel(
            name='AppriseTarget',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', notifications.fields.EncryptedTextField(help_text='Stored encrypted; shown masked.', verbose_name='Apprise URL')),
                ('display', models.CharField(blank=True, editable=False, max_length=500)),
                ('notification_list', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='apprise_targets', to='notifications.notificationlist')),
            ],
            options={
                'verbose_name': 'Apprise target',
                'ordering': ['pk'],
            },
        ),
        migrations.CreateModel(
            name='ChannelConfiguration',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('channel', models.CharField(choices=[('teams', 'Teams'), ('webhook', 'Webhook'), ('sms', 'Sms'), ('apprise', 'Apprise')], max_length=32, unique=True)),
                ('timeout_seconds', models.PositiveIntegerField(default=10, help_text='For every network call.', validators=[django.core.validators.MinValueValidator(1)])),
                ('provider', models.CharField(blank=True, choices=[('twilio', 'Twilio')], max_length=16)),
                ('account_sid', models.CharField(blank=True, max_length=64)),
                ('auth_token', notifications.fields.EncryptedTextField(blank=True, help_text='Stored encrypted; never exported or shown.')),
                ('from_number', models.CharField(blank=True, max_length=16, verbose_name='from number (E.164)')),
                ('api_base', models.URLField(blank=True, default='https://api.twilio.com', help_text="Where the provider's REST API is; change only for a test double or a regional edge.", max_length=500, verbose_name='API base URL')),
                ('max_segments', models.PositiveIntegerField(default=1, help_text='Subject and body are cut to fit this many SMS segments.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(10)])),
            ],
            options={
                'verbose_name': 'channel configuration',
                'verbose_name_plural': 'channel configuration',
                'ordering': ['channel'],
                'constraints': [models.CheckConstraint(condition=models.Q(('timeout_seconds__gte', 1)), name='channel_timeout_positive'), models.CheckConstraint(condition=models.Q(('max_segments__gte', 1), ('max_segments__lte', 10)), name='channel_segments_range')],
            },
        ),
        migrations.CreateModel(
            name='ProviderMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('provider', models.CharField(max_length=16)),
                ('provider_id', models.CharField(max_length=64)),
                ('target_ref', models.CharField(max_length=32)),
                ('provider_status', models.CharField(blank=True, max_length=32)),
                ('provider_status_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('notification', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='provider_messages', to='notifications.notification')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('provider', 'provider_id'), name='provider_message_unique_id')],
            },
        ),
        migrations.CreateModel(
            name='SmsTarget',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('phone_number', models.CharField(max_length=16, verbose_name='phone number (E.164)')),
                ('notification_list', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='sms_targets', to='notifications.notificationlist')),
            ],
            options={
                'verbose_name': 'SMS target',
                'ordering': ['pk'],
                'constraints': [models.UniqueConstraint(fields=('notification_list', 'phone_number'), name='sms_target_unique_per_list')],
            },
        ),
        migrations.CreateModel(
            name='TeamsTarget',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.URLField(max_length=2000, verbose_name='Workflows URL')),
                ('notification_list', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='teams_targets', to='notifications.notificationlist')),
            ],
            options={
                'verbose_name': 'Teams target',
                'ordering': ['pk'],
                'constraints': [models.UniqueConstraint(fields=('notification_list', 'url'), name='teams_target_unique_per_list')],
            },
        ),
        migrations.CreateModel(
            name='WebhookTarget',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.URLField(max_length=2000, verbose_name='URL')),
                ('secret', notifications.fields.EncryptedTextField(help_text='The signing secret, "whsec_" + base64. Stored encrypted; never shown.')),
                ('notification_list', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='webhook_targets', to='notifications.notificationlist')),
            ],
            options={
                'verbose_name': 'webhook target',
                'ordering': ['pk'],
                'constraints': [models.UniqueConstraint(fields=('notification_list', 'url'), name='webhook_target_unique_per_list')],
            },
        ),
        migrations.RunPython(grant_roles, migrations.RunPython.noop),
    ]
