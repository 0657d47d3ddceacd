"""Fairness benchmark on PostgreSQL: a critical alarm is never stuck behind another site's flood.

Real gunicorn (2 processes), 2 dispatcher processes (``manage.py dispatch``, 16 threads each)
and an SMTP sink answering every message after 20 ms (bench/sink.py ``--delay-ms 20
--by-recipient``). Configured as an administrator would, with ``manage.py outbox_config import``:
site ``plant-a``'s rate limit raised by its own ``rate_limit``/``rate_burst`` (the documented
per-site setting), ``Shift`` a list of 5 members in individual mode, ``Control-Room`` and
``Operators`` one member each.

Runs, each on an empty outbox and full rate budgets:

1. **alone**: plant-a floods ``--flood`` notifications (batches of ``--batch``, 4 clients) to
   Shift; its flood rate (notifications / (last delivered − first ingested)) is the reference.
2. **fair**: the same flood while plant-b sends ``--critical-rate`` critical notifications a
   second to Control-Room and plant-c ``--normal-rate`` normal ones to Operators, one by one,
   from before the flood starts until its last row is delivered. Targets: plant-b's
   ingest→delivered (``delivered_at − created_at``) p95 ≤ 1 s and p99 ≤ 2 s; plant-c's p99
   ≤ 5 s; plant-a's flood rate ≥ 0.9 × alone; every email delivered exactly once (per
   notification and recipient, counted by the sink) and every row Delivered.
3. **oldest first** (the "before"): run 2 with ``OUTBOX_FAIR_CLAIM=false``, the claim's order
   before priorities (reported, no target).
4. **default limits**: plant-a without its raised limit, sending ``--limited-batches-per-second``
   batches a second for ``--limited-seconds``: it is refused (429) once its burst is spent,
   while plant-b and plant-c keep the targets of run 2.

Then, unless ``--skip-claim-cost``, the claim's cost per row: ``--claim-backlog`` rows from 5
sites, claims of 200 (each then marked delivered, as dispatch moves through a backlog), timed
for the fair claim, for the claim before this change (its statement, on the due index it
read, created for the measurement) and for the fair claim again (the machine drifts).

Writes bench-results/fairness.json. Usage: python bench/bench_fairness.py [--flood 20000] …
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, fresh_database, percentile, setup_django, write_results
from tests.support.db import drop_postgres_database
from tests.support.processes import Central, SmtpSink, manage, manage_output, poll, stop

MEMBERS = [f"shift{n}@bench.invalid" for n in range(5)]
SITES = ("plant-a", "plant-b", "plant-c")
RAISED = {"rate_limit": 100_000, "rate_burst": 100_000}  # plant-a's own limit (runs 1–3)


# --- configuration --------------------------------------------------------------------------------


def configuration(*, sink_port: int, raised: bool) -> dict[str, Any]:
    """The configuration file of a run: the sink as SMTP server, the lists, the three sites."""
    flood_site: dict[str, Any] = {"site_id": "plant-a", "name": "Plant A (floods)"}
    flood_site.update(RAISED if raised else {"rate_limit": None, "rate_burst": None})
    return {
        "smtp": {
            "host": "127.0.0.1",
            "port": sink_port,
            "security": "none",
            "from_address": "outbox@bench.invalid",
            "timeout_seconds": 10,
            "max_retries": 10,
            "retry_interval_seconds": 60,
        },
        "lists": [
            {"name": "Shift", "recipient_mode": "individual", "email": MEMBERS},
            {"name": "Control-Room", "email": ["control@bench.invalid"]},
            {"name": "Operators", "email": ["operators@bench.invalid"]},
        ],
        "sites": [flood_site, {"site_id": "plant-b", "name": "Plant B"}, {"site_id": "plant-c", "name": "Plant C"}],
    }


def configure(url: str, *, sink_port: int, raised: bool) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(configuration(sink_port=sink_port, raised=raised), file)
    try:
        manage_output("outbox_config", "import", file.name, database=url)
    finally:
        Path(file.name).unlink()


def site_keys(url: str) -> dict[str, str]:
    return {site: manage_output("create_site_key", site, database=url).strip().splitlines()[-1] for site in SITES}


def outbox_empty() -> None:
    """No notifications, attempts or rate buckets left from the run before."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE notifications_notification CASCADE")
        cursor.execute("DELETE FROM sites_siteratebucket")


# --- clients --------------------------------------------------------------------------------------


class Poster:
    """A site's HTTP client on one persistent connection."""

    def __init__(self, port: int, key: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}

    def post(self, path: str, body: dict[str, Any]) -> int:
        self.connection.request("POST", path, json.dumps(body), self.headers)
        response = self.connection.getresponse()
        response.read()
        return response.status


