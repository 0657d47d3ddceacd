"""Indexes of the console's outbox page (docs/console.md).

- Stuck age counts from the last enqueue or operator Retry/Requeue (``requeued_at``), so the
  KPI index of open rows also holds ``requeued_at`` (the KPI query stays index-only).
- The list filter offers the list names Parked rows use (a partial index of them), and filters
  by list newest first from an index on (list_name, created_at).
- The redrive view counts the rows of one Retry by their ``requeued_at``.
- PostgreSQL: the parked-by-cause view groups Parked rows by the start of their last error,
  from partial indexes of Parked rows alone (an index-only scan for errors up to 2,000 bytes); the search looks in subject, list name, last error,
  source instance and script through one trigram index on those columns joined.

Raw SQL like 0002 and 0005, so the model state stays as it is.
"""

from django.db import migrations

from notifications.db import CAUSE_INDEXED_BYTES, SEARCH_TEXT_SQL

TABLE = "notifications_notification"

# 0007's KPI index of open rows, and the same with requeued_at (the stuck figure).
OPEN_OLD = "(source_site_id, status, created_at, expired_at) WHERE status IN ('Pending', 'Retrying', 'Parked')"
OPEN_NEW = (
    "(source_site_id, status, created_at, expired_at, requeued_at) WHERE status IN ('Pending', 'Retrying', 'Parked')"
)


def _open_index(schema_editor, definition):
    schema_editor.execute("DROP INDEX IF EXISTS notif_kpi_open_idx")
    schema_editor.execute(f"CREATE INDEX notif_kpi_open_idx ON {TABLE} {definition}")


def create(apps, schema_editor):
    run = schema_editor.execute
    _open_index(schema_editor, OPEN_NEW)
    run(f"CREATE INDEX IF NOT EXISTS notif_requeued_idx ON {TABLE} (requeued_at, status) WHERE requeued_at IS NOT NULL")
    run(f"CREATE INDEX IF NOT EXISTS notif_parked_list_idx ON {TABLE} (list_name) WHERE status = 'Parked'")
    run(f"CREATE INDEX IF NOT EXISTS notif_list_created_idx ON {TABLE} (list_name, created_at)")
    if schema_editor.connection.vendor == "postgresql":
        # The last error itself, not left(last_error, …): PostgreSQL answers only plain columns
        # from an index alone. Btree entries are bounded, hence the length condition; the rare
        # longer errors have their own small index.
        run(
            f"CREATE INDEX IF NOT EXISTS notif_parked_cause_idx ON {TABLE} "
            "(last_error, list_name, source_site_id, created_at) "
            f"WHERE status = 'Parked' AND octet_length(last_error) <= {CAUSE_INDEXED_BYTES}"
        )
        run(
            f"CREATE INDEX IF NOT EXISTS notif_parked_long_error_idx ON {TABLE} (created_at) "
            f"WHERE status = 'Parked' AND octet_length(last_error) > {CAUSE_INDEXED_BYTES}"
        )
        run("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        run(f"CREATE INDEX IF NOT EXISTS notif_search_trgm_idx ON {TABLE} USING gin ({SEARCH_TEXT_SQL} gin_trgm_ops)")


def drop(apps, schema_editor):
    run = schema_editor.execute
    _open_index(schema_editor, OPEN_OLD)
    for name in (
        "notif_requeued_idx",
        "notif_parked_list_idx",
        "notif_list_created_idx",
        "notif_parked_cause_idx",
        "notif_search_trgm_idx",
    ):
        run(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("notifications", "0011_console_admin")]
    operations = [migrations.RunPython(create, drop)]
