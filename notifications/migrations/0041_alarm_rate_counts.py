"""Counts of notifications by the 10-minute interval they were created in and their list
(notifications.counts): the flood report's alarms per list per 10 minutes, which read every row
of the last 24 hours before. On PostgreSQL the statement-level triggers that keep them, filled
from the existing rows while writers of notifications are held off (one pass over the table:
measured in docs/suppression.md, "Schema and rolling deploys"); SQLite gets the empty table
only, and its report counts the rows.
"""

from django.db import migrations, models

from notifications.counts import alarm_counts_install, alarm_counts_uninstall


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        alarm_counts_install(schema_editor)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        alarm_counts_uninstall(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0040_suppressed_by_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="AlarmRateCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("bucket", models.DateTimeField()),
                ("list_name", models.CharField(max_length=200)),
                ("n", models.BigIntegerField()),
                ("folded", models.BooleanField(default=False)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["bucket", "list_name"], name="alarm_count_key_idx"),
                    models.Index(condition=models.Q(("folded", False)), fields=["id"], name="alarm_count_unfolded_idx"),
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
