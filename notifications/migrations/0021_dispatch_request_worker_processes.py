"""The trigger's own dispatch request row and the worker heartbeat's table of worker
processes; Operators and Administrators may view the worker processes in the console
(idempotently, like 0009)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GROUPS = {
    "Operators": [("notifications", "view_workerprocess")],
    "Administrators": [("notifications", "view_workerprocess")],
}


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
        ('notifications', '0020_smtp_greeting_timeout'),
    ]

    operations = [
        migrations.CreateModel(
            name='DispatchRequest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('token', models.CharField(blank=True, max_length=32)),
                ('requested_at', models.DateTimeField(blank=True, null=True)),
                ('replace_after', models.DateTimeField(blank=True, null=True)),
                ('reissued', models.PositiveSmallIntegerField(default=0)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('pk', 1)), name='dispatch_request_singleton')],
            },
        ),
        migrations.CreateModel(
            name='WorkerProcess',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('host', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('cluster', models.CharField(max_length=100)),
                ('started_at', models.DateTimeField()),
                ('last_seen_at', models.DateTimeField()),
                ('last_action', models.CharField(blank=True, max_length=300)),
                ('busy', models.BooleanField(default=False)),
            ],
            options={
                'verbose_name': 'worker process',
                'verbose_name_plural': 'worker processes',
                'indexes': [models.Index(fields=['last_seen_at'], name='worker_process_seen_idx')],
                'constraints': [models.UniqueConstraint(fields=('host', 'pid', 'cluster'), name='worker_process_unique')],
            },
        ),
        migrations.RunPython(grant_roles, migrations.RunPython.noop),
    ]
