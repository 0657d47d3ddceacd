"""Purge benchmark on PostgreSQL: the retention purge deleting ``--rows`` (1,000,000) terminal
rows past the retention window, each with one delivery attempt, in its bounded batches
(OUTBOX_PURGE_BATCH_SIZE) and resting between them (OUTBOX_PURGE_DUTY_CYCLE; both as the
environment sets them, else their defaults), while sites post at ``--rate`` (200)
notifications/s over real HTTP (gunicorn, two workers).

1. **Baseline**: ingest at the rate for ``--baseline-seconds`` with no purge: per-request
   latency (client side, open loop: each request is sent at its time, from ``--clients``
   connections). By default the baseline lasts one checkpoint interval of the server
   (``checkpoint_timeout``, at least 60 s), as the purge's window does: the sites' p99 over
   20-s windows without any purge ranged from 4.9 to 24.6 ms in one 7-minute run (9.6 ms over
   the whole), so a short baseline compares the purge with a lucky or unlucky moment, not
   with the sites' p99.
2. **During the purge**: ``manage.py purge_notifications`` runs while the same ingest goes on;
   latency of the requests sent while it ran. Lock waits are sampled every 0.1 s from
   ``pg_locks``/``pg_stat_activity`` (sessions of the benchmark database waiting for a lock,
   and for how long); the sampler runs through the baseline too, so both windows carry its
   load.

Both windows also report the spread of the p99 over their 20-s parts.

Targets: ingest p99 during the purge ≤ 2 × its p99 without; no lock wait over 1 s; every old
row purged, every ingested row kept.

Writes bench-results/purge.json. Usage: python bench/bench_purge.py [--rows 1000000] …
"""

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, demo_database, percentile, setup_django, write_results
from tests.support.db import drop_postgres_database
from tests.support.processes import Central, manage

SEED_SQL = """
INSERT INTO notifications_notification (
    notification_id, type, list_name, subject, body, type_data, status, retry_count, channel_failures,
    last_error, resolved_targets, source_site_id, source_instance_id, source_script, site_enqueued_at,
    created_at, last_attempt_at, next_attempt_at, delivered_at, claimed_by, claimed_until, fingerprint,
    requeued_at, expired_at, discarded_at, discarded_by, discard_reason)
SELECT gen_random_uuid(), 'email', 'Operators', 'Pump ' || (i %% 60) || ' tripped',
       'Raised by the site script; see the plant HMI for details.', '{}'::jsonb, 'Delivered', 0, 0, '',
       '[{"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250}]'::jsonb,
       'demo-site', 'Instance' || (i %% 500), 'OnAlarm', created_at - interval '2 seconds',
       created_at, created_at + interval '1 second', NULL, created_at + interval '1 second', '', NULL,
       md5(i::text) || md5((i + 1)::text), NULL, NULL, NULL, '', ''
FROM (SELECT i, now() - interval '400 days' - interval '300 days' * (i::float / %(rows)s) AS created_at
      FROM generate_series(1, %(rows)s) AS i) AS g
ORDER BY created_at
"""
SEED_ATTEMPTS_SQL = """
INSERT INTO notifications_deliveryattempt (notification_id, started_at, duration_ms, outcome, failure_class,
                                           error, detail, worker)
SELECT notification_id, last_attempt_at, 40, 'success', '', '', '{"smtp_code": 250}'::jsonb, 'q:bench:1:seed'
FROM notifications_notification
"""
LOCK_WAITS_SQL = """
SELECT a.pid, extract(epoch FROM now() - a.query_start)
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()
"""


def seed(url: str, rows: int) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_SQL, {"rows": rows})
        conn.execute(SEED_ATTEMPTS_SQL)
        conn.execute("VACUUM ANALYZE notifications_notification")
        conn.execute("VACUUM ANALYZE notifications_deliveryattempt")
        conn.execute("CHECKPOINT")  # the seed's writes are not flushed during the baseline
    seconds = time.perf_counter() - started
    print(
        f"seeded {rows:,} delivered notifications (400+ days old) with one attempt each in {seconds:.0f} s", flush=True
    )
    return seconds


