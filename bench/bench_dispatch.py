"""Dispatch benchmark on PostgreSQL against an SMTP sink in its own process (bench/sink.py; the
tests' aiosmtpd server with ``--sink aiosmtpd``), in one run:

1. **Raw ceiling**: the same messages sent with bare smtplib (``sendmail``: one command, one
   reply) from ``--concurrency`` threads over persistent connections. Beside it, as a
   reference, the same messages written pipelined (RFC 2920) by a bare client that composes
   them and records nothing: what the sink and this machine can take at all. The dispatcher
   pipelines where the relay advertises PIPELINING (the sink does).
2. **Throughput**: ``--count`` queued notifications delivered by ``--processes`` dispatcher
   processes (``manage.py dispatch --once``) with the same total concurrency, over the delivery
   window (first attempt started → last row delivered, as bench_scaleout measures it; the
   processes start claiming together once all are up: their start-up is not dispatch, and the
   wall time including it is reported beside it);
   every message is verified received exactly once (by X-Notification-Id). Ceiling and
   throughput are measured ``--rounds`` times, alternately, and the ratio is the median of each
   round's throughput over its own ceiling (this machine's speed drifts between runs). Each
   round also reports the CPU (user and system) a message cost: bare smtplib's client, the
   dispatcher processes' (start-up excluded), the sink's and, where the server runs on this
   machine, PostgreSQL's sessions'; from the last three, the throughput the dispatch could
   reach with every core of this machine busy (what ratio this machine allows at all at that
   cost). Then the same for ``--rich-count``
   rich notifications (an HTML alarm table and a 100 KB attachment, composed with the email
   package), beside their own raw ceiling (the same rich messages composed and sent by bare
   smtplib).
3. **Latency**: ingest → delivered at a steady ``--rate`` notifications/s over real HTTP
   (gunicorn) with the real worker (``manage.py qcluster``, triggered dispatch), measured as
   ``delivered_at - created_at`` of every row.
4. **Retry precision**: the same set-up, but the sink defers every message's first try
   (451); each row is retried after the policy's ``--retry-interval``. Measured per row as the
   retry attempt's ``started_at`` − the ``next_attempt_at`` the failure set (read while the
   row waits). Target p99 ≤ 2 s.
5. **Operator Retry → Delivered**: ``--operator-retries`` parked rows, retried one at a time
   over HTTP through the staff API (``POST …/retry/`` with a token), each timed from the
   request until the row reads Delivered. Target p50 ≤ 2 s.
6. **KPI query** on ``--kpi-rows`` seeded rows, 95 % terminal (bench_console's seed), with one
   delivery attempt per attempted row (failed ones classified); and again with the email
   channel open (rows waiting are counted).

Writes bench-results/dispatch.json. Usage: python bench/bench_dispatch.py [--count 10000] …
"""

import argparse
import base64
import json
import os
import smtplib
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    check,
    dispatchers_run,
    fresh_database,
    own_cpu_seconds,
    percentile,
    postgres_cpu_seconds,
    process_cpu_seconds,
    setup_django,
    threads_run,
    write_results,
)
from tests.support.processes import Central, SmtpSink, manage, manage_output, stop

RECIPIENTS = ["op1@bench.invalid", "op2@bench.invalid"]
BODY = "Pump 3 tripped on overcurrent at 10:00; operator attention required."
ATTACHMENT_BYTES = 100 * 1024
RICH_HTML = (
    "<h2>Pump 3 tripped</h2><table border='1' cellpadding='4' style='border-collapse:collapse'>"
    "<tr><th>tag</th><th>value</th><th>limit</th><th>state</th></tr>"
    + "".join(
        f"<tr><td>P3.I{n}</td><td>{40 + n}.5 A</td><td>45 A</td><td style='color:red'>ALARM</td></tr>"
        for n in range(20)
    )
    + "</table><p>Trend chart attached.</p>"
)


SINK_MODULES = {"lean": "bench.sink", "aiosmtpd": "tests.support.smtp"}
SINK = "lean"  # --sink: which SMTP server receives (both count X-Notification-Id)


