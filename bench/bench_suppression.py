"""Suppression overhead on PostgreSQL: ingest over real HTTP (gunicorn) and dispatch
(``manage.py dispatch --once`` processes to the SMTP sink of bench/sink.py), each measured with
suppression **on** — 10 active silences and the list's dedup window on, every notification
carrying a ``dedup_key`` — and **off** (no silence, no window, no key), in alternating rounds.

The silences match none of the traffic and every key is distinct, so the same rows are stored
and delivered either way: what differs is the work suppression adds (reading and matching the
rules, the list's lock and the anchor lookup at ingest; the digest check and the held-row
condition at dispatch). Target: on ≥ 0.9 × off, for both. Every message is verified received
exactly once.

Writes bench-results/suppression.json. Usage: python bench/bench_suppression.py [--seconds 5]
[--clients 4] [--rounds 2] [--processes 2] [--concurrency 8]
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
        payload: dict[str, Any] = {
            "notification_id": str(uuid.uuid4()),
            "list_name": "Operators",
            "subject": "Pump 3 tripped",
            "body": "Pump 3 tripped on overcurrent at 10:00; operator attention required.",
            "source_instance_id": "Pump3",
        }
        if keyed:
            payload["dedup_key"] = f"pump-3-{uuid.uuid4().hex[:12]}"  # distinct: never a duplicate
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


def suppression_set(on: bool) -> None:
    """Suppression on (10 silences matching none of the traffic, the list's dedup window) or off."""
    from django.utils import timezone

    from notifications.models import NotificationList, Silence

    Silence.objects.all().delete()
    NotificationList.objects.filter(name="Operators").update(dedup_window_seconds=3600 if on else 0)
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
    time.sleep(RULES_SETTLE_SECONDS)


def ingest_phase(pool: Any, port: int, key: str, seconds: float, clients: int, keyed: bool) -> dict[str, Any]:
    started = time.perf_counter()
    results = pool.map(client_loop, [(port, key, seconds, keyed)] * clients)
    elapsed = time.perf_counter() - started
    created = sum(result[0] for result in results)
    return {"per_second": created / elapsed, "created": created, "errors": sum(result[1] for result in results)}


def dispatch_phase(url: str, processes: int, concurrency: int) -> dict[str, Any]:
    """Drain every queued row to a fresh sink; delivered per second and whether the sink got
    each row exactly once."""
    from notifications.models import Notification

    queued = list(Notification.objects.filter(status="Pending").values_list("pk", flat=True))
    sink = start_sink()
    configure(sink.port)
    started = time.perf_counter()
    codes = dispatchers_run(url=url, processes=processes, concurrency=concurrency, batch_size=200, gate=True)
    elapsed = time.perf_counter() - started
    received = sink.stop()
    exact = sorted(received) == sorted(str(pk) for pk in queued)
    delivered = Notification.objects.filter(pk__in=queued, status="Delivered").count()
    return {"per_second": delivered / elapsed, "delivered": delivered, "exactly_once": exact, "codes": codes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    url, key = demo_database("suppression")
    setup_django(url)
    rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with (
        Central(database=url, workers=args.workers, OUTBOX_SITE_RATE_LIMIT=1_000_000) as server,
        multiprocessing.Pool(args.clients) as pool,
    ):
        suppression_set(False)
        ingest_phase(pool, server.port, key, 1.0, args.clients, keyed=False)  # warm-up
        dispatch_phase(url, args.processes, args.concurrency)
        for number in range(1, args.rounds + 1):
            for mode in ("off", "on") if number % 2 else ("on", "off"):
                suppression_set(mode == "on")
                ingest = ingest_phase(pool, server.port, key, args.seconds, args.clients, keyed=mode == "on")
                dispatch = dispatch_phase(url, args.processes, args.concurrency)
                rounds[mode].append({"ingest": ingest, "dispatch": dispatch})
                print(
                    f"round {number} {mode:3}: ingest {ingest['per_second']:.0f}/s, "
                    f"dispatch {dispatch['per_second']:.0f}/s",
                    flush=True,
                )

    def median(mode: str, phase: str) -> float:
        return statistics.median(entry[phase]["per_second"] for entry in rounds[mode])

    ingest_ratio = median("on", "ingest") / median("off", "ingest")
    dispatch_ratio = median("on", "dispatch") / median("off", "dispatch")
    errors = sum(entry["ingest"]["errors"] for mode in rounds for entry in rounds[mode])
    exact = all(entry["dispatch"]["exactly_once"] for mode in rounds for entry in rounds[mode])
    checks = [
        check("suppression: ingest, off", median("off", "ingest"), "req/s", "(reference)", True),
        check(
            "suppression: ingest, 10 silences + dedup on",
            median("on", "ingest"),
            "req/s",
            ">= 0.9 x off",
            ingest_ratio >= 0.9,
            ingest_ratio,
        ),
        check("suppression: dispatch, off", median("off", "dispatch"), "msg/s", "(reference)", True),
        check(
            "suppression: dispatch, 10 silences + dedup on",
            median("on", "dispatch"),
            "msg/s",
            ">= 0.9 x off",
            dispatch_ratio >= 0.9,
            dispatch_ratio,
        ),
        check("suppression: failed requests", errors, "count", "== 0", errors == 0),
        check("suppression: every message received once", float(exact), "bool", "== 1", exact),
    ]
    write_results("suppression", checks, {"rounds": rounds, "args": vars(args)})
    return 0 if all(entry["ok"] for entry in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
