"""Suppression overhead on PostgreSQL, with suppression **on** — 10 active silences and the
list's dedup window on, every notification carrying a ``dedup_key`` — and **off** (no silence,
no window, no key), in alternating rounds:

- **ingest**: single notifications through the ingest function (validation and
  ``notifications_ingest``, one call each, as one API request makes it), in this process, in
  short runs (``--chunk``) with suppression off, on, and with the silences only, taken in turn
  (``--pairs`` times, the order rotating), so that each setting meets the same moments of the
  machine; each figure is the median of its runs, and each ratio the median of the ratios of
  the runs taken together (a run of 50 swings by a third on a quiet machine, from a WAL flush
  or autovacuum landing in it: the medians of many short runs side by side are steadier than
  the best of a few long ones);
- **batch ingest**: batches of ``--batch-size`` notifications, every key different (an agent
  forwarding its backlog), through the ingest function in one call each, off and on taken in
  turn ``--batch-pairs`` times; median and the median of the paired ratios, with a floor of
  0.5 × (a guard against a lookup per key coming back: that gave 0.09);
- **dispatch**: the queued rows delivered by ``manage.py dispatch --once`` processes to the SMTP
  sink of bench/sink.py, over the delivery window (first attempt started → last delivered,
  from the rows' own timestamps, so process start-up does not count); every message is
  verified received exactly once; both settings in each of ``--dispatch-rounds`` rounds of
  ``--count``, the figure the median of the rounds and the ratio the median of each round's;
- **HTTP ingest**: single posts to gunicorn from client processes, both settings in each of
  ``--rounds`` rounds taken in turn, the figure the median of the rounds and the ratio the
  median of each round's (reported, no target: on a shared machine the HTTP figure swings with
  everything else running).

The silences match none of the traffic and every key is distinct, so the same rows are stored
and delivered either way: what differs is the work suppression adds (reading and matching the
rules, and the duplicate decision — the list's lock and the anchor's lookup, in the insert's
statement — at ingest; the digest check and the held-row condition at dispatch). Target: on ≥
0.9 × off, for the single-notification ingest and for dispatch.

Writes bench-results/suppression.json. Usage: python bench/bench_suppression.py [--pairs 100]
[--chunk 50] [--batch-pairs 20] [--batch-size 500] [--count 2000] [--dispatch-rounds 15]
[--rounds 15] [--seconds 3] [--clients 4] [--workers 3] [--processes 2] [--concurrency 8]
"""

import argparse
import http.client
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_dispatch import configure, start_sink
from bench.common import check, demo_database, dispatchers_run, setup_django, write_results
from tests.support.processes import Central

SILENCES = 10
RULES_SETTLE_SECONDS = 1.5  # the web processes read the rules at most once a second


def client_loop(args: tuple[int, str, float, bool]) -> tuple[int, int]:
    """One client process: single posts for ``seconds``; (created, errors)."""
    port, key, seconds, keyed = args
    headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    created = errors = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        payload = payload_new(keyed=keyed)
        try:
            conn.request("POST", "/api/v1/notifications/", json.dumps(payload), headers)
            response = conn.getresponse()
            response.read()
            if response.status == 201:
                created += 1
            else:
                errors += 1
        except (OSError, http.client.HTTPException):
            conn.close()
            errors += 1
    conn.close()
    return created, errors


def suppression_set(on: bool, *, settle: bool = True, dedup: bool = True) -> None:
    """Suppression on (10 silences matching none of the traffic, and unless ``dedup`` is False
    the list's dedup window) or off."""
    from django.utils import timezone

    from notifications.models import NotificationList, Silence

    Silence.objects.all().delete()
    NotificationList.objects.filter(name="Operators").update(dedup_window_seconds=3600 if on and dedup else 0)
    if on:
        now = timezone.now()
        Silence.objects.bulk_create(
            Silence(
                site=f"other-site-{n}",
                source_instance_id=f"Valve{n}",
                starts_at=now - timedelta(minutes=1),
                ends_at=now + timedelta(hours=6),
                reason="benchmark",
                created_by="bench",
            )
            for n in range(SILENCES)
        )
    from notifications.suppression import suppression_rules_forget

    suppression_rules_forget()  # this process (bulk writes send no signal)
    if settle:
        time.sleep(RULES_SETTLE_SECONDS)  # the web processes


def payload_new(*, keyed: bool) -> dict[str, Any]:
    """A new notification to the Operators list; with a ``dedup_key`` of its own if ``keyed``
    (distinct: never a duplicate)."""
    payload: dict[str, Any] = {
        "notification_id": str(uuid.uuid4()),
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "body": "Pump 3 tripped on overcurrent at 10:00; operator attention required.",
        "source_instance_id": "Pump3",
    }
    if keyed:
        payload["dedup_key"] = f"pump-3-{uuid.uuid4().hex[:12]}"
    return payload


