"""Notification counts kept by the database (PostgreSQL): the KPIs and the dashboard's trends
read them instead of counting millions of rows.

Triggers on the notification table (installed by migration 0013_notification_counts) add, for
every statement that inserts, changes or deletes notifications, one row of changes per key to
``notifications_notificationcount`` (model ``NotificationCount``), in the statement's own
transaction. A key is (bucket, status, source site, channel, expired, partial: Delivered and
refused for good by some target, since migration 0036). Every notification counts in two keys:

- its totals key, bucket NULL: the KPIs' queue depth, parked and expired figures per site;
- its bucketed key (none for Discarded rows): for Pending and Retrying the minute the row was
  queued (its last operator Retry or Requeue, else its creation: ``greatest(created_at,
  requeued_at)``), so the stuck figure is a sum plus the rows of one minute; for Delivered the
  hour it was delivered; for Parked the hour it parked (its age expiry, else its last attempt,
  else its creation), as the trends count them.

The triggers are statement-level (one INSERT … SELECT … GROUP BY over the statement's changed
rows), so a batch of 500 ingested rows or delivered results adds a handful of rows, and an
UPDATE that changes no key (a claim, a lease renewal, an attempt's bookkeeping) adds none.
:func:`counts_fold` sums each key's rows into one (the dispatcher calls it after every pass,
the purge after its batches, and the readers before reading), so the table stays about one row
per key. The sum of ``n`` over a key always equals the live count of its rows: a reader sees
the changes of exactly the transactions its snapshot sees, and a fold replaces rows by their
sum in one statement.

Failed delivery attempts are counted the same way in ``notifications_failedattemptcount``
(model ``FailedAttemptCount``, migration 0014): by the hour they started, their notification's
site and channel, their failure class (0017) and whether they failed while some targets had
the notification (``partial``, 0036: a refusal inside a partial delivery, which the failed
trend leaves out), kept by triggers on the attempts table, for the dashboard's failed trend and
the KPIs' failures by class. An attempt is counted through its notification, so attempts are
deleted before their notification (as the purge and Django's cascade do).

The flood report's alarms per list per 10 minutes are counted the same way in
``notifications_alarmratecount`` (model ``AlarmRateCount``, migration 0041): every notification
once, by the 10-minute interval it was created in and its list, whatever its status.

SQLite has no such triggers: there :func:`counts_kept` is False and the callers count the rows.
"""

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction

TABLE = "notifications_notificationcount"
NOTIFICATIONS = "notifications_notification"


# The key rows of the notification rows in ``source``: every row counts once in its totals key
# (bucket NULL) and, unless Discarded, once in its bucketed key. ``partial`` (0036 added it): a
# Delivered row some target refused for good counts in keys of its own.
def _keys_sql(*, partial: bool) -> tuple[str, str]:
    """The key rows' SELECT (``{source}`` to fill in) and the key's columns, with the
    ``partial`` column or as they were before 0036."""
    partial_select = ", r.status = 'Delivered' AND coalesce(r.targets_refused, 0) > 0 AS partial" if partial else ""
    select = f"""
    SELECT v.bucket, r.status, r.source_site_id, r.type, r.expired_at IS NOT NULL AS expired{partial_select}
    FROM {{source}} AS r CROSS JOIN LATERAL (VALUES (true, NULL::timestamptz), (false,
        CASE r.status
            WHEN 'Delivered' THEN date_trunc('hour', coalesce(r.delivered_at, r.created_at), 'UTC')
            WHEN 'Parked' THEN date_trunc('hour', coalesce(r.expired_at, r.last_attempt_at, r.created_at), 'UTC')
            WHEN 'Pending' THEN date_trunc('minute', greatest(r.created_at, r.requeued_at), 'UTC')
            WHEN 'Retrying' THEN date_trunc('minute', greatest(r.created_at, r.requeued_at), 'UTC')
        END)) AS v(total, bucket)
    WHERE v.total OR v.bucket IS NOT NULL"""
    return select, "bucket, status, source_site_id, type, expired" + (", partial" if partial else "")