class Ingest:
    """Open-loop ingest at ``rate``/s from ``clients`` keep-alive connections: each request is
    sent at its scheduled time (a late one as soon as its connection is free); records
    (send time, latency) per request."""

    def __init__(self, port: int, key: str, rate: float, clients: int) -> None:
        self.port, self.key, self.rate, self.clients = port, key, rate, clients
        self.samples: list[tuple[float, float]] = []
        self.ids: list[str] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.started = time.perf_counter()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(self.clients)]
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _run(self, n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {self.key}"}
        k = 0
        while not self.stop.is_set():
            due = self.started + (n + k * self.clients) / self.rate
            k += 1
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            notification_id = str(uuid.uuid4())
            body = json.dumps(
                {"notification_id": notification_id, "list_name": "Operators", "subject": "Pump", "body": "Trip."}
            )
            sent = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/notifications/", body, headers)
                response = conn.getresponse()
                response.read()
                problem = None if response.status == 201 else f"status {response.status}"
            except OSError as exc:
                problem = str(exc)
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            latency = time.perf_counter() - sent
            with self.lock:
                if problem is None:
                    self.samples.append((sent, latency))
                    self.ids.append(notification_id)
                else:
                    self.errors.append(problem)

    def latencies(self, since: float, until: float) -> list[float]:
        with self.lock:
            return sorted(latency for sent, latency in self.samples if since <= sent < until)


def lock_waits(url: str, stop: threading.Event, seen: dict[str, float], counting: threading.Event) -> None:
    """Sample sessions waiting for a lock every 0.1 s; the longest wait seen while ``counting``
    is set in ``seen``. It samples through the baseline too, so that both windows carry its
    own load."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            for _pid, waited in conn.execute(LOCK_WAITS_SQL).fetchall():
                if counting.is_set():
                    seen["max"] = max(seen.get("max", 0.0), float(waited or 0))
                    seen["samples"] = seen.get("samples", 0) + 1
            stop.wait(0.1)


def server_settings(url: str) -> dict[str, str]:
    """The server settings that shape what the purge costs: its checkpoint interval (seconds)
    and whether autovacuum runs (it vacuums the tables after a large purge, adding its own load
    to the purge window; it is on by default, and should be in production)."""
    import psycopg

    names = ["checkpoint_timeout", "autovacuum", "shared_buffers", "synchronous_commit"]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]).fetchall()
    return dict(rows)


def spread(ingest: Ingest, since: float, until: float, part: float = 20.0) -> dict[str, float]:
    """The p99 of each whole ``part``-second piece of the window: min, median and max (ms)."""
    p99s = []
    start = since
    while start + part <= until:
        p99s.append(percentile(ingest.latencies(start, start + part), 0.99) * 1000)
        start += part
    p99s.sort()
    if not p99s:
        return {}
    return {"parts": len(p99s), "min": p99s[0], "median": percentile(p99s, 0.5), "max": p99s[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--baseline-seconds",
        type=float,
        default=None,
        help="length of the window without purge (default: the server's checkpoint_timeout, at least 60 s)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()

    url, key = demo_database("purge")
    setup_django(url)
    from django.conf import settings
    from django.db import connections

    from notifications.models import DeliveryAttempt, Notification

    details: dict[str, Any] = {
        "rows": args.rows,
        "rate": args.rate,
        "batch_size": settings.OUTBOX_PURGE_BATCH_SIZE,
        "duty_cycle": settings.OUTBOX_PURGE_DUTY_CYCLE,
    }
    config = server_settings(url)
    baseline_seconds = args.baseline_seconds or max(60.0, float(config.get("checkpoint_timeout", 300)))
    details.update(baseline_seconds=baseline_seconds, server=config)
    print(
        "server: " + ", ".join(f"{name} {value}" for name, value in sorted(config.items())),
        flush=True,
    )
    try:
        details["seed_seconds"] = seed(url, args.rows)
        with Central(database=url, workers=2, OUTBOX_SITE_RATE_LIMIT=0, OUTBOX_DISPATCH_TRIGGER="false") as server:
            ingest = Ingest(server.port, key, args.rate, args.clients)
            ingest.start()
            stop_sampling, counting = threading.Event(), threading.Event()
            waits: dict[str, float] = {}
            sampler = threading.Thread(target=lock_waits, args=(url, stop_sampling, waits, counting), daemon=True)
            sampler.start()
            time.sleep(2)  # warm-up: connections, pools
            baseline_from = time.perf_counter()
            print(f"baseline: {baseline_seconds:.0f} s of ingest at {args.rate:g}/s without purge …", flush=True)
            time.sleep(baseline_seconds)
            print("purging while the ingest goes on …", flush=True)
            baseline_to = purge_from = time.perf_counter()
            counting.set()
            purge = manage("purge_notifications", database=url, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = purge.communicate(timeout=3600)
            purge_to = time.perf_counter()
            stop_sampling.set()
            sampler.join()
            ingest.finish()
        if purge.returncode != 0:
            raise RuntimeError(f"purge_notifications failed: {err}")
        baseline = ingest.latencies(baseline_from, baseline_to)
        during = ingest.latencies(purge_from, purge_to)
        purge_seconds = purge_to - purge_from
        left_old = Notification.objects.filter(source_script="OnAlarm").count()
        kept = Notification.objects.filter(pk__in=ingest.ids).count()
        attempts_left = DeliveryAttempt.objects.filter(worker="q:bench:1:seed").count()
        details.update(
            purge_seconds=purge_seconds,
            purge_rows_per_second=args.rows / purge_seconds,
            purge_output=out.strip().splitlines()[-1] if out.strip() else "",
            baseline={
                "n": len(baseline),
                "p50": percentile(baseline, 0.5),
                "p99": percentile(baseline, 0.99),
                "p99_per_20s_ms": spread(ingest, baseline_from, baseline_to),
            },
            during={
                "n": len(during),
                "p50": percentile(during, 0.5),
                "p99": percentile(during, 0.99),
                "max": during[-1] if during else float("nan"),
                "p99_per_20s_ms": spread(ingest, purge_from, purge_to),
            },
            lock_wait_max_seconds=waits.get("max", 0.0),
            lock_wait_samples=waits.get("samples", 0),
            ingest_errors=ingest.errors[:10],
            ingested=len(ingest.ids),
            ingested_kept=kept,
            old_rows_left=left_old,
            old_attempts_left=attempts_left,
        )
    finally:
        connections.close_all()
        if not args.keep:
            drop_postgres_database(url)

    ratio = details["during"]["p99"] / details["baseline"]["p99"]
    print(
        f"purge of {args.rows:,} rows (batches of {details['batch_size']:,}, duty cycle {details['duty_cycle']:g}): "
        f"{details['purge_seconds']:.1f} s ({details['purge_rows_per_second']:,.0f} rows/s); "
        f"ingest p99 {details['baseline']['p99'] * 1000:.1f} ms without, {details['during']['p99'] * 1000:.1f} ms during "
        f"({ratio:.2f}×); longest lock wait seen {details['lock_wait_max_seconds']:.3f} s",
        flush=True,
    )
    for window in ("baseline", "during"):
        parts = details[window]["p99_per_20s_ms"]
        if parts:
            print(
                f"  {window}: p99 of its {parts['parts']} 20-s parts {parts['min']:.1f} … {parts['median']:.1f} … "
                f"{parts['max']:.1f} ms (min … median … max)",
                flush=True,
            )
    checks = [
        check("purge: rows deleted per second", details["purge_rows_per_second"], "rows/s", "(report)", True),
        check("purge: ingest p99 without purge", details["baseline"]["p99"] * 1000, "ms", "(baseline)", True),
        check(
            "purge: ingest p99 during purge", details["during"]["p99"] * 1000, "ms", "≤ 2 × baseline", ratio <= 2, ratio
        ),
        check(
            "purge: longest lock wait",
            details["lock_wait_max_seconds"],
            "s",
            "≤ 1",
            details["lock_wait_max_seconds"] <= 1,
        ),
        check(
            "purge: old rows gone, new rows kept",
            details["ingested_kept"],
            "rows",
            "all",
            details["old_rows_left"] == 0
            and details["old_attempts_left"] == 0
            and details["ingested_kept"] == details["ingested"]
            and not details["ingest_errors"],
        ),
    ]
    write_results("purge", checks, details)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