def notification(list_name: str, subject: str, **fields: Any) -> dict[str, Any]:
    return {"notification_id": str(uuid.uuid4()), "list_name": list_name, "subject": subject, "body": "", **fields}


class Steady(threading.Thread):
    """One notification every ``1 / rate`` seconds, one by one, until stopped; the ids accepted."""

    def __init__(self, port: int, key: str, *, rate: float, list_name: str, **fields: Any) -> None:
        super().__init__(daemon=True)
        self.poster = Poster(port, key)
        self.rate, self.list_name, self.fields = rate, list_name, fields
        self.stopped = threading.Event()
        self.accepted: list[str] = []
        self.refused = 0

    def run(self) -> None:
        started = time.perf_counter()
        sent = 0
        while not self.stopped.is_set():
            body = notification(self.list_name, "Boiler 2 pressure high", **self.fields)
            if self.poster.post("/api/v1/notifications/", body) == 201:
                self.accepted.append(body["notification_id"])
            else:
                self.refused += 1
            sent += 1
            self.stopped.wait(max(0.0, started + sent / self.rate - time.perf_counter()))


def flood(port: int, key: str, *, count: int, batch: int, clients: int = 4) -> tuple[list[str], int]:
    """``count`` notifications to Shift in batches, from ``clients`` threads: (ids accepted,
    batches refused)."""
    batches = [[notification("Shift", f"Tank {n} level low") for n in range(batch)] for _ in range(count // batch)]
    accepted: list[str] = []
    refused = 0
    lock = threading.Lock()

    def send(mine: list[list[dict[str, Any]]]) -> None:
        nonlocal refused
        poster = Poster(port, key)
        for items in mine:
            ok = poster.post("/api/v1/notifications/batch/", {"notifications": items}) == 200
            with lock:
                if ok:
                    accepted.extend(item["notification_id"] for item in items)
                else:
                    refused += 1

    threads = [threading.Thread(target=send, args=(batches[i::clients],)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return accepted, refused


def runaway(port: int, key: str, *, batch: int, per_second: float, seconds: float) -> tuple[list[str], int]:
    """A script in a loop: a batch every ``1 / per_second`` seconds for ``seconds``, ignoring
    every refusal: (ids accepted, batches refused)."""
    poster = Poster(port, key)
    accepted: list[str] = []
    refused = 0
    started = time.perf_counter()
    sent = 0
    while time.perf_counter() - started < seconds:
        items = [notification("Shift", f"Tank {n} level low") for n in range(batch)]
        if poster.post("/api/v1/notifications/batch/", {"notifications": items}) == 200:
            accepted.extend(item["notification_id"] for item in items)
        else:
            refused += 1
        sent += 1
        time.sleep(max(0.0, started + sent / per_second - time.perf_counter()))
    return accepted, refused


# --- workers --------------------------------------------------------------------------------------


def dispatchers_start(url: str, *, processes: int, concurrency: int, fair: bool) -> list["subprocess.Popen[str]"]:
    """``processes`` long-running dispatchers, returned once each waits at its first claim (the
    table is locked meanwhile, so that none starts before the others are up)."""
    import psycopg

    holder = psycopg.connect(url)
    try:
        holder.execute("LOCK TABLE notifications_notification IN EXCLUSIVE MODE")
        workers = [
            manage(
                "dispatch",
                "--concurrency",
                str(concurrency),
                database=url,
                stdout=subprocess.DEVNULL,
                stderr=None,
                OUTBOX_DISPATCH_INTERVAL=0.1,
                OUTBOX_FAIR_CLAIM=str(fair).lower(),
            )
            for _ in range(processes)
        ]
        with psycopg.connect(url, autocommit=True) as watcher:

            def waiting() -> bool:
                sql = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
                row = watcher.execute(sql, [holder.info.backend_pid]).fetchone()
                return row is not None and row[0] >= processes

            poll(waiting, timeout=120, interval=0.05, message="the dispatchers did not reach their first claim")
        holder.commit()
    finally:
        holder.close()
    return workers


# --- one run --------------------------------------------------------------------------------------


def delivered_all(ids: list[str]) -> bool:
    from notifications.models import Notification

    return Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).count() == len(ids)


def latencies(ids: list[str]) -> list[float]:
    from notifications.models import Notification

    rows = Notification.objects.filter(pk__in=ids, delivered_at__isnull=False).values_list("created_at", "delivered_at")
    return sorted((delivered - created).total_seconds() for created, delivered in rows if delivered is not None)


def flood_rate(ids: list[str]) -> float:
    from django.db.models import Max, Min

    from notifications.models import Notification

    span = Notification.objects.filter(pk__in=ids).aggregate(first=Min("created_at"), last=Max("delivered_at"))
    return len(ids) / (span["last"] - span["first"]).total_seconds()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values, default=float("nan")),
    }


def exactly_once(tokens: list[str], expected: dict[str, int]) -> bool:
    """Whether the sink received each (notification, recipient) once, and nothing else:
    ``expected`` maps every id to its list's size."""
    received = Counter(zip(tokens[0::2], tokens[1::2], strict=True))
    per_notification = Counter(notification_id for notification_id, _ in received)
    return all(n == 1 for n in received.values()) and dict(per_notification) == expected


def run(
    url: str,
    keys: dict[str, str],
    args: argparse.Namespace,
    *,
    name: str,
    fair: bool,
    others: bool,
    limited: bool = False,
) -> dict[str, Any]:
    outbox_empty()
    sink = SmtpSink("bench.sink", "--delay-ms", str(args.delay_ms), "--by-recipient")
    configure(url, sink_port=sink.port, raised=not limited)
    result: dict[str, Any] = {"name": name, "fair": fair}
    workers = dispatchers_start(url, processes=args.processes, concurrency=args.concurrency, fair=fair)
    try:
        with Central(database=url, workers=2, OUTBOX_DISPATCH_TRIGGER="false") as central:
            senders = []
            if others:
                senders = [
                    Steady(
                        central.port,
                        keys["plant-b"],
                        rate=args.critical_rate,
                        list_name="Control-Room",
                        priority="critical",
                    ),
                    Steady(central.port, keys["plant-c"], rate=args.normal_rate, list_name="Operators"),
                ]
                for sender in senders:
                    sender.start()
            if limited:
                flooded, refused = runaway(
                    central.port,
                    keys["plant-a"],
                    batch=args.batch,
                    per_second=args.limited_batches_per_second,
                    seconds=args.limited_seconds,
                )
            else:
                flooded, refused = flood(central.port, keys["plant-a"], count=args.flood, batch=args.batch)
            poll(
                lambda: delivered_all(flooded),
                timeout=args.timeout,
                interval=0.5,
                message=f"{name}: the flood was not delivered",
            )
            for sender in senders:
                sender.stopped.set()
                sender.join()
            others_ids = [nid for sender in senders for nid in sender.accepted]
            poll(
                lambda: delivered_all(others_ids), timeout=60, interval=0.2, message=f"{name}: plant-b/c not delivered"
            )
    finally:
        for worker in workers:
            stop(worker, timeout=60)
        tokens = sink.stop()
    expected = {**dict.fromkeys(flooded, len(MEMBERS)), **{nid: 1 for sender in senders for nid in sender.accepted}}
    result.update(
        {
            "flood_accepted": len(flooded),
            "flood_batches_refused": refused,
            "flood_rate": flood_rate(flooded),
            "exactly_once": exactly_once(tokens, expected),
            "emails": len(tokens) // 2,
        }
    )
    if senders:
        b, c = senders
        result["critical"] = {**summary(latencies(b.accepted)), "refused": b.refused}
        result["normal"] = {**summary(latencies(c.accepted)), "refused": c.refused}
    print(f"{name}: {json.dumps(result, default=str)}", flush=True)
    return result


# --- the claim's cost per row ------------------------------------------------------------------

# The claim before priorities and fairness (notifications/dispatch/claim.py as it was then): the
# rows without a due time, then those due, off notif_due_idx in its order, leased in one
# statement. Kept here as the reference its successor is measured against.
OLD_DUE_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS notif_due_idx ON notifications_notification "
    "(next_attempt_at ASC NULLS FIRST) WHERE status IN ('Pending', 'Retrying')"
)
_UNLEASED = "status IN ('Pending', 'Retrying') AND (claimed_until IS NULL OR claimed_until < %(now)s)"
OLD_CLAIM_SQL = (
    f"WITH undated AS (SELECT notification_id FROM notifications_notification WHERE {_UNLEASED} AND next_attempt_at IS NULL "
    "ORDER BY next_attempt_at ASC NULLS FIRST LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
    f"dated AS (SELECT notification_id FROM notifications_notification WHERE {_UNLEASED} AND next_attempt_at <= %(now)s "
    "ORDER BY next_attempt_at ASC NULLS FIRST LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM undated), 0) "
    "FOR UPDATE SKIP LOCKED) "
    "UPDATE notifications_notification AS n SET claimed_by = %(worker)s, claimed_until = %(until)s "
    "FROM (SELECT notification_id FROM undated UNION ALL SELECT notification_id FROM dated) AS picked "
    "WHERE n.notification_id = picked.notification_id RETURNING n.notification_id, n.source_site_id, n.type, "
    "n.list_name, n.subject, n.body, n.type_data, n.resolved_targets, n.status, n.retry_count, n.channel_failures, "
    "n.created_at, n.requeued_at, n.next_attempt_at"
)


