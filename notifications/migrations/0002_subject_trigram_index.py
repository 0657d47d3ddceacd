"""Trigram index on subject so keyword search stays fast on millions of rows (PostgreSQL).

SQLite has no trigram support; there the search is a plain LIKE scan (documented in docs/architecture.md).
"""

from django.db import migrations


def create_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS notif_subject_trgm_idx "
        "ON notifications_notification USING gin (subject gin_trgm_ops)"
    )


def drop_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP INDEX IF EXISTS notif_subject_trgm_idx")


class Migration(migrations.Migration):
    dependencies = [("notifications", "0001_initial")]
    operations = [migrations.RunPython(create_trigram_index, drop_trigram_index)]
