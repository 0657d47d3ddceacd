"""The console's search index gains a second column: the UTC day each row was created.

PostgreSQL only (SQLite has no such index). One GIN index over the searched text's trigrams
(pg_trgm) and ``created_day`` (btree_gin, a trusted contrib extension like pg_trgm) replaces the
trigram index of 0012_console_outbox; it answers every search as before, and a search limited
to recent days reads only the matches of those days from the table. The console looks for a
page of newest matches among the last days first (docs/console.md).

Building it reads the table once: about 15 s per million rows. Raw SQL like 0012, so the model
state stays as it is.
"""

from django.db import migrations

from notifications.db import SEARCH_INDEX_COLUMNS_SQL, SEARCH_TEXT_SQL

TABLE = "notifications_notification"
TEXT_ONLY = f"({SEARCH_TEXT_SQL} gin_trgm_ops)"


def by_day(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    run = schema_editor.execute
    run("CREATE EXTENSION IF NOT EXISTS btree_gin")
    run(f"CREATE INDEX IF NOT EXISTS notif_search_day_trgm_idx ON {TABLE} USING gin {SEARCH_INDEX_COLUMNS_SQL}")
    run("DROP INDEX IF EXISTS notif_search_trgm_idx")


def text_only(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    run = schema_editor.execute
    run(f"CREATE INDEX IF NOT EXISTS notif_search_trgm_idx ON {TABLE} USING gin {TEXT_ONLY}")
    run("DROP INDEX IF EXISTS notif_search_day_trgm_idx")


class Migration(migrations.Migration):
    dependencies = [("notifications", "0015_due_index_nulls_first")]
    operations = [migrations.RunPython(by_day, text_only)]