def claim_backlog(count: int, sites: int, *, analyzed: bool) -> None:
    """``count`` due rows from ``sites`` sites; the table's statistics taken after them
    (``analyzed``) or before them, on the empty table (a backlog that arrived since the last
    ANALYZE, as the EXPLAIN tests of tests/dispatch/test_claiming.py have it)."""
    from django.db import connection

    outbox_empty()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE notifications_notification")
        cursor.execute(
            """
            INSERT INTO notifications_notification (
                notification_id, type, list_name, subject, body, type_data, status, priority, retry_count,
                channel_failures, last_error, resolved_targets, targets_refused, source_site_id,
                source_instance_id, source_script, site_enqueued_at, created_at, next_attempt_at,
                claimed_by, fingerprint, discarded_by, discard_reason)
            SELECT gen_random_uuid(), 'email', 'Shift', 'Tank level low', '', '{}', 'Pending', 1, 0, 0, '', '[]', 0,
                'plant-' || (i %% %s), '', '', t, t, t, '', md5(i::text), '', ''
            FROM (SELECT i, now() - interval '1 hour' + interval '1 millisecond' * (i / 10) AS t
                  FROM generate_series(1, %s) AS i) AS backlog
            """,
            [sites, count],
        )
        if analyzed:
            cursor.execute("VACUUM ANALYZE notifications_notification")


