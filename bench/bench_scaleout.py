"""Scale-out benchmark on PostgreSQL: dispatch against an SMTP sink that takes 50 ms per message
(bench/sink.py ``--delay-ms 50``, a real relay's pace) with 1, 2 and 4 dispatcher processes
(``manage.py dispatch --once``), each with ``--concurrency`` delivery threads.

A relay's latency, not this machine's CPU, bounds such a fleet: the ideal is
``processes × concurrency / 0.05 s``. Per worker count: a backlog of ``--seconds`` worth of
that ideal is queued, the processes are started and released together once every one is up
(their first claims wait on a table lock until then), and throughput is the number of messages
over the delivery window (first attempt started → last row delivered, from the database:
process start-up is not dispatch, neither one's own nor the others' beside it). Every message must reach the sink exactly once
(by X-Notification-Id) and every row read Delivered.

Targets: each run ≥ 0.85 × its ideal; 2 processes ≥ 1.8 × the throughput of 1.

Then the workers as they are deployed: a backlog of ``--backlog`` (20,000) rows at the same
50 ms relay, drained by 1 and then 2 ``manage.py qcluster`` processes of ``--q-workers`` (2)
task processes each, every one delivering ``--concurrency`` at a time. The clusters are
started, the bench waits until every task process has recorded its start (the worker
heartbeat), and one dispatch task is asked for, as one ingest would: from then on the passes
that find the backlog ask for more, so the other task processes join. (The schedules are set
an hour ahead meanwhile, so that no sweep starts the drain before every cluster is up.)
Throughput is over the delivery window as above; the deliveries of each task process are
counted from the attempts' ``worker`` column. Targets: 2 clusters ≥ 1.8 × the throughput of 1,
and every task process delivers part of the backlog.

Writes bench-results/scaleout.json. Usage: python bench/bench_scaleout.py [--concurrency 16] …
"""

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_dispatch import configure, ingest_backlog
from bench.common import RESULTS, check, dispatchers_run, fresh_database, setup_django, threads_run, write_results
from tests.support.db import drop_postgres_database
from tests.support.processes import SmtpSink, manage, poll, stop

DELAY_SECONDS = 0.05


def raw_ceiling(*, threads: int, seconds: float) -> dict[str, Any]:
    """Bare smtplib from ``threads`` threads of one process over persistent connections to the
    same 50 ms sink, each message composed as the email adapter composes it: what one process
    of this machine reaches at that concurrency with no database and no bookkeeping at all."""
    import smtplib
    import uuid

    from bench.bench_dispatch import RECIPIENTS, build_message

    count = max(200, int(threads / DELAY_SECONDS * seconds))
    sink = SmtpSink("bench.sink", "--delay-ms", str(int(DELAY_SECONDS * 1000)))
    ids = [str(uuid.uuid4()) for _ in range(count)]

    def send(chunk: list[str]) -> None:
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=10) as smtp:
            for notification_id in chunk:
                smtp.sendmail("outbox@bench.invalid", RECIPIENTS, build_message(notification_id))

    elapsed = threads_run(send, ids, threads)
    received = sink.stop()
    assert sorted(received) == sorted(ids), "the sink did not receive every raw message exactly once"
    ideal = threads / DELAY_SECONDS
    print(
        f"raw smtplib, {threads} threads: {count / elapsed:,.0f}/s (ideal {ideal:,.0f}/s, {count / elapsed / ideal:.2f}×)"
    )
    return {"threads": threads, "count": count, "per_second": count / elapsed, "ratio": count / elapsed / ideal}


def run(url: str, *, processes: int, concurrency: int, seconds: float, batch_size: int) -> dict[str, Any]:
    from django.db.models import Max, Min

    from notifications.models import DeliveryAttempt, Notification

    Notification.objects.all().delete()
    ideal = processes * concurrency / DELAY_SECONDS
    count = max(500, int(ideal * seconds))
    sink = SmtpSink("bench.sink", "--delay-ms", str(int(DELAY_SECONDS * 1000)))
    configure(sink.port)
    ids = ingest_backlog(count)
    started = time.perf_counter()
    codes = dispatchers_run(url=url, processes=processes, concurrency=concurrency, batch_size=batch_size, gate=True)
    wall = time.perf_counter() - started
    received = sink.stop()
    counts = Counter(received)
    exactly_once = set(counts) == set(ids) and all(n == 1 for n in counts.values())
    delivered = Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).count()
    window = DeliveryAttempt.objects.filter(notification_id__in=ids).aggregate(first=Min("started_at"))
    last = Notification.objects.filter(pk__in=ids).aggregate(last=Max("delivered_at"))
    span = (last["last"] - window["first"]).total_seconds()
    per_second = count / span
    workers_seen = DeliveryAttempt.objects.filter(notification_id__in=ids).values("worker").distinct().count()
    result = {
        "processes": processes,
        "concurrency": concurrency,
        "count": count,
        "per_second": per_second,
        "ideal_per_second": ideal,
        "ratio": per_second / ideal,
        "window_seconds": span,
        "wall_seconds": wall,
        "wall_per_second": count / wall,
        "exactly_once": exactly_once and delivered == count,
        "delivered_rows": delivered,
        "received": len(received),
        "exit_codes": codes,
        "worker_ids": workers_seen,
    }
    print(
        f"{processes} process(es) × {concurrency}: {count} messages, {per_second:,.0f}/s over {span:.2f} s "
        f"(ideal {ideal:,.0f}/s, {per_second / ideal:.2f}×; wall {wall:.2f} s), "
        f"exactly once: {result['exactly_once']}",
        flush=True,
    )
    return result


