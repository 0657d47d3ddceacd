"""Counts of notifications kept by the database (notifications.counts, docs/architecture.md).

The table of counts by (bucket, status, site, channel, expired). On PostgreSQL: the
statement-level triggers that keep it, filled from the existing rows while writers are held
off (on a table of 10,000,000 rows this takes a minute or so), and an index of the Pending and
Retrying rows by the time they were queued (the stuck figure's last minute). SQLite gets the
empty table only: there the KPIs and trends count the rows themselves.
"""

from django.db import migrations, models

from notifications.counts import counts_install, counts_uninstall

QUEUED_INDEX = (
    "CREATE INDEX IF NOT EXISTS notif_queued_since_idx ON notifications_notification "
    "(greatest(created_at, requeued_at)) INCLUDE (source_site_id) WHERE status IN ('Pending', 'Retrying')"
)


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(QUEUED_INDEX)
        counts_install(schema_editor)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        counts_uninstall(schema_editor)
        schema_editor.execute("DROP INDEX IF EXISTS notif_queued_since_idx")


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0012_console_outbox"),
    ]

    operations = [
        migrations.CreateModel(
            name="NotificationCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("bucket", models.DateTimeField(null=True)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("Pending", "Pending"),
                            ("Retrying", "Retrying"),
                            ("Delivered", "Delivered"),
                            ("Parked", "Parked"),
                            ("Discarded", "Discarded"),
                        ],
                        max_length=16,
                    ),
                ),
                ("source_site_id", models.CharField(max_length=64)),
                ("type", models.CharField(max_length=32)),
                ("expired", models.BooleanField()),
                ("n", models.BigIntegerField()),
                ("folded", models.BooleanField(default=False)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["status", "bucket"], name="notif_count_status_idx"),
                    models.Index(
                        fields=["status", "source_site_id", "type", "expired", "bucket"], name="notif_count_key_idx"
                    ),
                    models.Index(
                        condition=models.Q(("bucket__isnull", True)),
                        fields=["status", "source_site_id", "type", "expired"],
                        name="notif_count_total_idx",
                    ),
                    models.Index(condition=models.Q(("folded", False)), fields=["id"], name="notif_count_unfolded_idx"),
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
