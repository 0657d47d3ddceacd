"""Dispatch benchmark on PostgreSQL against an aiosmtpd sink (tests/support/smtp.py, its own
process), in one run:

1. **Raw ceiling**: the same messages sent with bare smtplib from ``--concurrency`` threads over
   persistent connections — what the sink and this machine can take at all.
2. **Throughput**: ``--count`` queued notifications delivered by ``--processes`` dispatcher
   processes (``manage.py dispatch --once``) with the same total concurrency; every message is
   verified received exactly once (by X-Notification-Id).
3. **Latency**: ingest → delivered at a steady ``--rate`` notifications/s over real HTTP
   (gunicorn) with the real worker (``manage.py qcluster``, triggered dispatch), measured as
   ``delivered_at - created_at`` of every row.
4. **KPI query** on ``--kpi-rows`` seeded rows, 95 % terminal (bench_console's seed).

Writes bench-results/dispatch.json. Usage: python bench/bench_dispatch.py [--count 10000] …
"""

import argparse
import json
import os
import signal
import smtplib
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from email.utils import format_datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PY, ROOT, Gunicorn, bench_env, check, fresh_database, free_port, manage, percentile, write_results,
)  # fmt: skip

RECIPIENTS = ["op1@bench.invalid", "op2@bench.invalid"]


SINK_MODULES = {"lean": "bench.sink", "aiosmtpd": "tests.support.smtp"}
SINK = "lean"  # --sink: which SMTP server receives (both count X-Notification-Id)