def time_claims(claim: Any, rounds: int) -> list[float]:
    """Seconds per claimed row of ``rounds`` claims of 200, each claim's rows then marked delivered."""
    from django.db import connection, transaction

    from notifications import db
    from notifications.clock import database_now

    per_row = []
    for _ in range(rounds):
        now = database_now()
        with transaction.atomic():
            db.read_in_index_order()
            started = time.perf_counter()
            rows = claim(now)
            per_row.append((time.perf_counter() - started) / max(1, len(rows)))
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE notifications_notification SET status = 'Delivered', delivered_at = now(), claimed_until = NULL "
                "WHERE notification_id = ANY(%s)",
                [[row.pk for row in rows]],
            )
    return per_row


def claim_cost(count: int, sites: int, rounds: int) -> dict[str, Any]:
    """Microseconds per claimed row (medians), the fair claim and the one before, under both
    statistics: taken with the backlog, and taken before it arrived."""
    from datetime import timedelta

    from django.db import connection

    from notifications.dispatch.fair import ClaimLimits, notifications_claim_in_order
    from notifications.models import Notification

    def fair(now: Any) -> list[Any]:
        return notifications_claim_in_order(
            limits=ClaimLimits(limit=200), worker_id="bench", now=now, until=now + timedelta(minutes=2)
        )

    def before(now: Any) -> list[Any]:
        params = {"now": now, "limit": 200, "worker": "bench", "until": now + timedelta(minutes=2)}
        return list(Notification.objects.raw(OLD_CLAIM_SQL, params))

    medians: dict[str, dict[str, float]] = {}
    for statistics_taken, analyzed in (("with the backlog", True), ("before the backlog", False)):
        claim_backlog(count, sites, analyzed=analyzed)
        fair_first = time_claims(fair, rounds)
        with connection.cursor() as cursor:
            cursor.execute(OLD_DUE_INDEX)  # the index the claim before read
        old = time_claims(before, rounds)
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX CONCURRENTLY IF EXISTS notif_due_idx")
        fair_again = time_claims(fair, rounds)
        medians[statistics_taken] = {
            "fair": statistics.median(fair_first + fair_again) * 1e6,
            "before": statistics.median(old) * 1e6,
        }
    print(f"claim cost, µs per row (median of claims of 200 from {count:,} rows, {sites} sites): {medians}", flush=True)
    return {"backlog": count, "sites": sites, "rounds": rounds, "us_per_row": medians}


# --- main -----------------------------------------------------------------------------------------