def delivery_window(ids: list[str]) -> float:
    """Seconds from the first attempt's start to the last row's delivery (the database clock)."""
    from django.db.models import Max, Min

    from notifications.models import DeliveryAttempt, Notification

    first = DeliveryAttempt.objects.filter(notification_id__in=ids).aggregate(first=Min("started_at"))["first"]
    last = Notification.objects.filter(pk__in=ids).aggregate(last=Max("delivered_at"))["last"]
    return (last - first).total_seconds()


def deliveries_by_process(ids: list[str]) -> Counter[int]:
    """Successful attempts per worker process id (worker ids are ``q:<host>:<pid>:<pass>``)."""
    from notifications.models import DeliveryAttempt

    workers = DeliveryAttempt.objects.filter(notification_id__in=ids, outcome="success").values_list(
        "worker", flat=True
    )
    return Counter(int(worker.split(":")[2]) for worker in workers)


def schedules_postpone() -> None:
    """No sweep or purge during the run: the drain starts with the bench's one request."""
    from django.utils import timezone
    from django_q.models import Schedule

    Schedule.objects.update(next_run=timezone.now() + timedelta(hours=1))


def qclusters_drain(url: str, *, clusters: int, q_workers: int, concurrency: int, count: int) -> dict[str, Any]:
    """``count`` rows drained by ``clusters`` qcluster processes of ``q_workers`` task processes
    each (see the module docstring)."""
    from django_q.models import OrmQ, Task

    from notifications import trigger
    from notifications.models import DispatchRequest, Notification, WorkerProcess

    Notification.objects.all().delete()
    WorkerProcess.objects.all().delete()
    DispatchRequest.objects.all().delete()
    OrmQ.objects.all().delete()
    Task.objects.all().delete()
    schedules_postpone()
    sink = SmtpSink("bench.sink", "--delay-ms", str(int(DELAY_SECONDS * 1000)))
    configure(sink.port)
    ids = ingest_backlog(count)
    env = {"OUTBOX_Q_WORKERS": str(q_workers), "OUTBOX_CONCURRENCY": str(concurrency)}
    logs = [(RESULTS / f"scaleout-qcluster-{clusters}-{n}.log").open("w") for n in range(clusters)]
    processes = [
        manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=log, LOG_LEVEL="INFO", **env) for log in logs
    ]
    try:
        poll(
            lambda: WorkerProcess.objects.count() >= clusters * q_workers,
            timeout=120,
            message="the task processes did not all record their start",
            interval=0.1,
        )
        started = time.perf_counter()
        trigger.dispatch_enqueue()
        poll(
            lambda: Notification.objects.filter(status=Notification.Status.DELIVERED).count() >= count,
            timeout=600,
            message="the backlog was not drained within 10 minutes",
            interval=0.25,
        )
        wall = time.perf_counter() - started
    except BaseException:
        sink.stop()  # no sink process left behind
        raise
    finally:
        for process in processes:
            stop(process, timeout=90)
        for log in logs:
            log.close()
    received = sink.stop()
    counts = Counter(received)
    exactly_once = set(counts) == set(ids) and all(n == 1 for n in counts.values())
    span = delivery_window(ids)
    by_process = deliveries_by_process(ids)
    task_processes = sorted(WorkerProcess.objects.values_list("pid", flat=True))
    ideal = clusters * q_workers * concurrency / DELAY_SECONDS
    result = {
        "clusters": clusters,
        "q_workers": q_workers,
        "concurrency": concurrency,
        "count": count,
        "per_second": count / span,
        "ideal_per_second": ideal,
        "ratio": count / span / ideal,
        "window_seconds": span,
        "wall_seconds": wall,
        "exactly_once": exactly_once,
        "task_processes": task_processes,
        "deliveries_by_process": {str(pid): by_process.get(pid, 0) for pid in task_processes},
        "every_process_delivered": all(by_process.get(pid, 0) > 0 for pid in task_processes),
    }
    print(
        f"{clusters} qcluster(s) × {q_workers} task processes × {concurrency}: {count} messages, "
        f"{result['per_second']:,.0f}/s over {span:.2f} s (ideal {ideal:,.0f}/s, {result['ratio']:.2f}×); "
        f"deliveries per task process {sorted(by_process.values(), reverse=True)}; exactly once: {exactly_once}",
        flush=True,
    )
    return result