KEYS_SQL, KEY_COLUMNS = _keys_sql(partial=True)


def _count_trigger_function_sql(function: str, table: str, key_columns: str, rows_sql: str) -> str:
    """A trigger function adding to ``table`` the per-key changes of a statement: the key rows
    ``rows_sql`` finds in its transition tables (``{source}``: new_rows, old_rows) counted up
    for inserted rows, down for deleted ones, both for updated ones (keys left unchanged add
    nothing); a TRUNCATE empties ``table``."""
    added, removed = rows_sql.format(source="new_rows"), rows_sql.format(source="old_rows")
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {table} ({key_columns}, n, folded)
        SELECT {key_columns}, count(*), false FROM ({added}) AS k
        GROUP BY {key_columns};
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {table} ({key_columns}, n, folded)
        SELECT {key_columns}, -count(*), false FROM ({removed}) AS k
        GROUP BY {key_columns};
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {table} ({key_columns}, n, folded)
        SELECT {key_columns}, sum(d), false FROM (
            SELECT *, 1 AS d FROM ({added}) AS added
            UNION ALL
            SELECT *, -1 AS d FROM ({removed}) AS removed
        ) AS k
        GROUP BY {key_columns} HAVING sum(d) <> 0;
    ELSE  -- TRUNCATE
        DELETE FROM {table};
    END IF;
    RETURN NULL;
END
$$
"""


def _count_triggers_sql(prefix: str, table: str, function: str) -> tuple[tuple[str, ...], list[str]]:
    """The names and the statements of the four statement-level triggers that run
    ``function`` on ``table`` (named ``<prefix>_insert``, ``_update``, ``_delete``, ``_truncate``)."""
    transitions = {
        "insert": "REFERENCING NEW TABLE AS new_rows ",
        "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows ",
        "delete": "REFERENCING OLD TABLE AS old_rows ",
        "truncate": "",
    }
    names = tuple(f"{prefix}_{event}" for event in transitions)
    statements = [
        f"CREATE TRIGGER {prefix}_{event} AFTER {event.upper()} ON {table} {referencing}"
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        for event, referencing in transitions.items()
    ]
    return names, statements


TRIGGER_FUNCTION = "notifications_count_changes"
TRIGGER_FUNCTION_SQL = _count_trigger_function_sql(TRIGGER_FUNCTION, TABLE, KEY_COLUMNS, KEYS_SQL)
TRIGGER_NAMES, TRIGGERS_SQL = _count_triggers_sql("notif_count", NOTIFICATIONS, TRIGGER_FUNCTION)


def _rebuild_sql(keys_sql: str, key_columns: str) -> str:
    """Recounts every key from the notifications themselves (installation, and after a bulk
    load made with the triggers disabled)."""
    return f"""
INSERT INTO {TABLE} ({key_columns}, n, folded)
SELECT {key_columns}, count(*), true FROM ({keys_sql.format(source=NOTIFICATIONS)}) AS k
GROUP BY {key_columns}
"""


REBUILD_SQL = _rebuild_sql(KEYS_SQL, KEY_COLUMNS)

_PARTIAL_ROWS = "status = 'Delivered' AND targets_refused > 0"
# Moves the Delivered rows some target refused for good from the keys they counted in before
# 0036 (partial false) to their own (partial true): two changes per key, unfolded. Reads only
# those rows, through their partial index (notif_partial_idx, 0008), never the whole table.
PARTIAL_MOVE_SQL = f"""
INSERT INTO {TABLE} ({KEY_COLUMNS}, n, folded)
SELECT bucket, status, source_site_id, type, expired, moved.partial, moved.sign * count(*), false
FROM ({_keys_sql(partial=False)[0].format(source=f"(SELECT * FROM {NOTIFICATIONS} WHERE {_PARTIAL_ROWS})")})
    AS k CROSS JOIN (VALUES (false, -1), (true, 1)) AS moved(partial, sign)
