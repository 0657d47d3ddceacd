"""Operations console benchmark on PostgreSQL with 1,000,000 notifications (or ``--rows``, e.g.
10,000,000).

Seeds a fresh database with generate_series (95% terminal rows spread over a year, skewed to
recent; one delivered row in 40 delivered partially; 3 % suppressed, two in three as
duplicates of 1,000 keys and one in three by 20 silences; queued rows mostly minutes old, some
stuck; 20 sites of uneven size; 5 lists) in one INSERT … SELECT, the table's secondary
indexes dropped first and built once afterwards (at 10,000,000 rows maintaining 26 indexes
row by row is what would take the time), then
renders the console pages in-process with Django's test Client as a logged-in operator and
reports the median server time of several runs per page:

- the default outbox page (changelist, tiles, per-site breakdown)
- the outbox filtered by status (Parked, and Delivered: the rare and the huge case)
- a subject search (a common word and a rare one)
- the admin index dashboard (headline tiles and the 24-hour trend charts)
- the dashboard's 7-day trend charts
- the parked-by-cause view and one cause's rows, the list filter on a name no list has, the
  time presets, the search by list name, error text, source instance and id prefix, and the
  redrive view of one Retry (200 rows)
- an open channel's breakdown by site and list, the delivery policies page, and the status
  line's checks alone (given the KPIs)
- a site filter and a list filter on a real list, where the tiles and the per-site table
  count the matching rows
- the Silences page (each silence with the rows it holds back), one silence's rows, the
  silenced rows, and the flood report

Target: each page ≤ 500 ms, searches included; the status line and the per-site and per-list
counts ≤ 200 ms. Above 1,000,000 rows each page's target is 1 s (the status line's stays
200 ms). Writes bench-results/console.json (console-<rows>.json for another size).

Each size has its own database (``<name>_console``, ``<name>_console_10m`` …), so ``--reuse``
measures the one seeded for ``--rows`` again.

Usage: python bench/bench_console.py [--rows 1000000] [--runs 7] [--reuse]
       make bench-console ROWS=10000000
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from urllib.parse import urlencode

from bench.common import bench_database_url, check, fresh_database, setup_django, write_results

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.test import Client

DEFAULT_ROWS = 1_000_000
# Above a million rows a page may take up to this long (ten million: every page within 1 s).
LARGE_PAGE_TARGET_MS = 1000
SITES = 20
SILENCES = 20
LISTS = ["Operators", "Maintenance", "Shift leads", "Electrical", "Management"]

# One INSERT … SELECT: the server generates every row, nothing crosses the wire.
SEED_SQL = """
INSERT INTO notifications_notification (
    notification_id, type, list_name, subject, body, type_data, status, retry_count, channel_failures,
    last_error, resolved_targets, targets_refused, source_site_id, source_instance_id, source_script,
    site_enqueued_at,
    created_at, last_attempt_at, next_attempt_at, delivered_at, claimed_by, claimed_until, fingerprint,
    requeued_at, expired_at, discarded_at, discarded_by, discard_reason, dedup_key, suppressed_by)