def start_sink(*, fail_first: bool = False) -> SmtpSink:
    """The chosen SMTP sink (--sink), started in its own process; ``fail_first``: it defers
    every message's first try (bench/sink.py only)."""
    if fail_first:
        return SmtpSink(SINK_MODULES["lean"], "--fail-first")
    return SmtpSink(SINK_MODULES[SINK])


def configure(port: int) -> None:
    from notifications.models import EmailRecipient, NotificationList, SmtpConfiguration

    SmtpConfiguration.objects.update_or_create(
        pk=1,
        defaults={
            "host": "127.0.0.1",
            "port": port,
            "security": "none",
            "from_address": "outbox@bench.invalid",
            "timeout_seconds": 10,
            "max_retries": 10,
            "retry_interval_seconds": 60,
        },
    )
    operators, _ = NotificationList.objects.get_or_create(name="Operators")
    for email in RECIPIENTS:
        EmailRecipient.objects.get_or_create(notification_list=operators, email=email)


def rich_type_data() -> dict[str, Any]:
    """type_data of a rich notification: the HTML alarm table and a 100 KB PNG-typed attachment
    (random bytes, so that nothing on the way compresses it)."""
    chart = base64.b64encode(os.urandom(ATTACHMENT_BYTES)).decode()
    return {
        "html": RICH_HTML,
        "attachments": [{"filename": "trend.png", "content_type": "image/png", "content_base64": chart}],
    }


def build_message(notification_id: str, type_data: dict[str, Any] | None = None) -> bytes:
    """The message the email adapter builds (same composer, same content reading), for the raw
    ceiling."""
    from notifications.adapters.email_compose import email_compose
    from notifications.email_content import email_content_read

    content, errors = email_content_read(type_data or {})
    assert not errors, errors
    return email_compose(
        from_address="outbox@bench.invalid",
        to=[],
        subject="Pump 3 tripped",
        body=BODY,
        message_id=f"<{notification_id}@bench.invalid>",
        notification_id=notification_id,
        date=format_datetime(datetime.now(UTC)),
        content=content,
    )


# The cores the dispatchers, PostgreSQL and the sink share (all on this machine in the benchmark).
CORES = len(os.sched_getaffinity(0))


def cpu_bound_per_second(cpu_per_message: dict[str, float]) -> float | None:
    """What the dispatch could reach if every core of this machine were busy with it, from what
    a message cost the dispatchers, PostgreSQL and the sink (µs): ``CORES`` seconds of CPU per
    second over their sum. None unless all three were measured (PostgreSQL elsewhere, or /proc
    unreadable). Compared with the raw ceiling, it says which ratio this machine allows at all
    at today's cost per message: bare smtplib is one process, bound by one core and no database;
    the dispatch is bound by all the cores it shares with PostgreSQL and the sink."""
    if not {"dispatchers_us", "postgres_us", "sink_us"} <= cpu_per_message.keys():
        return None
    return CORES / (sum(cpu_per_message.values()) / 1e6)


def raw_ceiling(
    count: int, concurrency: int, type_data: dict[str, Any] | None = None, cpu: dict[str, float] | None = None
) -> tuple[float, float]:
    """Bare smtplib, ``concurrency`` threads, persistent connections: messages/s and seconds,
    each message composed as the adapter composes it (from ``type_data``). ``cpu``, if given,
    receives the client's CPU seconds (``"client"``: user and system, its threads together) and,
    where /proc can be read, the sink's (``"sink"``)."""
    sink = start_sink()
    ids = [str(uuid.uuid4()) for _ in range(count)]

    def send(chunk: list[str]) -> None:
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as smtp:
            for notification_id in chunk:
                smtp.sendmail("outbox@bench.invalid", RECIPIENTS, build_message(notification_id, type_data))

    started, sink_started = own_cpu_seconds(), process_cpu_seconds(sink.process.pid)
    seconds = threads_run(send, ids, concurrency)
    if cpu is not None:
        cpu["client"] = own_cpu_seconds() - started
        sink_ended = process_cpu_seconds(sink.process.pid)
        if sink_started is not None and sink_ended is not None:
            cpu["sink"] = sink_ended - sink_started
    received = sink.stop()
    assert sorted(received) == sorted(ids), "the sink did not receive every raw message exactly once"
    return count / seconds, seconds