class Sink:
    """The SMTP sink in its own process (bench/sink.py, or the tests' aiosmtpd server);
    ``stop()`` returns every received X-Notification-Id."""

    def __init__(self):
        self.port = free_port()
        self.ids_file = Path(tempfile.mkstemp(prefix="sink-ids-")[1])
        self.proc = subprocess.Popen(
            [PY, "-m", SINK_MODULES[SINK], "--port", str(self.port), "--ids-file", str(self.ids_file)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        ids = self.ids_file.read_text().split()
        self.ids_file.unlink()
        return ids


def setup_django(url):
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def configure(port):
    from notifications.models import EmailRecipient, NotificationList, SmtpConfiguration

    SmtpConfiguration.objects.update_or_create(pk=1, defaults=dict(
        host="127.0.0.1", port=port, security="none", from_address="outbox@bench.invalid", timeout_seconds=10,
        max_retries=10, retry_interval_seconds=60))  # fmt: skip
    operators, _ = NotificationList.objects.get_or_create(name="Operators")
    for email in RECIPIENTS:
        EmailRecipient.objects.get_or_create(notification_list=operators, email=email)


def build_message(notification_id):
    """The message the email adapter builds (same composer), for the raw ceiling."""
    from notifications.adapters.email import compose_message

    return compose_message(
        from_address="outbox@bench.invalid", to=RECIPIENTS, subject="Pump 3 tripped",
        body="Pump 3 tripped on overcurrent at 10:00; operator attention required.",
        message_id=f"<{notification_id}@bench.invalid>", notification_id=notification_id,
        date=format_datetime(datetime.now(timezone.utc)),
    )  # fmt: skip


def raw_ceiling(count, concurrency):
    """Bare smtplib, ``concurrency`` threads, persistent connections: messages/s."""
    sink = Sink()
    ids = [str(uuid.uuid4()) for _ in range(count)]
    chunks = [ids[i::concurrency] for i in range(concurrency)]

    def send(chunk):
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as smtp:
            for notification_id in chunk:
                smtp.sendmail("outbox@bench.invalid", RECIPIENTS, build_message(notification_id))

    started = time.perf_counter()
    threads = [threading.Thread(target=send, args=(chunk,)) for chunk in chunks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    received = sink.stop()
    assert sorted(received) == sorted(ids), "the sink did not receive every raw message exactly once"
    return count / seconds, seconds


def ingest_backlog(count):
    from notifications.ingest import notification_validate, notifications_ingest

    payload = {"list_name": "Operators", "subject": "Pump 3 tripped",
               "body": "Pump 3 tripped on overcurrent at 10:00; operator attention required."}  # fmt: skip
    ids = []
    for start in range(0, count, 1000):
        items = [notification_validate(dict(payload, notification_id=str(uuid.uuid4())))[0]
                 for _ in range(min(1000, count - start))]  # fmt: skip
        notifications_ingest(site_id="bench", inputs=items)
        ids += [str(item.notification_id) for item in items]
    return ids


def dispatch_throughput(url, count, concurrency, processes, batch_size):
    from notifications.models import Notification

    sink = Sink()
    configure(sink.port)
    ids = ingest_backlog(count)
    per_process = max(1, concurrency // processes)
    started = time.perf_counter()
    workers = [
        subprocess.Popen([PY, str(ROOT / "manage.py"), "dispatch", "--once", "-v0", "--concurrency", str(per_process),
                          "--batch-size", str(batch_size)], env=bench_env(url), cwd=ROOT)
        for _ in range(processes)
    ]  # fmt: skip
    for worker in workers:
        worker.wait()
    seconds = time.perf_counter() - started
    received = sink.stop()
    counts = {}
    for notification_id in received:
        counts[notification_id] = counts.get(notification_id, 0) + 1
    exactly_once = set(counts) == set(ids) and all(n == 1 for n in counts.values())
    delivered = Notification.objects.filter(pk__in=ids, status="Delivered").count()
    return {"per_second": count / seconds, "seconds": seconds, "exactly_once": exactly_once,
            "delivered_rows": delivered, "received": len(received), "distinct": len(counts)}  # fmt: skip


def latency(url, rate, seconds):
    """POST at ``rate``/s over HTTP with the worker running; delivered_at - created_at per row."""
    import http.client

    from notifications.models import Notification
    from sites.models import Site
    from sites.services import site_key_issue

    Notification.objects.all().delete()
    sink = Sink()
    configure(sink.port)
    site, _ = Site.objects.get_or_create(site_id="bench-latency", defaults={"name": "Bench"})
    _, key = site_key_issue(site=site)
    manage("setup_schedules", database_url=url, capture=True)
    worker = subprocess.Popen([PY, str(ROOT / "manage.py"), "qcluster"], env=bench_env(url), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    ids = []
    try:
        with Gunicorn(url, workers=2, OUTBOX_SITE_RATE_LIMIT=0) as server:
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
                body = json.dumps({"notification_id": notification_id, "list_name": "Operators",
                                   "subject": "Pump 3 tripped", "body": "Overcurrent."})  # fmt: skip
                conn.request("POST", "/api/v1/notifications/", body, headers)
                response = conn.getresponse()
                response.read()
                assert response.status == 201, response.status
                ids.append(notification_id)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if Notification.objects.filter(pk__in=ids, status="Delivered").count() == len(ids):
                    break
                time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        received = sink.stop()
    rows = Notification.objects.filter(pk__in=ids, status="Delivered").values_list("created_at", "delivered_at")
    latencies = sorted((d - c).total_seconds() for c, d in rows)
    return {"sent": len(ids), "delivered": len(latencies), "received": len(received),
            "p50": percentile(latencies, 0.50), "p99": percentile(latencies, 0.99),
            "max": latencies[-1] if latencies else float("nan")}  # fmt: skip


def kpi_query(url, rows, runs=15):
    from django.db import connection

    from bench.bench_console import seed
    from notifications.kpis import kpis_compute

    counts, _ = seed(url, rows)
    connection.close()
    kpis_compute()  # warm-up
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        kpis_compute()
        timings.append((time.perf_counter() - started) * 1000)
    timings.sort()
    return {"rows": sum(counts.values()), "terminal_share": 1 - (counts.get("Pending", 0) + counts.get("Retrying", 0))
            / max(1, sum(counts.values())), "median_ms": timings[len(timings) // 2], "max_ms": timings[-1]}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--kpi-rows", type=int, default=1_000_000)
    parser.add_argument("--skip", action="append", default=[], choices=["raw", "throughput", "latency", "kpi"])
    parser.add_argument("--sink", choices=sorted(SINK_MODULES), default="lean",
                        help="lean: bench/sink.py (default); aiosmtpd: the tests' server, itself capped near 400/s")
    args = parser.parse_args()
    global SINK
    SINK = args.sink

    url = fresh_database("dispatch")
    setup_django(url)
    checks, details = [], {"args": vars(args)}

    raw_rate = None
    if "raw" not in args.skip:
        raw_rate, raw_seconds = raw_ceiling(args.count, args.concurrency)
        details["raw_smtplib"] = {"per_second": round(raw_rate, 1), "seconds": round(raw_seconds, 2)}
        print(f"raw smtplib: {raw_rate:,.0f} messages/s", flush=True)
    if "throughput" not in args.skip:
        result = dispatch_throughput(url, args.count, args.concurrency, args.processes, args.batch_size)
        details["throughput"] = result
        print(f"dispatch: {result['per_second']:,.0f} notifications/s, exactly once: {result['exactly_once']}",
              flush=True)  # fmt: skip
        checks.append(check("dispatch throughput", result["per_second"], "emails/s", ">= 1000",
                            result["per_second"] >= 1000 and result["exactly_once"],
                            ratio=result["per_second"] / raw_rate if raw_rate else None))  # fmt: skip
        checks.append(check("dispatch: delivered exactly once", result["distinct"], "of " + str(args.count),
                            f"== {args.count}", result["exactly_once"] and result["delivered_rows"] == args.count))
        if raw_rate:
            checks.append(check("raw smtplib ceiling (same sink, same concurrency)", raw_rate, "emails/s",
                                "reference", True))  # fmt: skip
    if "latency" not in args.skip:
        result = latency(url, args.rate, args.latency_seconds)
        details["latency"] = result
        print(f"latency at {args.rate}/s: p50 {result['p50']:.3f} s, p99 {result['p99']:.3f} s", flush=True)
        complete = result["delivered"] == result["sent"]
        checks.append(check(f"ingest→delivered p50 at {args.rate:g}/s", result["p50"], "s", "<= 0.5",
                            result["p50"] <= 0.5 and complete))  # fmt: skip
        checks.append(check(f"ingest→delivered p99 at {args.rate:g}/s", result["p99"], "s", "<= 2",
                            result["p99"] <= 2 and complete))  # fmt: skip
    if "kpi" not in args.skip:
        result = kpi_query(url, args.kpi_rows)
        details["kpi"] = result
        checks.append(check(f"KPI query on {result['rows']:,} rows ({result['terminal_share']:.0%} terminal)",
                            result["median_ms"], "ms", "<= 50", result["median_ms"] <= 50))  # fmt: skip
    details["sink"] = SINK
    # The aiosmtpd run is a reference (that server, not the dispatcher, is the limit): its own file.
    write_results("dispatch" if SINK == "lean" else f"dispatch-{SINK}", checks, details)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