SELECT
    gen_random_uuid(), 'email',
    CASE WHEN status = 'Parked' AND i %% 7 = 0 THEN 'Night-Shift' ELSE (%(lists)s::text[])[1 + (i %% %(list_count)s)] END,
    (ARRAY['Pump','Valve','Tank','Compressor','Boiler','Conveyor','Chiller','Feeder'])[1 + floor(r4 * 8)::int]
        || ' ' || (1 + floor(r5 * 60)::int) || ' '
        || CASE WHEN i %% 20000 = 0 THEN 'overtemperature shutdown'
                ELSE (ARRAY['tripped','stuck open','level high','fault','low water','offline',
                            'high pressure','restarted'])[1 + floor(r5 * 8)::int] END,
    'Raised by the site script; see the plant HMI for details.',
    '{}'::jsonb,
    status,
    CASE status WHEN 'Parked' THEN 10 WHEN 'Retrying' THEN 1 + floor(r5 * 9)::int ELSE 0 END,
    CASE status WHEN 'Retrying' THEN 1 ELSE 0 END,
    CASE WHEN status = 'Parked' AND i %% 7 = 0 THEN 'Unknown notification list ''Night-Shift''.'
         WHEN status = 'Parked' AND i %% 7 = 1 THEN 'Notification list ''Shift leads'' has no email recipients.'
         ELSE CASE status WHEN 'Parked' THEN 'Retries exhausted (10): 451 4.3.0 Mail server temporarily rejected message'
                WHEN 'Retrying' THEN '421 4.7.0 Service not available, closing transmission channel'
                WHEN 'Discarded' THEN '550 5.1.1 Recipient address rejected: mailbox unknown'
                ELSE '' END END,
    CASE WHEN status = 'Delivered' AND i %% 40 = 0
              THEN '[{"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
                     {"target": "op9@example.com", "outcome": "refused", "smtp_code": 550}]'::jsonb
         WHEN status = 'Delivered' THEN '[{"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250}]'::jsonb
         ELSE '[]'::jsonb END,
    CASE WHEN status = 'Delivered' AND i %% 40 = 0 THEN 1 ELSE 0 END,
    'site-' || lpad(floor(%(sites)s * r3 * r3)::int::text, 2, '0'),
    'Instance' || (i %% 500), 'OnAlarm',
    created_at - interval '2 seconds',
    created_at,
    CASE WHEN status = 'Pending' THEN NULL ELSE created_at + interval '3 seconds' END,
    CASE WHEN status IN ('Pending', 'Retrying') THEN created_at + interval '60 seconds' END,
    CASE WHEN status = 'Delivered' THEN created_at + interval '3 seconds' END,
    '', NULL,
    md5(i::text) || md5((i + 1)::text),
    NULL,
    CASE WHEN status = 'Parked' AND i %% 10 = 0 THEN created_at + interval '1 day' END,
    CASE WHEN status = 'Discarded' THEN created_at + interval '1 day' END,
    CASE WHEN status = 'Discarded' THEN 'bench-operator' ELSE '' END,
    CASE WHEN status = 'Discarded' THEN 'Obsolete alarm' ELSE '' END,
    -- Suppressed: two in three duplicates of 1,000 chattering keys, one in three silenced by
    -- one of the SILENCES silences (ids 1 …, made by configuration()).
    CASE WHEN status = 'Suppressed' AND i %% 3 > 0 THEN 'key-' || (i %% 1000) ELSE '' END,
    CASE WHEN status = 'Suppressed' AND i %% 3 > 0 THEN 'duplicate:' || md5((i %% 1000)::text)::uuid
         WHEN status = 'Suppressed' THEN 'silence:' || (1 + i %% %(silences)s) ELSE '' END
FROM (
    SELECT i, r3, r4, r5, status,
           now() - CASE WHEN status IN ('Pending', 'Retrying')
                        THEN interval '2 hours' * power(r2, 6)        -- mostly minutes, some stuck
                        ELSE interval '365 days' * power(r2, 2) END    -- a year, skewed to recent
             AS created_at
    FROM (
        SELECT i, random() AS r2, random() AS r3, random() AS r4, random() AS r5,
               CASE WHEN r1 < 0.03 THEN 'Pending' WHEN r1 < 0.05 THEN 'Retrying'
                    WHEN r1 < 0.065 THEN 'Parked' WHEN r1 < 0.07 THEN 'Discarded'
                    WHEN r1 < 0.10 THEN 'Suppressed' ELSE 'Delivered' END AS status
        FROM (SELECT i, random() AS r1 FROM generate_series(1, %(rows)s) AS i) AS g
    ) AS s
) AS t
ORDER BY created_at  -- the table grows in ingest order: rows sit on disk in created_at order
"""


# The table's indexes that no constraint owns: dropped before the load and built after it.
SECONDARY_INDEXES_SQL = """
SELECT indexname, indexdef FROM pg_indexes
WHERE schemaname = current_schema() AND tablename = %s
  AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)