def _validated(*, keyed: bool, site_id: str) -> Any:
    from notifications.ingest import notification_validate

    item, rejection = notification_validate(payload_new(keyed=keyed), site_id=site_id)
    assert item is not None, rejection
    return item


def ingest_in_process(count: int, *, keyed: bool, site_id: str = "demo-site") -> float:
    """Ingest ``count`` single notifications, one call each as one request makes it: per second."""
    from notifications.ingest import notifications_ingest

    started = time.perf_counter()
    for _ in range(count):
        outcome = notifications_ingest(site_id=site_id, inputs=[_validated(keyed=keyed, site_id=site_id)])
        assert outcome[0].result == "created"
    return count / (time.perf_counter() - started)


def ingest_batch_in_process(size: int, *, keyed: bool, site_id: str = "demo-site") -> float:
    """Ingest one batch of ``size`` notifications in one call, as one batch request makes it
    (every key distinct: an agent forwarding a backlog of different alarms): per second."""
    from notifications.ingest import notifications_ingest

    started = time.perf_counter()
    items = [_validated(keyed=keyed, site_id=site_id) for _ in range(size)]
    outcomes = notifications_ingest(site_id=site_id, inputs=items)
    assert {outcome.result for outcome in outcomes} == {"created"}
    return size / (time.perf_counter() - started)


def ingest_phase(pool: Any, port: int, key: str, seconds: float, clients: int, keyed: bool) -> dict[str, Any]:
    started = time.perf_counter()
    results = pool.map(client_loop, [(port, key, seconds, keyed)] * clients)
    elapsed = time.perf_counter() - started
    created = sum(result[0] for result in results)
    return {"per_second": created / elapsed, "created": created, "errors": sum(result[1] for result in results)}


def dispatch_phase(url: str, processes: int, concurrency: int) -> dict[str, Any]:
    """Drain every queued row to a fresh sink; delivered per second and whether the sink got
    each row exactly once."""
    from django.db.models import Max, Min

    from notifications.models import DeliveryAttempt, Notification

    queued = list(Notification.objects.filter(status="Pending").values_list("pk", flat=True))
    sink = start_sink()
    configure(sink.port)
    codes = dispatchers_run(url=url, processes=processes, concurrency=concurrency, batch_size=200, gate=True)
    received = sink.stop()
    exact = sorted(received) == sorted(str(pk) for pk in queued)
    delivered = Notification.objects.filter(pk__in=queued, status="Delivered")
    first = DeliveryAttempt.objects.filter(notification__in=queued).aggregate(first=Min("started_at"))["first"]
    last = delivered.aggregate(last=Max("delivered_at"))["last"]
    window = max(1e-3, (last - first).total_seconds()) if first and last else float("inf")
    count = delivered.count()
    return {"per_second": count / window, "delivered": count, "exactly_once": exact, "codes": codes}