def checks_of(runs: dict[str, dict[str, Any]], cost: dict[str, Any] | None) -> list[dict[str, Any]]:
    alone, fair, unfair, limited = runs["alone"], runs["fair"], runs["oldest_first"], runs["default_limits"]
    ratio = fair["flood_rate"] / alone["flood_rate"]
    result = [
        check(
            "fairness: critical p95, flood beside",
            fair["critical"]["p95"],
            "s",
            "≤ 1",
            fair["critical"]["p95"] <= 1,
            fair["critical"]["p95"] / 1,
        ),
        check(
            "fairness: critical p99, flood beside",
            fair["critical"]["p99"],
            "s",
            "≤ 2",
            fair["critical"]["p99"] <= 2,
            fair["critical"]["p99"] / 2,
        ),
        check(
            "fairness: normal of another site p99",
            fair["normal"]["p99"],
            "s",
            "≤ 5",
            fair["normal"]["p99"] <= 5,
            fair["normal"]["p99"] / 5,
        ),
        check("fairness: flood rate ÷ alone", ratio, "×", "≥ 0.9", ratio >= 0.9, ratio),
        check("fairness: flood alone", alone["flood_rate"], "notif/s", "(reference)", True),
        check("fairness: oldest first, critical p95", unfair["critical"]["p95"], "s", "(before)", True),
        check("fairness: oldest first, critical p99", unfair["critical"]["p99"], "s", "(before)", True),
        check("fairness: oldest first, normal p99", unfair["normal"]["p99"], "s", "(before)", True),
        check(
            "fairness: default limits, flood refused",
            limited["flood_batches_refused"],
            "batches",
            "> 0",
            limited["flood_batches_refused"] > 0,
        ),
        check(
            "fairness: default limits, critical p99",
            limited["critical"]["p99"],
            "s",
            "≤ 2, none refused",
            limited["critical"]["p99"] <= 2 and limited["critical"]["refused"] == 0,
            limited["critical"]["p99"] / 2,
        ),
        check(
            "fairness: default limits, normal p99",
            limited["normal"]["p99"],
            "s",
            "≤ 5, none refused",
            limited["normal"]["p99"] <= 5 and limited["normal"]["refused"] == 0,
            limited["normal"]["p99"] / 5,
        ),
        check(
            "fairness: every email exactly once",
            sum(r["emails"] for r in runs.values()),
            "emails",
            "all",
            all(r["exactly_once"] for r in runs.values()),
        ),
    ]
    for statistics_taken, us in (cost or {}).get("us_per_row", {}).items():
        fair_cost, before = us["fair"], us["before"]
        result.append(
            check(
                f"claim µs/row, stats {statistics_taken}",
                fair_cost,
                "µs",
                "(report; ratio: ÷ before)",
                True,
                fair_cost / before,
            )
        )
        result.append(check(f"claim µs/row before, stats {statistics_taken}", before, "µs", "(reference)", True))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=20_000, help="notifications plant-a floods (20000)")
    parser.add_argument("--batch", type=int, default=1000, help="notifications per batch (1000)")
    parser.add_argument("--critical-rate", type=float, default=5.0, help="plant-b's critical notifications a second")
    parser.add_argument("--normal-rate", type=float, default=1.0, help="plant-c's normal notifications a second")
    parser.add_argument("--delay-ms", type=int, default=20, help="the sink's answer to each message (20 ms)")
    parser.add_argument("--processes", type=int, default=2, help="dispatcher processes (2)")
    parser.add_argument("--concurrency", type=int, default=16, help="delivery threads per dispatcher (16)")
    parser.add_argument("--limited-seconds", type=float, default=20.0, help="how long plant-a runs away (20 s)")
    parser.add_argument("--limited-batches-per-second", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="longest wait for a flood's delivery (s)")
    parser.add_argument("--skip-claim-cost", action="store_true")
    parser.add_argument("--claim-backlog", type=int, default=200_000)
    parser.add_argument("--claim-rounds", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()

    url = fresh_database("fairness")
    setup_django(url)
    cost = None
    try:
        configure(url, sink_port=25, raised=True)
        keys = site_keys(url)
        runs = {
            "alone": run(url, keys, args, name="alone", fair=True, others=False),
            "fair": run(url, keys, args, name="fair", fair=True, others=True),
            "oldest_first": run(url, keys, args, name="oldest_first", fair=False, others=True),
            "default_limits": run(url, keys, args, name="default_limits", fair=True, others=True, limited=True),
        }
        if not args.skip_claim_cost:
            cost = claim_cost(args.claim_backlog, 5, args.claim_rounds)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_postgres_database(url)
    checks = checks_of(runs, cost)
    write_results("fairness", checks, {"runs": runs, "claim_cost": cost, "arguments": vars(args)})
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