GROUP BY bucket, status, source_site_id, type, expired, moved.partial, moved.sign
"""

# At most this many unfolded rows are read per fold (every row of their keys is folded).
FOLD_ROWS_MAX = 50_000
# Any constant shared by every process: only one fold runs at a time (the others skip).
FOLD_LOCK = 0x6F7574626F78  # "outbox"

# Sums the rows of the keys of up to %(rows)s unfolded rows into one row per key, in one
# statement, unless another fold holds the lock: the bucketed keys and the totals are each
# matched through their own index.
_KEY_MATCH = (
    "c.status = k.status AND c.source_site_id = k.source_site_id AND c.type = k.type AND c.expired = k.expired"
    " AND c.partial = k.partial"
)
FOLD_SQL = f"""
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock)s) AS held
), changed AS (
    SELECT {KEY_COLUMNS} FROM {TABLE} WHERE NOT folded AND (SELECT held FROM lock) ORDER BY id LIMIT %(rows)s
), bucketed AS (
    DELETE FROM {TABLE} AS c USING (SELECT DISTINCT * FROM changed WHERE bucket IS NOT NULL) AS k
    WHERE {_KEY_MATCH} AND c.bucket = k.bucket
    RETURNING c.bucket, c.status, c.source_site_id, c.type, c.expired, c.partial, c.n
), totals AS (
    DELETE FROM {TABLE} AS c USING (SELECT DISTINCT * FROM changed WHERE bucket IS NULL) AS k
    WHERE {_KEY_MATCH} AND c.bucket IS NULL
    RETURNING c.bucket, c.status, c.source_site_id, c.type, c.expired, c.partial, c.n
)
INSERT INTO {TABLE} ({KEY_COLUMNS}, n, folded)
SELECT {KEY_COLUMNS}, sum(n), true FROM (SELECT * FROM bucketed UNION ALL SELECT * FROM totals) AS gone
GROUP BY {KEY_COLUMNS} HAVING sum(n) <> 0
"""


def _fold_sql(table: str, key: str, *, lock_offset: int) -> str:
    """The fold of a counts table whose keys (``key``, its columns) are never NULL: the rows of
    the keys of up to %(rows)s unfolded rows summed into one row per key, in one statement,
    unless another fold of the table holds its lock (``FOLD_LOCK`` + ``lock_offset``)."""
    columns = key.split(", ")
    return f"""
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock)s + {lock_offset}) AS held
), keys AS (
    SELECT DISTINCT {key} FROM (
        SELECT {key} FROM {table} WHERE NOT folded AND (SELECT held FROM lock) ORDER BY id LIMIT %(rows)s
    ) AS changed
), gone AS (
    DELETE FROM {table} AS c USING keys AS k
    WHERE {" AND ".join(f"c.{column} = k.{column}" for column in columns)}
    RETURNING {", ".join(f"c.{column}" for column in columns)}, c.n
)
INSERT INTO {table} ({key}, n, folded)
SELECT {key}, sum(n), true FROM gone GROUP BY {key} HAVING sum(n) <> 0
"""


# --- failed delivery attempts, by hour, site, channel and failure class -------------------------

ATTEMPT_TABLE = "notifications_failedattemptcount"
ATTEMPTS = "notifications_deliveryattempt"
ATTEMPT_FUNCTION = "notifications_count_failed_attempts"


def _failed_attempt_sql(*, by_class: bool, partial: bool = False) -> tuple[str, str, str]:
    """The trigger function, the recount and the fold of the failed-attempt counts, keyed by
    (hour, site, channel) and, ``by_class``, the failure class (migration 0017 added it; 0014
    installs the counts as they were then) and, ``partial``, whether the attempt failed while
    some targets had the notification (0036)."""
    key = "bucket, source_site_id, type" + (", failure_class" if by_class else "") + (", partial" if partial else "")
    failed = f"""
    SELECT date_trunc('hour', a.started_at, 'UTC') AS bucket, n.source_site_id, n.type{", a.failure_class" if by_class else ""}{", a.targets_delivered > 0 AS partial" if partial else ""}
    FROM {{source}} AS a JOIN {NOTIFICATIONS} AS n ON n.notification_id = a.notification_id
    WHERE a.failure_class <> ''"""
    rebuild = f"""