def paired_ratio(rates: list[float], references: list[float]) -> float:
    """The median of the ratios of runs taken together (the n-th of ``rates`` to the n-th of
    ``references``)."""
    return statistics.median(rate / reference for rate, reference in zip(rates, references, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100, help="in-process ingest: runs of each setting")
    parser.add_argument("--chunk", type=int, default=50, help="in-process ingest: notifications per run")
    parser.add_argument("--batch-pairs", type=int, default=20, help="in-process batch ingest: batches of each")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--count", type=int, default=2000, help="notifications per dispatch round")
    parser.add_argument("--dispatch-rounds", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=15, help="HTTP ingest: rounds of each setting")
    parser.add_argument("--seconds", type=float, default=3.0, help="HTTP ingest: seconds per phase")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    url, key = demo_database("suppression")
    setup_django(url)
    suppression_set(False, settle=False)
    ingest_in_process(100, keyed=False)  # warm-up
    dispatch_phase(url, args.processes, args.concurrency)
    settings = {"off": (False, True), "on": (True, True), "silences only": (True, False)}
    ingests: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    for number in range(args.pairs):
        for name in names[number % 3 :] + names[: number % 3]:
            on, dedup = settings[name]
            suppression_set(on, settle=False, dedup=dedup)
            ingest_in_process(5, keyed=on and dedup)  # the rules read after the change
            ingests[name].append(ingest_in_process(args.chunk, keyed=on and dedup))
        if (number + 1) % 10 == 0:
            medians = ", ".join(f"{name} {statistics.median(ingests[name]):.0f}/s" for name in names)
            print(f"ingest, {number + 1} runs of each: {medians}", flush=True)
    batches: dict[str, list[float]] = {"off": [], "on": []}
    for number in range(1, args.batch_pairs + 1):
        for mode in ("off", "on") if number % 2 else ("on", "off"):
            suppression_set(mode == "on", settle=False)
            batches[mode].append(ingest_batch_in_process(args.batch_size, keyed=mode == "on"))
        if number % 10 == 0:
            print(
                f"ingest, batches of {args.batch_size}, {number} of each: "
                f"off {statistics.median(batches['off']):.0f}/s, on {statistics.median(batches['on']):.0f}/s",
                flush=True,
            )
    dispatch_phase(url, args.processes, args.concurrency)  # the ingested rows: not measured
    dispatches: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for number in range(1, args.dispatch_rounds + 1):
        for mode in ("off", "on") if number % 2 else ("on", "off"):
            suppression_set(mode == "on", settle=False)
            ingest_in_process(args.count, keyed=mode == "on")
            dispatches[mode].append(dispatch_phase(url, args.processes, args.concurrency))
            print(f"round {number} {mode:3}: dispatch {dispatches[mode][-1]['per_second']:.0f}/s", flush=True)
    http: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with (
        Central(database=url, workers=args.workers, OUTBOX_SITE_RATE_LIMIT=1_000_000) as server,
        multiprocessing.Pool(args.clients) as pool,
    ):
        ingest_phase(pool, server.port, key, 1.0, args.clients, keyed=False)  # warm-up
        for number in range(1, args.rounds + 1):
            for mode in ("off", "on") if number % 2 else ("on", "off"):
                suppression_set(mode == "on")
                http[mode].append(ingest_phase(pool, server.port, key, args.seconds, args.clients, keyed=mode == "on"))
                print(f"round {number} {mode:3}: HTTP ingest {http[mode][-1]['per_second']:.0f}/s", flush=True)

    ingest = {name: statistics.median(values) for name, values in ingests.items()}
    dispatch = {mode: statistics.median(entry["per_second"] for entry in dispatches[mode]) for mode in dispatches}
    ingest_ratio = paired_ratio(ingests["on"], ingests["off"])
    silences_ratio = paired_ratio(ingests["silences only"], ingests["off"])
    batch = {mode: statistics.median(values) for mode, values in batches.items()}
    batch_ratio = paired_ratio(batches["on"], batches["off"])
    dispatch_ratio = paired_ratio(
        [entry["per_second"] for entry in dispatches["on"]], [entry["per_second"] for entry in dispatches["off"]]
    )
    http_off = statistics.median(entry["per_second"] for entry in http["off"])
    http_on = statistics.median(entry["per_second"] for entry in http["on"])
    http_ratio = paired_ratio(
        [entry["per_second"] for entry in http["on"]], [entry["per_second"] for entry in http["off"]]
    )
    errors = sum(entry["errors"] for mode in http for entry in http[mode])
    exact = all(entry["exactly_once"] for mode in dispatches for entry in dispatches[mode])
    checks = [
        check("suppression: ingest, off (median)", ingest["off"], "notif/s", "(reference)", True),
        check(
            "suppression: ingest, 10 silences + dedup on (median)",
            ingest["on"],
            "notif/s",
            ">= 0.9 x off",
            ingest_ratio >= 0.9,
            ingest_ratio,
        ),
        check(
            "suppression: ingest, 10 silences only (median)",
            ingest["silences only"],
            "notif/s",
            "(reported)",
            True,
            silences_ratio,
        ),
        check(f"suppression: ingest, batches of {args.batch_size}, off", batch["off"], "notif/s", "(reference)", True),
        check(
            f"suppression: ingest, batches of {args.batch_size}, on",
            batch["on"],
            "notif/s",
            ">= 0.5 x off",
            batch_ratio >= 0.5,
            batch_ratio,
        ),
        check("suppression: dispatch, off (median)", dispatch["off"], "msg/s", "(reference)", True),
        check(
            "suppression: dispatch, 10 silences + dedup on (median)",
            dispatch["on"],
            "msg/s",
            ">= 0.9 x off",
            dispatch_ratio >= 0.9,
            dispatch_ratio,
        ),
        check("suppression: HTTP ingest, off (median)", http_off, "req/s", "(reported)", True),
        check("suppression: HTTP ingest, on (median)", http_on, "req/s", "(reported)", True, http_ratio),
        check("suppression: failed requests", errors, "count", "== 0", errors == 0),
        check("suppression: every message received once", float(exact), "bool", "== 1", exact),
    ]
    details = {
        "ingest_runs": ingests,
        "batch_runs": batches,
        "dispatch_rounds": dispatches,
        "http": http,
        "args": vars(args),
    }
    write_results("suppression", checks, details)
    return 0 if all(entry["ok"] for entry in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
