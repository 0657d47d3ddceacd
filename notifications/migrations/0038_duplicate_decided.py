"""Duplicates decided in one statement at ingest, the decision as a function of the row
(notifications.suppression.row_duplicate_insert), PostgreSQL only.

``outbox_duplicate_decided`` takes the rows document of one new notification with a dedup_key
and returns it as it is to be stored: a duplicate (``outbox_duplicate_anchor`` of migration 0037
names its anchor) Suppressed, ``duplicate:<anchor>``, never due and never escalating; otherwise
due now (unless it says when) and, given the seconds to its list's first escalation step,
escalating from now. The ingest statement reads its rows from this function instead of the
document itself, so that it has the plain insert's shape: the statement is planned at every
execution, and planned like a plain insert (0.08 ms) instead of 0.145 ms for the decided
columns written as expressions of a join with the anchor's function; the function keeps its
own plans for the session.

The functions of migration 0037 stay: the anchor is this function's too, and a web process of
the release before (during a deployment) still calls them.
"""

from django.db import migrations

DECIDED = """
CREATE OR REPLACE FUNCTION outbox_duplicate_decided(
    p_rows jsonb, p_site text, p_list text, p_key text, p_priority integer, p_window double precision,
    p_list_lock integer, p_key_lock integer, p_escalate_after integer
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    anchor uuid;
    decided jsonb;
BEGIN
    anchor := outbox_duplicate_anchor(p_site, p_list, p_key, p_priority, p_window, p_list_lock, p_key_lock);
    IF anchor IS NOT NULL THEN
        decided := jsonb_build_object(
            'status', 'Suppressed', 'suppressed_by', 'duplicate:' || anchor, 'next_attempt_at', NULL,
            'escalation_due_at', NULL, 'escalation_step', NULL
        );
    ELSE
        decided := jsonb_build_object(
            'next_attempt_at',
            COALESCE(NULLIF(p_rows -> 0 -> 'next_attempt_at', 'null'), to_jsonb(statement_timestamp()))
        );
        IF p_escalate_after IS NOT NULL THEN
            decided := decided || jsonb_build_object(
                'escalation_due_at', statement_timestamp() + make_interval(secs => p_escalate_after),
                'escalation_step', 0
            );
        END IF;
    END IF;
    RETURN jsonb_build_array((p_rows -> 0) || decided);
END
$$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(DECIDED)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP FUNCTION IF EXISTS outbox_duplicate_decided"
        "(jsonb, text, text, text, integer, double precision, integer, integer, integer)"
    )


class Migration(migrations.Migration):
    dependencies = [("notifications", "0037_duplicate_functions")]
    operations = [migrations.RunPython(create, drop)]
