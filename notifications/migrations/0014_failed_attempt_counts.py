"""Counts of failed delivery attempts by hour, site and channel (notifications.counts): the
dashboard's failed trend. On PostgreSQL the statement-level triggers on the attempts table
that keep them, filled from the existing attempts while writers of attempts are held off;
SQLite gets the empty table only.
"""

from django.db import migrations, models

from notifications.counts import failed_attempts_install, failed_attempts_uninstall


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        failed_attempts_install(schema_editor, by_class=False)  # 0017 adds the class


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        failed_attempts_uninstall(schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0013_notification_counts'),
    ]

    operations = [
        migrations.CreateModel(
            name='FailedAttemptCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('bucket', models.DateTimeField()),
                ('source_site_id', models.CharField(max_length=64)),
                ('type', models.CharField(max_length=32)),
                ('n', models.BigIntegerField()),
                ('folded', models.BooleanField(default=False)),
            ],
            options={
                'indexes': [models.Index(fields=['bucket', 'source_site_id', 'type'], name='attempt_count_key_idx'), models.Index(condition=models.Q(('folded', False)), fields=['id'], name='attempt_count_unfolded_idx')],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