def qcluster_checks(drains: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for r in drains:
        processes = r["clusters"] * r["q_workers"]
        checks.append(
            check(
                f"qcluster backlog, {r['clusters']} cluster(s): processes delivering",
                sum(1 for n in r["deliveries_by_process"].values() if n),
                "processes",
                f"all {processes}",
                r["every_process_delivered"] and r["exactly_once"],
            )
        )
        checks.append(
            check(
                f"qcluster backlog {r['count']:,}, {r['clusters']} × {r['q_workers']} × {r['concurrency']}",
                r["per_second"],
                "msg/s",
                "(report)",
                r["exactly_once"],
                r["ratio"],
            )
        )
    by_clusters = {r["clusters"]: r for r in drains}
    if 1 in by_clusters and 2 in by_clusters:
        scaling = by_clusters[2]["per_second"] / by_clusters[1]["per_second"]
        checks.append(check("qcluster backlog: 2 clusters ÷ 1", scaling, "×", "≥ 1.8", scaling >= 1.8, scaling / 2))
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16, help="delivery threads per process (16)")
    parser.add_argument("--processes", default="1,2,4", help="worker counts to run (1,2,4)")
    parser.add_argument("--seconds", type=float, default=6.0, help="backlog size in seconds of the ideal (6)")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=20_000, help="rows of the qcluster backlog (20,000)")
    parser.add_argument("--q-workers", type=int, default=2, help="task processes per qcluster (2)")
    parser.add_argument("--clusters", default="1,2", help="qcluster counts to run ('' to skip) (1,2)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()

    url = fresh_database("scaleout")
    os.environ["OUTBOX_DISPATCH_TRIGGER"] = "false"  # the backlog is queued first; the bench asks once
    setup_django(url)
    try:
        raw = raw_ceiling(threads=args.concurrency, seconds=args.seconds)
        runs = [
            run(url, processes=int(n), concurrency=args.concurrency, seconds=args.seconds, batch_size=args.batch_size)
            for n in args.processes.split(",")
            if n
        ]
        drains = [
            qclusters_drain(
                url, clusters=int(n), q_workers=args.q_workers, concurrency=args.concurrency, count=args.backlog
            )
            for n in args.clusters.split(",")
            if n
        ]
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_postgres_database(url)

    checks = []
    by_count = {r["processes"]: r for r in runs}
    for r in runs:
        n = r["processes"]
        checks.append(
            check(
                f"dispatch, {n} worker(s) × {r['concurrency']}, 50 ms sink",
                r["per_second"],
                "msg/s",
                f"≥ 0.85 × {r['ideal_per_second']:,.0f}",
                r["ratio"] >= 0.85 and r["exactly_once"],
                r["ratio"],
            )
        )
    checks.append(
        check(
            f"raw smtplib, 1 process × {raw['threads']}, 50 ms sink",
            raw["per_second"],
            "msg/s",
            "(machine's own)",
            True,
            raw["ratio"],
        )
    )
    if 1 in by_count:
        of_raw = by_count[1]["per_second"] / raw["per_second"]
        checks.append(check("dispatch, 1 worker ÷ raw smtplib", of_raw, "×", "(report)", True, of_raw))
    if 1 in by_count and 2 in by_count:
        scaling = by_count[2]["per_second"] / by_count[1]["per_second"]
        checks.append(check("scaling 1 → 2 workers", scaling, "×", "≥ 1.8", scaling >= 1.8, scaling / 2))
    if 1 in by_count and 4 in by_count:
        scaling = by_count[4]["per_second"] / by_count[1]["per_second"]
        checks.append(check("scaling 1 → 4 workers", scaling, "×", "(report)", True, scaling / 4))
    checks += qcluster_checks(drains)
    checks.append(
        check(
            "scale-out: every message exactly once",
            sum(r["count"] for r in runs + drains),
            "msgs",
            "all",
            all(r["exactly_once"] for r in runs + drains),
        )
    )
    details = {"runs": runs, "qcluster_drains": drains, "raw": raw, "sink_delay_seconds": DELAY_SECONDS}
    write_results("scaleout", checks, details)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
