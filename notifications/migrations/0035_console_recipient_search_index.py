"""The console's search by recipient ("to:p.dubois@example.com"): a GIN index of each row's
targets (jsonb_path_ops), so that "every notification sent to this address" reads only those
rows. PostgreSQL only (SQLite searches the targets' text without an index). Built CONCURRENTLY:
no lock on the table while it reads it once. Raw SQL like 0016, so the model state stays as it
is."""

from django.db import migrations

TABLE = "notifications_notification"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS notif_targets_gin_idx ON {TABLE} "
        "USING gin (resolved_targets jsonb_path_ops)"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS notif_targets_gin_idx")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("notifications", "0034_console_incident_notes")]
    operations = [migrations.RunPython(create, drop)]