def raw_pipelined(count: int, concurrency: int) -> float:
    """A bare client that pipelines (MAIL FROM, RCPT TOs and DATA in one write, RFC 2920),
    ``concurrency`` threads, persistent connections, each message composed as the adapter
    composes it and nothing recorded: messages/s."""
    sink = start_sink()
    ids = [str(uuid.uuid4()) for _ in range(count)]
    envelope = "MAIL FROM:<outbox@bench.invalid>\r\n" + "".join(f"RCPT TO:<{r}>\r\n" for r in RECIPIENTS) + "DATA\r\n"

    def send(chunk: list[str]) -> None:
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as smtp:
            smtp.ehlo()
            assert smtp.has_extn("pipelining"), "the sink advertises PIPELINING"
            for notification_id in chunk:
                message = build_message(notification_id)
                smtp.send(envelope)
                replies = [smtp.getreply()[0] for _ in range(len(RECIPIENTS) + 2)]
                assert replies == [250] * (len(RECIPIENTS) + 1) + [354], replies
                smtp.send(message + b"\r\n.\r\n")
                assert smtp.getreply()[0] == 250

    seconds = threads_run(send, ids, concurrency)
    received = sink.stop()
    assert sorted(received) == sorted(ids), "the sink did not receive every pipelined message exactly once"
    return count / seconds


def ingest_backlog(count: int, type_data: dict[str, Any] | None = None) -> list[str]:
    from notifications.ingest import notification_validate, notifications_ingest

    payload: dict[str, Any] = {"list_name": "Operators", "subject": "Pump 3 tripped", "body": BODY}
    if type_data:
        payload["type_data"] = type_data
    chunk = 1000 if not type_data else 50  # rich rows are ~140 KB each
    ids = []
    for start in range(0, count, chunk):
        items = []
        for _ in range(min(chunk, count - start)):
            item, rejection = notification_validate(dict(payload, notification_id=str(uuid.uuid4())), site_id="bench")
            assert item is not None, rejection
            items.append(item)
        notifications_ingest(site_id="bench", inputs=items)
        ids += [str(item.notification_id) for item in items]
    return ids