INSERT INTO {ATTEMPT_TABLE} ({key}, n, folded)
SELECT {key}, count(*), true FROM ({failed.format(source=ATTEMPTS)}) AS k GROUP BY {key}
"""
    fold = _fold_sql(ATTEMPT_TABLE, key, lock_offset=1)
    return _count_trigger_function_sql(ATTEMPT_FUNCTION, ATTEMPT_TABLE, key, failed), rebuild, fold


ATTEMPT_TRIGGER_FUNCTION_SQL, ATTEMPT_REBUILD_SQL, ATTEMPT_FOLD_SQL = _failed_attempt_sql(by_class=True, partial=True)
ATTEMPT_TRIGGER_NAMES, ATTEMPT_TRIGGERS_SQL = _count_triggers_sql("attempt_count", ATTEMPTS, ATTEMPT_FUNCTION)


def failed_attempts_install(schema_editor: Any, *, by_class: bool = True) -> None:
    """Create (or replace) the attempts' triggers and count every existing failed attempt, with
    writers of attempts held off meanwhile; ``by_class=False``: the counts as migration 0014
    made them, without the failure class. (The counts as 0017 left them; 0036 adds the
    ``partial`` key with :func:`counts_partial_install`.)"""
    function_sql, rebuild_sql, _fold = _failed_attempt_sql(by_class=by_class)
    _install(
        schema_editor,
        table=ATTEMPTS,
        function_sql=function_sql,
        trigger_names=ATTEMPT_TRIGGER_NAMES,
        triggers_sql=ATTEMPT_TRIGGERS_SQL,
        counts_table=ATTEMPT_TABLE,
        rebuild_sql=rebuild_sql,
    )


def failed_attempts_uninstall(schema_editor: Any) -> None:
    _uninstall(schema_editor, ATTEMPTS, ATTEMPT_TRIGGER_NAMES, ATTEMPT_FUNCTION)


def failed_hourly_counts(start: datetime, *, partial: bool | None = None) -> list[tuple[int, str, str, int]]:
    """``(hour, site, channel, count)`` of the failed attempts started from ``start`` (a whole
    hour) on, the hour counted from ``start`` (PostgreSQL); ``partial`` True or False: only the
    attempts that failed while some targets had the notification, or only the others."""
    only = "" if partial is None else " AND partial = %s"
    sql = f"""
        SELECT (extract(epoch FROM bucket - %s::timestamptz) / 3600)::int, source_site_id, type, sum(n)::bigint
        FROM {ATTEMPT_TABLE} WHERE bucket >= %s{only}
        GROUP BY bucket, source_site_id, type HAVING sum(n) <> 0
    """
    params: list[Any] = [start, start] + ([] if partial is None else [partial])
    return [(hour, site, channel, n) for hour, site, channel, n in _rows(sql, params)]


def failures_since(since: datetime) -> dict[str, int]:
    """Failed attempts started at or after ``since``, per failure class (PostgreSQL; only the
    classes with any): the whole hours from the kept counts, and from the attempts themselves
    (their index of start and class) only the shorter part of the hour ``since`` falls in —
    the attempts from ``since`` to the next hour added to the counts of the hours after it,
    or those from the start of the hour to ``since`` taken from the counts from that hour on.
    So an hour's interval reads at most half an hour of attempts (160,000 failed attempts in
    the last hour: 47 ms counted from the attempts alone, 3 ms so)."""
    hour = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if since - hour <= hour + timedelta(hours=1) - since:
        buckets_from, edge, sign = hour, (hour, since), -1
    else:
        buckets_from, edge, sign = hour + timedelta(hours=1), (since, hour + timedelta(hours=1)), 1
    sql = f"""
        SELECT failure_class, sum(n)::bigint FROM (
            SELECT failure_class, n FROM {ATTEMPT_TABLE} WHERE bucket >= %s
            UNION ALL
            SELECT failure_class, %s * count(*) FROM {ATTEMPTS}
            WHERE failure_class <> '' AND started_at >= %s AND started_at < %s GROUP BY failure_class
        ) AS f
        GROUP BY failure_class HAVING sum(n) <> 0
    """
    return {str(failure_class): int(n) for failure_class, n in _rows(sql, [buckets_from, sign, *edge])}


# --- alarms per list per 10 minutes (the flood report) ----------------------------------------

ALARM_TABLE = "notifications_alarmratecount"
ALARM_FUNCTION = "notifications_count_alarms"
ALARM_KEY = "bucket, list_name"
# Every notification counts once, whatever its status (suppressed ones were raised too), in the
# 10-minute interval of its creation on central, intervals starting at the epoch (the flood
# report's, notifications.suppression). Neither column changes once a row exists; the update
# trigger is there so that the counts stay exact whatever a statement changes.
ALARM_ROWS_SQL = (
    "SELECT date_bin('10 minutes', r.created_at, timestamptz 'epoch') AS bucket, r.list_name FROM {source} AS r"
)
ALARM_FUNCTION_SQL = _count_trigger_function_sql(ALARM_FUNCTION, ALARM_TABLE, ALARM_KEY, ALARM_ROWS_SQL)
ALARM_TRIGGER_NAMES, ALARM_TRIGGERS_SQL = _count_triggers_sql("alarm_count", NOTIFICATIONS, ALARM_FUNCTION)
ALARM_REBUILD_SQL = f"""
INSERT INTO {ALARM_TABLE} ({ALARM_KEY}, n, folded)
SELECT {ALARM_KEY}, count(*), true FROM ({ALARM_ROWS_SQL.format(source=NOTIFICATIONS)}) AS k
GROUP BY {ALARM_KEY}
"""
ALARM_FOLD_SQL = _fold_sql(ALARM_TABLE, ALARM_KEY, lock_offset=2)


def alarm_counts_install(schema_editor: Any) -> None:
    """Create the alarm counts' triggers and count every existing notification, with writers
    held off meanwhile (migration 0041)."""
    _install(
        schema_editor,
        table=NOTIFICATIONS,
        function_sql=ALARM_FUNCTION_SQL,
        trigger_names=ALARM_TRIGGER_NAMES,
        triggers_sql=ALARM_TRIGGERS_SQL,
        counts_table=ALARM_TABLE,
        rebuild_sql=ALARM_REBUILD_SQL,
    )


def alarm_counts_uninstall(schema_editor: Any) -> None:
    _uninstall(schema_editor, NOTIFICATIONS, ALARM_TRIGGER_NAMES, ALARM_FUNCTION)


def alarm_counts(start: datetime) -> list[tuple[str, datetime, int]]:
    """``(list name, 10-minute interval, notifications created in it)`` from the interval
    ``start`` (an interval's start) on, the intervals with any (PostgreSQL)."""
    sql = f"""
        SELECT list_name, bucket, sum(n)::bigint FROM {ALARM_TABLE} WHERE bucket >= %s
        GROUP BY list_name, bucket HAVING sum(n) <> 0
    """
    return [(name, bucket, int(n)) for name, bucket, n in _rows(sql, [start])]


# --- both -------------------------------------------------------------------------------------


def counts_kept() -> bool:
    """Whether the database keeps the counts (PostgreSQL, with the triggers installed)."""
    return connection.vendor == "postgresql"


def counts_install(schema_editor: Any) -> None:
    """Create the triggers and count every existing notification, with writers held off
    (a SHARE ROW EXCLUSIVE lock, readers go on) so that no change falls between the two. The
    counts as migration 0013 made them, without the ``partial`` key (0036:
    :func:`counts_partial_install`)."""
    keys_sql, key_columns = _keys_sql(partial=False)
    _install(
        schema_editor,
        table=NOTIFICATIONS,
        function_sql=_count_trigger_function_sql(TRIGGER_FUNCTION, TABLE, key_columns, keys_sql),
        trigger_names=TRIGGER_NAMES,
        triggers_sql=TRIGGERS_SQL,
        counts_table=TABLE,
        rebuild_sql=_rebuild_sql(keys_sql, key_columns),
    )


def counts_uninstall(schema_editor: Any) -> None:
    _uninstall(schema_editor, NOTIFICATIONS, TRIGGER_NAMES, TRIGGER_FUNCTION)


def counts_partial_install(schema_editor: Any) -> None:
    """Key the counts by ``partial`` too (migration 0036), without recounting either table:
    the triggers' functions are replaced (the triggers stay), and the Delivered rows some
    target refused for good are moved to their own keys, read through their partial index
    while writers of notifications are held off. Every failed attempt recorded before stays
    counted as not partial (``targets_delivered`` is 0 on every attempt before 0036), so the
    attempts' counts are exact as they are."""
    run = schema_editor.execute
    run(f"LOCK TABLE {NOTIFICATIONS} IN SHARE ROW EXCLUSIVE MODE")
    run(TRIGGER_FUNCTION_SQL)
    run(ATTEMPT_TRIGGER_FUNCTION_SQL)
    run(PARTIAL_MOVE_SQL)


def counts_partial_uninstall(schema_editor: Any) -> None:
    """Undo :func:`counts_partial_install`: the functions as 0017 left them, and every
    ``partial`` key's rows back in its key without it (the column goes next)."""
    keys_sql, key_columns = _keys_sql(partial=False)
    run = schema_editor.execute
    run(f"LOCK TABLE {NOTIFICATIONS} IN SHARE ROW EXCLUSIVE MODE")
    run(_count_trigger_function_sql(TRIGGER_FUNCTION, TABLE, key_columns, keys_sql))
    run(_failed_attempt_sql(by_class=True)[0])
    run(f"UPDATE {TABLE} SET partial = false, folded = false WHERE partial")
    run(f"UPDATE {ATTEMPT_TABLE} SET partial = false, folded = false WHERE partial")


def _install(
    schema_editor: Any,
    *,
    table: str,
    function_sql: str,
    trigger_names: Sequence[str],
    triggers_sql: Sequence[str],
    counts_table: str,
    rebuild_sql: str,
) -> None:
    """(Re)create ``table``'s count triggers and recount ``counts_table`` from its rows, with
    the writers of ``table`` held off meanwhile (readers go on)."""
    run = schema_editor.execute
    run(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    run(function_sql)
    for name in trigger_names:
        run(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    for sql in triggers_sql:
        run(sql)
    run(f"DELETE FROM {counts_table}")
    run(rebuild_sql)
    run(f"ANALYZE {counts_table}")


def _uninstall(schema_editor: Any, table: str, trigger_names: Sequence[str], function: str) -> None:
    for name in trigger_names:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {function}()")


def counts_rebuild() -> None:
    """Recount every key of the notification counts and the alarm counts from the notifications
    (after a bulk load with the triggers off), holding writers off meanwhile. PostgreSQL only."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {NOTIFICATIONS} IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(f"DELETE FROM {TABLE}")
        cursor.execute(REBUILD_SQL)
        cursor.execute(f"DELETE FROM {ALARM_TABLE}")
        cursor.execute(ALARM_REBUILD_SQL)


def counts_fold(*, rows_max: int = FOLD_ROWS_MAX) -> int:
    """Sum the rows of each key that has changes not folded yet into one row (the keys of up
    to ``rows_max`` changes), in the notification, failed-attempt and alarm counts;
    returns the number of rows written, 0 where another fold is running or the counts are not
    kept. Never changes any key's sum: the rows a fold deletes
    are exactly the rows whose sums it inserts, in one statement."""
    if not counts_kept():
        return 0
    written = 0
    with connection.cursor() as cursor:
        for sql in (FOLD_SQL, ATTEMPT_FOLD_SQL, ALARM_FOLD_SQL):
            cursor.execute(sql, {"lock": FOLD_LOCK, "rows": rows_max})
            written += max(cursor.rowcount, 0)
    return written


def open_counts() -> dict[str, dict[str, int]]:
    """``{site: {"queue_depth", "parked", "expired"}}`` for the sites with any (PostgreSQL)."""
    sql = f"""
        SELECT source_site_id, status, expired, sum(n)::bigint FROM {TABLE}
        WHERE bucket IS NULL AND status IN ('Pending', 'Retrying', 'Parked')
        GROUP BY 1, 2, 3 HAVING sum(n) <> 0
    """
    counts: dict[str, dict[str, int]] = {}
    for site, status, expired, n in _rows(sql, []):
        figures = counts.setdefault(site, {"queue_depth": 0, "parked": 0, "expired": 0})
        if status == "Parked":
            figures["parked"] += n
            if expired:
                figures["expired"] += n
        else:
            figures["queue_depth"] += n
    return counts


def queued_by_channel() -> dict[str, int]:
    """``{channel: Pending and Retrying rows}`` for the channels with any (PostgreSQL)."""
    sql = f"""
        SELECT type, sum(n)::bigint FROM {TABLE}
        WHERE bucket IS NULL AND status IN ('Pending', 'Retrying')
        GROUP BY 1 HAVING sum(n) <> 0
    """
    return dict(_rows(sql, []))


def stuck_counts(before: datetime) -> dict[str, int]:
    """Pending and Retrying rows queued (created, or last retried or requeued) before
    ``before``, per site: the sum of the whole minutes before it, plus the rows of its own
    minute counted from the queued-since index (PostgreSQL)."""
    sql = f"""
        SELECT source_site_id, sum(n)::bigint FROM (
            SELECT source_site_id, n FROM {TABLE}
            WHERE status IN ('Pending', 'Retrying') AND bucket < date_trunc('minute', %s::timestamptz, 'UTC')
            UNION ALL
            SELECT source_site_id, 1 FROM {NOTIFICATIONS}
            WHERE status IN ('Pending', 'Retrying')
              AND greatest(created_at, requeued_at) >= date_trunc('minute', %s::timestamptz, 'UTC')
              AND greatest(created_at, requeued_at) < %s
        ) AS parts
        GROUP BY 1 HAVING sum(n) <> 0
    """
    return {site: int(n) for site, n in _rows(sql, [before, before, before])}


def oldest_queued(sites: Iterable[str]) -> dict[str, datetime]:
    """The creation time of each site's oldest Pending or Retrying row, one index probe per
    site and status (PostgreSQL)."""
    sites = sorted(sites)
    if not sites:
        return {}
    sql = f"""
        SELECT s.site, least(
            (SELECT created_at FROM {NOTIFICATIONS} n WHERE n.source_site_id = s.site AND n.status = 'Pending'
             ORDER BY created_at LIMIT 1),
            (SELECT created_at FROM {NOTIFICATIONS} n WHERE n.source_site_id = s.site AND n.status = 'Retrying'
             ORDER BY created_at LIMIT 1))
        FROM unnest(%s::text[]) AS s(site)
    """
    return {site: then for site, then in _rows(sql, [sites]) if then is not None}


def hourly_counts(status: str, start: datetime, *, partial: bool | None = None) -> list[tuple[int, str, str, int]]:
    """``(hour, site, channel, count)`` of the Delivered or Parked rows from ``start`` (a whole
    hour) on, by the hour of their bucket counted from ``start`` (0 is ``start``'s hour;
    PostgreSQL); ``partial`` True: only the rows delivered partially (some target refused
    them for good), False: only the others."""
    only = "" if partial is None else " AND partial = %s"
    sql = f"""
        SELECT (extract(epoch FROM bucket - %s::timestamptz) / 3600)::int, source_site_id, type, sum(n)::bigint
        FROM {TABLE} WHERE status = %s AND bucket >= %s{only}
        GROUP BY bucket, source_site_id, type HAVING sum(n) <> 0
    """
    params: list[Any] = [start, status, start] + ([] if partial is None else [partial])
    return [(hour, site, channel, n) for hour, site, channel, n in _rows(sql, params)]


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
