"""Duplicates decided in one statement at ingest (notifications.suppression.row_duplicate_insert),
PostgreSQL only: two PL/pgSQL functions the ingest statement calls.

``outbox_duplicate_anchor`` takes the site and list's suppression lock shared (the advisory
lock ``suppression_lock`` takes alone, held until the transaction ends) and the lock of the site,
list and key alone, and then, reading the database afresh (each statement of a VOLATILE function
has its own snapshot, taken after the locks are held),
returns the anchor a new notification of the key would be the duplicate of, or NULL: the rule
of ``_ListDecisions._duplicate``. ``outbox_duplicate_count``, called for each row the insert
stored (RETURNING), counts a duplicate on the anchor its ``suppressed_by`` names, likewise
reading it afresh. A PL/pgSQL function keeps its statements' plans for the session, so the
ingest statement that calls them is planned like a plain insert.

Creating functions takes no lock on the notifications table and reads none of it: safe at any
size. A later change of the rule replaces them in a migration of its own.
"""

from django.db import migrations

ANCHOR = """
CREATE OR REPLACE FUNCTION outbox_duplicate_anchor(
    p_site text, p_list text, p_key text, p_priority integer, p_window double precision,
    p_list_lock integer, p_key_lock integer
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    last record;
BEGIN
    -- The list's lock shared (a transaction deciding for the list holds it alone), the key's
    -- alone: ingests of other keys of the list go on side by side.
    PERFORM pg_advisory_xact_lock_shared(2828, p_list_lock);
    PERFORM pg_advisory_xact_lock(2829, p_key_lock);
    SELECT n.notification_id, n.created_at, n.priority, n.acknowledged_at, n.cleared_at INTO last
    FROM notifications_notification AS n
    -- dedup_key <> '' restates the dedup index's condition: the plan kept for the session
    -- (made for any p_key) can use that index only when the query implies it.
    WHERE n.source_site_id = p_site AND n.list_name = p_list AND n.dedup_key = p_key AND n.dedup_key <> ''
      AND n.suppressed_by = '' AND n.status <> 'Suppressed'
    ORDER BY n.created_at DESC
    LIMIT 1;
    IF FOUND AND last.acknowledged_at IS NULL AND last.cleared_at IS NULL
       AND last.created_at > statement_timestamp() - make_interval(secs => p_window)
       AND p_priority <= last.priority THEN
        RETURN last.notification_id;
    END IF;
    RETURN NULL;
END
$$
"""

COUNT = """
CREATE OR REPLACE FUNCTION outbox_duplicate_count(p_suppressed_by text) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    anchor uuid;
BEGIN
    IF left(p_suppressed_by, 10) <> 'duplicate:' THEN
        RETURN NULL;
    END IF;
    anchor := CAST(substr(p_suppressed_by, 11) AS uuid);
    UPDATE notifications_notification
    SET occurrences = occurrences + 1, last_occurrence_at = statement_timestamp()
    WHERE notification_id = anchor;
    RETURN anchor;
END
$$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(ANCHOR)
    schema_editor.execute(COUNT)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP FUNCTION IF EXISTS outbox_duplicate_anchor(text, text, text, integer, double precision, integer, integer)"
    )
    schema_editor.execute("DROP FUNCTION IF EXISTS outbox_duplicate_count(text)")


class Migration(migrations.Migration):
    dependencies = [("notifications", "0036_partial_delivery_counts")]
    operations = [migrations.RunPython(create, drop)]