def dispatch_throughput(
    url: str, count: int, concurrency: int, processes: int, batch_size: int, type_data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``count`` notifications queued, then delivered by ``processes`` dispatcher processes:
    throughput over the delivery window, as bench_scaleout measures it (the first attempt's
    start → the last row's delivery, on the database clock), the processes released together
    once all are up (:func:`~bench.common.dispatchers_run`'s gate), so that their start-up
    (Python, Django, imports: about a second each, paid once by a long-running dispatcher) is
    not counted as dispatch; the wall time from starting them to their exit is kept beside it."""
    from django.db.models import Max, Min

    from notifications.models import DeliveryAttempt, Notification

    Notification.objects.all().delete()  # the window is read over the whole table
    sink = start_sink()
    configure(sink.port)
    ids = ingest_backlog(count, type_data)
    per_process = max(1, concurrency // processes)
    cpu: dict[str, float] = {}
    postgres_before = postgres_cpu_seconds(url)
    sink_before = process_cpu_seconds(sink.process.pid)
    started = time.perf_counter()
    dispatchers_run(url=url, processes=processes, concurrency=per_process, batch_size=batch_size, gate=True, cpu=cpu)
    wall = time.perf_counter() - started
    postgres_after = postgres_cpu_seconds(url)
    sink_after = process_cpu_seconds(sink.process.pid)
    # CPU per message: the dispatchers' without their start-up; PostgreSQL's where it runs here;
    # the sink's (it shares this machine's cores).
    cpu_per_message = {"dispatchers_us": (cpu["total"] - cpu["start_up"]) / count * 1e6}
    if postgres_before is not None and postgres_after is not None:
        cpu_per_message["postgres_us"] = (postgres_after - postgres_before) / count * 1e6
    if sink_before is not None and sink_after is not None:
        cpu_per_message["sink_us"] = (sink_after - sink_before) / count * 1e6
    received = sink.stop()
    counts = Counter(received)
    exactly_once = set(counts) == set(ids) and all(n == 1 for n in counts.values())
    delivered = Notification.objects.filter(status=Notification.Status.DELIVERED).count()
    first = DeliveryAttempt.objects.aggregate(first=Min("started_at"))["first"]
    last = Notification.objects.aggregate(last=Max("delivered_at"))["last"]
    seconds = (last - first).total_seconds()
    return {
        "per_second": count / seconds,
        "seconds": seconds,
        "wall_seconds": wall,
        "wall_per_second": count / wall,
        "exactly_once": exactly_once,
        "delivered_rows": delivered,
        "received": len(received),
        "distinct": len(counts),
        "cpu_per_message": cpu_per_message,
    }


def latency(url: str, rate: float, seconds: float) -> dict[str, Any]:
    """POST at ``rate``/s over HTTP with the worker running; delivered_at - created_at per row."""
    import http.client

    from notifications.models import Notification
    from sites.models import Site
    from sites.services import site_key_issue

    Notification.objects.all().delete()
    sink = start_sink()
    configure(sink.port)
    site, _ = Site.objects.get_or_create(site_id="bench-latency", defaults={"name": "Bench"})
    _, key = site_key_issue(site=site)
    manage_output("setup_schedules", database=url)
    worker = manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids = []
    try:
        with Central(database=url, workers=2, OUTBOX_SITE_RATE_LIMIT=0) as server:
            time.sleep(3)  # let the cluster start its workers
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
            total = int(rate * seconds)
            started = time.perf_counter()
            for n in range(total):
                due = started + n / rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                notification_id = str(uuid.uuid4())
                body = json.dumps(
                    {
                        "notification_id": notification_id,
                        "list_name": "Operators",
                        "subject": "Pump 3 tripped",
                        "body": "Overcurrent.",
                    }
                )
                conn.request("POST", "/api/v1/notifications/", body, headers)
                response = conn.getresponse()
                response.read()
                assert response.status == 201, response.status
                ids.append(notification_id)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).count() == len(ids):
                    break
                time.sleep(0.2)
    finally:
        stop(worker, timeout=30)
        received = sink.stop()
    rows = Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).values_list(
        "created_at", "delivered_at"
    )
    latencies = sorted((d - c).total_seconds() for c, d in rows if d is not None)
    return {
        "sent": len(ids),
        "delivered": len(latencies),
        "received": len(received),
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
        "max": latencies[-1] if latencies else float("nan"),
    }


def post_notification(conn: Any, key: str) -> str:
    """POST one notification over ``conn`` (keep-alive) as a site; its id."""
    notification_id = str(uuid.uuid4())
    body = json.dumps(
        {
            "notification_id": notification_id,
            "list_name": "Operators",
            "subject": "Pump 3 tripped",
            "body": "Overcurrent.",
        }
    )
    conn.request(
        "POST", "/api/v1/notifications/", body, {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 201, response.status
    return notification_id


def retry_precision(url: str, rate: float, seconds: float, interval: int) -> dict[str, Any]:
    """POST at ``rate``/s with the real worker; the sink defers each first try, the policy
    retries after ``interval`` s; per row: retry attempt start − the due time it waited for."""
    import http.client

    from notifications.models import DeliveryAttempt, DeliveryPolicy, Notification
    from sites.models import Site
    from sites.services import site_key_issue

    Notification.objects.all().delete()
    sink = start_sink(fail_first=True)
    configure(sink.port)
    DeliveryPolicy.objects.update_or_create(
        channel="email", defaults={"strategy": "fixed", "interval_seconds": interval, "jitter": 0.0}
    )
    site, _ = Site.objects.get_or_create(site_id="bench-retry", defaults={"name": "Bench"})
    _, key = site_key_issue(site=site)
    worker = manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids: list[str] = []
    due: dict[str, Any] = {}
    try:
        with Central(database=url, workers=2, OUTBOX_SITE_RATE_LIMIT=0) as server:
            time.sleep(3)  # let the cluster start its workers
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            total = int(rate * seconds)
            started = time.perf_counter()
            next_look = 0.0
            while len(ids) < total or len(due) < total:
                if len(ids) < total and time.perf_counter() >= started + len(ids) / rate:
                    ids.append(post_notification(conn, key))
                    continue
                if time.perf_counter() >= next_look:
                    # Read each row's due time while it waits (the retry overwrites it).
                    waiting = Notification.objects.filter(
                        pk__in=ids, status=Notification.Status.RETRYING, next_attempt_at__isnull=False
                    ).values_list("pk", "next_attempt_at")
                    due.update({str(pk): when for pk, when in waiting})
                    next_look = time.perf_counter() + 0.1
                    if time.perf_counter() > started + seconds + 4 * interval + 60:
                        break
                time.sleep(0.005)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).count() == len(ids):
                    break
                time.sleep(0.2)
    finally:
        stop(worker, timeout=30)
        received = sink.stop()
    retried = DeliveryAttempt.objects.filter(notification_id__in=list(due), outcome="success").values_list(
        "notification_id", "started_at"
    )
    late = sorted((started_at - due[str(pk)]).total_seconds() for pk, started_at in retried)
    return {
        "sent": len(ids),
        "due_times_seen": len(due),
        "retried": len(late),
        "received": len(received),
        "early": sum(1 for value in late if value < 0),
        "p50": percentile(late, 0.50),
        "p99": percentile(late, 0.99),
        "max": late[-1] if late else float("nan"),
    }


def operator_retry(url: str, count: int) -> dict[str, Any]:
    """Park ``count`` rows, then retry them one at a time through the staff API over HTTP with
    the real worker running; seconds from each request until the row reads Delivered."""
    import http.client

    from django.contrib.auth.models import Group, User

    from notifications.models import DeliveryPolicy, Notification
    from tests.support.staff import staff_key_header

    Notification.objects.all().delete()
    DeliveryPolicy.objects.filter(channel="email").delete()
    sink = start_sink()
    configure(sink.port)
    ids = ingest_backlog(count)
    Notification.objects.filter(pk__in=ids).update(status=Notification.Status.PARKED, next_attempt_at=None)
    user, _ = User.objects.get_or_create(username="bench-operator", defaults={"is_staff": True})
    user.groups.add(Group.objects.get(name="Operators"))
    authorization = staff_key_header(user, name="bench")
    worker = manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    timings: list[float] = []
    try:
        with Central(database=url, workers=2, OUTBOX_SITE_RATE_LIMIT=0, OUTBOX_DISPATCH_TRIGGER="true") as server:
            time.sleep(3)  # let the cluster start its workers
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            headers = {"Content-Type": "application/json", "Authorization": authorization}
            for notification_id in ids:
                started = time.perf_counter()
                conn.request("POST", f"/api/v1/notifications/{notification_id}/retry/", "{}", headers)
                response = conn.getresponse()
                response.read()
                assert response.status == 200, response.status
                deadline = started + 30
                while time.perf_counter() < deadline:
                    status = Notification.objects.filter(pk=notification_id).values_list("status", flat=True)[0]
                    if status == Notification.Status.DELIVERED:
                        timings.append(time.perf_counter() - started)
                        break
                    time.sleep(0.01)
                time.sleep(0.3)
    finally:
        stop(worker, timeout=30)
        received = sink.stop()
    timings.sort()
    return {
        "retried": len(ids),
        "delivered": len(timings),
        "received": len(received),
        "p50": percentile(timings, 0.50),
        "p99": percentile(timings, 0.99),
        "max": timings[-1] if timings else float("nan"),
    }


# One attempt per attempted row, as dispatch would have left them: failed ones classified.
SEED_ATTEMPTS_SQL = """
INSERT INTO notifications_deliveryattempt (notification_id, started_at, duration_ms, outcome, failure_class,
                                           error, detail, worker)
SELECT notification_id, last_attempt_at, 120,
       CASE status WHEN 'Delivered' THEN 'success' WHEN 'Retrying' THEN 'transient' ELSE 'permanent' END,
       CASE status WHEN 'Retrying' THEN (ARRAY['connection','timeout','throttled','provider_error'])[1 + (retry_count % 4)]
                   WHEN 'Parked' THEN 'provider_error' WHEN 'Discarded' THEN 'recipient_rejected' ELSE '' END,
       CASE WHEN status = 'Delivered' THEN '' ELSE last_error END,
       '{}'::jsonb, 'bench'
FROM notifications_notification WHERE last_attempt_at IS NOT NULL
"""


def kpi_timings(runs: int) -> list[float]:
    from notifications.kpis import kpis_compute

    kpis_compute()  # warm-up
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        kpis_compute()
        timings.append((time.perf_counter() - started) * 1000)
    return sorted(timings)


def kpi_query(url: str, rows: int, runs: int = 15, *, reuse: bool = False) -> dict[str, Any]:
    """The KPI query's median and worst time on ``rows`` seeded rows (bench_console's seed) with
    their attempts; with ``reuse``, on bench_console's already seeded database (its attempts
    are seeded there once)."""
    import psycopg
    from django.db import connection

    from bench.bench_console import seed
    from notifications.models import ChannelHealth

    with psycopg.connect(url, autocommit=True) as conn:
        counts: dict[str, int]
        if reuse:
            counts = dict(conn.execute("SELECT status, count(*) FROM notifications_notification GROUP BY 1").fetchall())
            (attempts,) = conn.execute("SELECT count(*) FROM notifications_deliveryattempt").fetchone() or (0,)
        else:
            counts, _ = seed(url, rows)
            attempts = 0
        if not attempts:
            attempts = conn.execute(SEED_ATTEMPTS_SQL).rowcount
            conn.execute("VACUUM ANALYZE notifications_deliveryattempt")
    connection.close()
    timings = kpi_timings(runs)
    ChannelHealth.objects.create(channel="email", endpoint="bench:25", state="open", last_failure_class="connection")
    open_timings = kpi_timings(runs)
    ChannelHealth.objects.all().delete()
    return {
        "rows": sum(counts.values()),
        "attempts": attempts,
        "terminal_share": 1 - (counts.get("Pending", 0) + counts.get("Retrying", 0)) / max(1, sum(counts.values())),
        "median_ms": timings[len(timings) // 2],
        "max_ms": timings[-1],
        "channel_open_median_ms": open_timings[len(open_timings) // 2],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--rich-count", type=int, default=1_000, help="HTML + 100 KB attachment notifications")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--rounds", type=int, default=3, help="raw ceiling and throughput, alternately, this many times (median)"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--kpi-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--kpi-reuse",
        action="store_true",
        help="measure the KPI query on bench_console's seeded database (bench_console --rows N first) "
        "instead of seeding one; only with every other stage skipped",
    )
    parser.add_argument("--retry-rate", type=float, default=20.0, help="notifications/s of the retry-precision run")
    parser.add_argument("--retry-seconds", type=float, default=20.0)
    parser.add_argument("--retry-interval", type=int, default=3, help="the policy's retry interval, seconds")
    parser.add_argument("--operator-retries", type=int, default=40)
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["raw", "throughput", "rich", "latency", "retry", "operator", "kpi"],
    )
    parser.add_argument(
        "--sink",
        choices=sorted(SINK_MODULES),
        default="lean",
        help="lean: bench/sink.py (default); aiosmtpd: the tests' server, itself capped near 400/s",
    )
    args = parser.parse_args()
    global SINK
    SINK = args.sink

    if args.kpi_reuse:
        from bench.bench_console import seeded_database_url

        if set(args.skip) != {"raw", "throughput", "rich", "latency", "retry", "operator"}:
            parser.error("--kpi-reuse measures the KPI query alone: skip every other stage")
        url = seeded_database_url()
    else:
        url = fresh_database("dispatch")
    setup_django(url)
    checks: list[dict[str, Any]] = []
    details: dict[str, Any] = {"args": vars(args)}

    raw_rate = None
    rounds: list[dict[str, Any]] = []
    for round_number in range(1, args.rounds + 1):
        entry: dict[str, Any] = {}
        if "raw" not in args.skip:
            raw_cpu: dict[str, float] = {}
            entry["raw_per_second"], _ = raw_ceiling(args.count, args.concurrency, cpu=raw_cpu)
            entry["raw_client_cpu_us"] = raw_cpu["client"] / args.count * 1e6
            raw_sink = ""
            if "sink" in raw_cpu:
                entry["raw_sink_cpu_us"] = raw_cpu["sink"] / args.count * 1e6
                raw_sink = f", sink {entry['raw_sink_cpu_us']:.0f} µs"
            print(
                f"round {round_number}: raw smtplib {entry['raw_per_second']:,.0f} messages/s "
                f"(CPU a message: client {entry['raw_client_cpu_us']:.0f} µs{raw_sink})",
                flush=True,
            )
        if "throughput" not in args.skip:
            result = dispatch_throughput(url, args.count, args.concurrency, args.processes, args.batch_size)
            entry.update(throughput=result, per_second=result["per_second"])
            cpu = result["cpu_per_message"]
            postgres = f", PostgreSQL {cpu['postgres_us']:.0f} µs" if "postgres_us" in cpu else ""
            sink = f", sink {cpu['sink_us']:.0f} µs" if "sink_us" in cpu else ""
            print(
                f"round {round_number}: dispatch {result['per_second']:,.0f} notifications/s over "
                f"{result['seconds']:.2f} s (wall with start-up {result['wall_seconds']:.2f} s: "
                f"{result['wall_per_second']:,.0f}/s), exactly once: {result['exactly_once']}; "
                f"CPU a message: dispatchers {cpu['dispatchers_us']:.0f} µs{postgres}{sink}",
                flush=True,
            )
            bound = cpu_bound_per_second(cpu)
            if bound is not None:
                entry["cpu_bound_per_second"] = bound
                print(
                    f"round {round_number}: {sum(cpu.values()):.0f} µs of CPU a message on {CORES} cores: "
                    f"at most {bound:,.0f} notifications/s with every core busy"
                    + (
                        f" ({bound / entry['raw_per_second']:.2f} × this round's ceiling)"
                        if "raw_per_second" in entry
                        else ""
                    ),
                    flush=True,
                )
            if "raw_per_second" in entry:
                entry["ratio"] = result["per_second"] / entry["raw_per_second"]
        rounds.append(entry)
    details["rounds"] = rounds
    if "raw" not in args.skip:
        raw_rate = statistics.median(entry["raw_per_second"] for entry in rounds)
        details["raw_smtplib"] = {"per_second": round(raw_rate, 1), "rounds": args.rounds}
        pipelined = raw_pipelined(args.count, args.concurrency)
        details["raw_pipelined"] = {"per_second": round(pipelined, 1)}
        print(f"raw pipelined client: {pipelined:,.0f} messages/s", flush=True)
    if "throughput" not in args.skip:
        per_second = statistics.median(entry["per_second"] for entry in rounds)
        ratios = [entry["ratio"] for entry in rounds if "ratio" in entry]
        result = {
            "per_second": per_second,
            "exactly_once": all(entry["throughput"]["exactly_once"] for entry in rounds),
            "delivered_rows": min(entry["throughput"]["delivered_rows"] for entry in rounds),
            "distinct": min(entry["throughput"]["distinct"] for entry in rounds),
        }
        details["throughput"] = {**result, "ratio_median": statistics.median(ratios) if ratios else None}
        print(
            f"dispatch: median {per_second:,.0f} notifications/s"
            + (
                f", median ratio to raw smtplib {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
                if ratios
                else ""
            ),
            flush=True,
        )
        checks.append(
            check(
                f"dispatch throughput (median of {args.rounds})",
                result["per_second"],
                "emails/s",
                ">= 1000; >= 0.8 x raw smtplib" if ratios else ">= 1000",
                result["per_second"] >= 1000
                and result["exactly_once"]
                and (not ratios or statistics.median(ratios) >= 0.8),
                ratio=statistics.median(ratios) if ratios else None,
            )
        )
        checks.append(
            check(
                "dispatch: delivered exactly once",
                result["distinct"],
                "of " + str(args.count),
                f"== {args.count}",
                result["exactly_once"] and result["delivered_rows"] == args.count,
            )
        )
        if raw_rate:
            checks.append(
                check(
                    f"raw smtplib ceiling (same sink, same concurrency; median of {args.rounds})",
                    raw_rate,
                    "emails/s",
                    "reference",
                    True,
                )
            )
            bounds = [entry["cpu_bound_per_second"] for entry in rounds if "cpu_bound_per_second" in entry]
            if bounds:
                bound = statistics.median(bounds)
                details["throughput"]["cpu_bound_per_second"] = round(bound, 1)
                checks.append(
                    check(
                        f"dispatch with every core busy ({CORES} cores / CPU a message; median)",
                        bound,
                        "emails/s",
                        "reference",
                        True,
                        ratio=bound / raw_rate,
                    )
                )
            checks.append(
                check(
                    "raw pipelined client (composes, records nothing)",
                    details["raw_pipelined"]["per_second"],
                    "emails/s",
                    "reference",
                    True,
                    ratio=per_second / details["raw_pipelined"]["per_second"],
                )
            )
    if "rich" not in args.skip:
        type_data = rich_type_data()
        rich_raw, rich_raw_seconds = raw_ceiling(args.rich_count, args.concurrency, type_data)
        details["rich_raw_smtplib"] = {"per_second": round(rich_raw, 1), "seconds": round(rich_raw_seconds, 2)}
        print(f"raw smtplib, HTML + 100 KB attachment: {rich_raw:,.0f} messages/s", flush=True)
        result = dispatch_throughput(
            url, args.rich_count, args.concurrency, args.processes, args.batch_size, type_data=type_data
        )
        details["rich_throughput"] = result
        print(
            f"dispatch, HTML + 100 KB attachment: {result['per_second']:,.0f} notifications/s, "
            f"exactly once: {result['exactly_once']}",
            flush=True,
        )
        complete = result["exactly_once"] and result["delivered_rows"] == args.rich_count
        checks.append(
            check(
                "dispatch throughput, HTML + 100 KB attachment",
                result["per_second"],
                "emails/s",
                "reported; exactly once",
                complete,
                ratio=result["per_second"] / rich_raw,
            )
        )
        checks.append(
            check(
                "raw smtplib ceiling, HTML + 100 KB attachment (composed the same way)",
                rich_raw,
                "emails/s",
                "reference",
                True,
            )
        )
    if "latency" not in args.skip:
        result = latency(url, args.rate, args.latency_seconds)
        details["latency"] = result
        print(f"latency at {args.rate}/s: p50 {result['p50']:.3f} s, p99 {result['p99']:.3f} s", flush=True)
        complete = result["delivered"] == result["sent"]
        checks.append(
            check(
                f"ingest→delivered p50 at {args.rate:g}/s",
                result["p50"],
                "s",
                "<= 0.5",
                result["p50"] <= 0.5 and complete,
            )
        )
        checks.append(
            check(
                f"ingest→delivered p99 at {args.rate:g}/s", result["p99"], "s", "<= 2", result["p99"] <= 2 and complete
            )
        )
    if "retry" not in args.skip:
        result = retry_precision(url, args.retry_rate, args.retry_seconds, args.retry_interval)
        details["retry_precision"] = result
        print(f"retry precision: p50 {result['p50']:.3f} s, p99 {result['p99']:.3f} s", flush=True)
        complete = result["retried"] == result["sent"] == result["received"] and result["early"] == 0
        checks.append(check("retry precision p50 (start − next_attempt_at)", result["p50"], "s", "reference", complete))
        checks.append(
            check(
                "retry precision p99 (start − next_attempt_at)",
                result["p99"],
                "s",
                "<= 2",
                result["p99"] <= 2 and complete,
            )
        )
    if "operator" not in args.skip:
        result = operator_retry(url, args.operator_retries)
        details["operator_retry"] = result
        print(f"operator Retry → Delivered: p50 {result['p50']:.3f} s, p99 {result['p99']:.3f} s", flush=True)
        complete = result["delivered"] == result["retried"] == result["received"]
        checks.append(
            check(
                "operator Retry → Delivered p50 (staff API)",
                result["p50"],
                "s",
                "<= 2",
                result["p50"] <= 2 and complete,
            )
        )
    if "kpi" not in args.skip:
        result = kpi_query(url, args.kpi_rows, reuse=args.kpi_reuse)
        details["kpi"] = result
        checks.append(
            check(
                f"KPI query on {result['rows']:,} rows ({result['terminal_share']:.0%} terminal)",
                result["median_ms"],
                "ms",
                "<= 50",
                result["median_ms"] <= 50,
            )
        )
        checks.append(
            check(
                "KPI query, the same with a channel open",
                result["channel_open_median_ms"],
                "ms",
                "reference",
                True,
            )
        )
    details["sink"] = SINK
    # The aiosmtpd run is a reference (that server, not the dispatcher, is the limit): its own file.
    write_results("dispatch" if SINK == "lean" else f"dispatch-{SINK}", checks, details)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