"""


def seed(url: str, rows: int) -> tuple[dict[str, int], float]:
    import psycopg

    from notifications.counts import ALARM_REBUILD_SQL, ALARM_TABLE, NOTIFICATIONS, REBUILD_SQL
    from notifications.counts import TABLE as COUNTS

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT setseed(0.42)")
        # Building the indexes once afterwards is much faster than maintaining them per row.
        indexes = conn.execute(SECONDARY_INDEXES_SQL, [NOTIFICATIONS, NOTIFICATIONS]).fetchall()
        for name, _definition in indexes:
            conn.execute(f"DROP INDEX {name}")
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET work_mem = '256MB'")
        # The counts the database keeps are made once afterwards too: the insert trigger would
        # group all the seeded rows in one statement (notifications.counts).
        conn.execute(f"ALTER TABLE {NOTIFICATIONS} DISABLE TRIGGER notif_count_insert")
        conn.execute(f"ALTER TABLE {NOTIFICATIONS} DISABLE TRIGGER alarm_count_insert")
        conn.execute(
            SEED_SQL,
            {"rows": rows, "lists": LISTS, "list_count": len(LISTS), "sites": SITES, "silences": SILENCES},
        )
        print(f"inserted {rows:,} rows in {time.perf_counter() - started:.0f} s; building indexes …", flush=True)
        with conn.transaction():
            conn.execute(f"ALTER TABLE {NOTIFICATIONS} ENABLE TRIGGER notif_count_insert")
            conn.execute(f"ALTER TABLE {NOTIFICATIONS} ENABLE TRIGGER alarm_count_insert")
            conn.execute(f"DELETE FROM {COUNTS}")
            conn.execute(REBUILD_SQL)
            conn.execute(f"DELETE FROM {ALARM_TABLE}")
            rebuilt = time.perf_counter()
            conn.execute(ALARM_REBUILD_SQL)
            print(f"alarm counts rebuilt in {time.perf_counter() - rebuilt:.1f} s", flush=True)
        for _name, definition in indexes:
            conn.execute(definition)
        conn.execute("VACUUM ANALYZE notifications_notification")
        conn.execute(f"VACUUM ANALYZE {COUNTS}")
        conn.execute(f"VACUUM ANALYZE {ALARM_TABLE}")
        counts: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM notifications_notification GROUP BY 1").fetchall()
        )
    seconds = time.perf_counter() - started
    print(f"seeded {sum(counts.values()):,} notifications in {seconds:.0f} s: {counts}", flush=True)
    return counts, seconds


def database_suffix(rows: int) -> str:
    """``console`` for the default million rows, ``console_10m`` for ten million, …"""
    if rows == DEFAULT_ROWS:
        return "console"
    return f"console_{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"console_{rows}"


def seeded_database_url(rows: int = DEFAULT_ROWS) -> str:
    """The database this benchmark seeds for ``rows`` (``<BENCH_DATABASE_URL's name>_console``,
    ``…_console_10m``), which ``--reuse`` measures again."""
    from urllib.parse import urlparse, urlunparse

    base = urlparse(bench_database_url())
    return urlunparse(base._replace(path=f"/{base.path.lstrip('/') or 'outbox'}_{database_suffix(rows)}"))


def configuration() -> "User":
    """Sites, lists and an operator to log in as (the role the console is for)."""
    from datetime import timedelta

    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from notifications.models import NotificationList, Silence
    from sites.models import Site

    for n in range(SITES):
        Site.objects.get_or_create(site_id=f"site-{n:02d}", defaults={"name": f"Plant {n:02d}"})
    for name in LISTS:
        NotificationList.objects.get_or_create(name=name)
    now = timezone.now()
    for n in range(1, SILENCES + 1):  # the seeded rows' silence:1 … (half of them over by now)
        Silence.objects.get_or_create(
            pk=n,
            defaults={
                "site": f"site-{n % SITES:02d}",
                "starts_at": now - timedelta(days=n),
                "ends_at": now + timedelta(hours=2 if n % 2 else -1),
                "reason": f"Maintenance {n}",
                "created_by": "bench",
            },
        )
    user, created = User.objects.get_or_create(username="bench-operator", defaults={"is_staff": True})
    if created:
        user.groups.add(Group.objects.get(name="Operators"))
    return user


NIGHT_SHIFT = "Unknown notification list 'Night-Shift'."


def console_fixtures() -> tuple[str, str]:
    """An existing row's 8-character id (the id search) and the instant of a Retry of 200 of
    the Night-Shift rows (the redrive view), made once per database."""
    from django.db.models import Max

    from notifications.models import Notification
    from notifications.operations import notification_retry

    row = Notification.objects.filter(status="Delivered").only("pk").order_by("-created_at")[500]
    at = Notification.objects.filter(list_name="Night-Shift", requeued_at__isnull=False).aggregate(
        at=Max("requeued_at")
    )["at"]
    if at is None:
        ids = list(
            Notification.objects.filter(status="Parked", list_name="Night-Shift").values_list("pk", flat=True)[:200]
        )
        notification_retry(notification_ids=ids, user=None)
        at = Notification.objects.filter(pk__in=ids).aggregate(at=Max("requeued_at"))["at"]
    return str(row.pk)[:8], at.isoformat()


def measure(client: "Client", url: str, runs: int) -> dict[str, Any]:
    """Median and all server times (ms) for ``url`` after one warm-up, with the queries one
    request runs and the slowest of them."""
    from django.db import connection

    queries = []

    def timed(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            queries.append(((time.perf_counter() - started) * 1000, sql))

    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    with connection.execute_wrapper(timed):
        response = client.get(url)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    changelist = (response.context or {}).get("cl")
    slowest = max(queries, default=(0.0, ""))
    return {
        "median_ms": statistics.median(times),
        "runs_ms": [round(t, 1) for t in times],
        "queries": len(queries),
        "result_count": getattr(changelist, "result_count", None),
        "slowest_query_ms": round(slowest[0], 1),
        "slowest_query": slowest[1][:300],
    }


def measure_status_line(runs: int) -> float:
    """Median time (ms) of the status line's checks given the page's KPIs (which the page
    computes anyway and the page timings above include)."""
    from notifications.kpis import kpis_compute
    from notifications.status_line import status_line_compute

    kpis = kpis_compute()
    status_line_compute(kpis=kpis)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        status_line_compute(kpis=kpis)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--reuse", action="store_true", help="measure an already seeded database (skip seeding)")
    parser.add_argument(
        "--only", action="append", default=[], help="measure only the pages whose label holds this text (repeatable)"
    )
    args = parser.parse_args()

    if args.rows < 10_000:
        parser.error("--rows must be at least 10000 (the fixtures pick rows from the seeded ones)")
    if args.reuse:
        url = seeded_database_url(args.rows)
        counts: dict[str, int] = {}
        seed_seconds = 0.0
    else:
        print(f"Preparing a fresh PostgreSQL database for {args.rows:,} rows …", flush=True)
        url = fresh_database(database_suffix(args.rows))
        counts, seed_seconds = seed(url, args.rows)

    setup_django(url)
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()  # lets the test Client report the rendered context
    from django.urls import reverse

    user = configuration()
    id_prefix, redrive_at = console_fixtures()
    client = Client()
    client.force_login(user)
    outbox = reverse("admin:notifications_notification_changelist")
    pages = {
        "default outbox page": (outbox, 500),
        "status filter (Parked)": (f"{outbox}?status=Parked", 500),
        "status filter (Delivered)": (f"{outbox}?status=Delivered", 500),
        "stuck-only toggle": (f"{outbox}?stuck=1", 500),
        "subject search (common word)": (f"{outbox}?q=compressor", 500),
        "subject search (rare word)": (f"{outbox}?q=overtemperature", 500),
        "admin index dashboard": (reverse("admin:index"), 500),
        # The dashboard with its trend charts over 7 days (24 h is the default view above).
        "dashboard trends (7 days)": (reverse("admin:index") + "?trends=7d", 500),
        "parked by cause (grouped view)": (reverse("admin:notifications_notification_parked"), 500),
        "parked rows of one cause": (f"{outbox}?{urlencode({'status': 'Parked', 'cause': NIGHT_SHIFT})}", 500),
        "list filter (a name no list has)": (f"{outbox}?list=Night-Shift", 500),
        # The tiles and the per-site table count the matching rows (notifications.admin.tiles).
        "site filter (the largest site; tiles follow it)": (f"{outbox}?site=site-00", 500),
        "list filter (Operators; tiles follow it)": (f"{outbox}?list=Operators", 500),
        "time preset (last 1 h)": (f"{outbox}?created_within=1h", 500),
        "time preset (last 7 d)": (f"{outbox}?created_within=7d", 500),
        "search: list name": (f"{outbox}?q=night-shift", 500),
        "search: error text": (f"{outbox}?q=mailbox+unknown", 500),
        "search: source instance": (f"{outbox}?q=Instance417", 500),
        "search: id prefix": (f"{outbox}?q={id_prefix}", 500),
        "search: recipient (to:)": (f"{outbox}?{urlencode({'q': 'to:op1@example.com'})}", 500),
        # Where an open channel hits: its waiting rows counted by site and by list (≤ 200 ms).
        "channel breakdown (email: per-site and per-list counts)": (
            f"{reverse('admin:notifications_notification_channel')}?channel=email",
            200,
        ),
        "delivery policies (policy in force per channel)": (
            reverse("admin:notifications_deliverypolicy_changelist"),
            500,
        ),
        # Suppression: the silences with what each holds back, the rows of one, the silenced
        # rows, and the flood report (alarms per list per 10 minutes, the top sources).
        "silences (with their suppressed counts)": (reverse("admin:notifications_silence_changelist"), 500),
        "one silence's rows": (f"{outbox}?{urlencode({'status': 'Suppressed', 'suppressed_by': 'silence:3'})}", 500),
        "suppression filter (silenced)": (f"{outbox}?suppressed_by=silence", 500),
        "flood report": (reverse("admin:notifications_notification_flood"), 500),
        "redrive view (one retry's rows)": (
            f"{reverse('admin:notifications_notification_redrive')}?{urlencode({'at': redrive_at})}",
            500,
        ),
    }
    results, checks = {}, []
    for label, (url_path, target_ms) in pages.items():
        if args.only and not any(text in label for text in args.only):
            continue
        if args.rows > DEFAULT_ROWS:
            target_ms = LARGE_PAGE_TARGET_MS
        result = measure(client, url_path, args.runs)
        results[label] = dict(result, url=url_path)
        print(
            f"{label:32} median {result['median_ms']:7.1f} ms  ({result['queries']} queries, "
            f"slowest {result['slowest_query_ms']:.1f} ms, rows {result['result_count']})",
            flush=True,
        )
        checks.append(
            check(
                f"console: {label}",
                result["median_ms"],
                "ms",
                f"<= {target_ms}",
                result["median_ms"] <= target_ms,
                result["median_ms"] / target_ms,
            )
        )
    if not args.only or any("status line" in text for text in args.only):
        line_ms = measure_status_line(args.runs)
        results["status line (beyond the KPIs)"] = {"median_ms": line_ms}
        print(f"{'status line (beyond the KPIs)':32} median {line_ms:7.1f} ms", flush=True)
        checks.append(check("console: status line", line_ms, "ms", "<= 200", line_ms <= 200, line_ms / 200))
    write_results(
        "console" if args.rows == DEFAULT_ROWS else f"console-{args.rows}",
        checks,
        {
            "rows": args.rows,
            "status_counts": counts,
            "seed_seconds": round(seed_seconds, 1),
            "runs": args.runs,
            "pages": results,
        },
    )
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
