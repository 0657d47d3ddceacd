"""Ingest benchmark over real HTTP against gunicorn on PostgreSQL.

Measures single-post throughput and p50/p99 latency, and batch throughput, beside a raw
ceiling measured in the same run: the same row inserted by a bare Django view with no auth
and no validation (notifications.views.bench_raw_insert). Phases alternate raw/single so
that machine noise hits both alike; the best round of each is compared.

Usage: python bench/bench_ingest.py [--seconds 5] [--clients 4] [--rounds 2] [--worker-class sync]
"""

import argparse
import http.client
import json
import multiprocessing
import sys
import time
import uuid
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, demo_database, percentile, write_results
from tests.support.processes import Central


def payload() -> dict[str, Any]:
    """One notification; bodies are built from a serialized template so the client spends
    its CPU on sending, not on encoding."""
    return {
        "notification_id": str(uuid.uuid4()),
        "type": "email",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "body": "Pump 3 tripped on overcurrent at 10:00; operator attention required.",
        "type_data": {},
        "source_instance_id": "Pump3",
        "source_script": "OnTrip",
        "site_enqueued_at": "2026-11-21T10:00:00Z",
    }


def client_loop(args: tuple[int, str, str, float, int]) -> tuple[int, list[float], int]:
    """One client process: POST for `seconds`; returns (count, latencies, errors)."""
    port, path, key, seconds, batch = args
    headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies, count, errors = [], 0, 0
    deadline = time.perf_counter() + seconds
    template = json.dumps(dict(payload(), notification_id="@ID@"))
    head, tail = template.split("@ID@")
    while time.perf_counter() < deadline:
        if batch:
            body = '{"notifications": [' + ",".join(head + str(uuid.uuid4()) + tail for _ in range(batch)) + "]}"
        else:
            body = head + str(uuid.uuid4()) + tail
        started = time.perf_counter()
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            response.read()
            ok = response.status in (200, 201)
        except (OSError, http.client.HTTPException):
            conn.close()
            ok = False
        latencies.append(time.perf_counter() - started)
        if ok:
            count += batch or 1
        else:
            errors += 1
    conn.close()
    return count, latencies, errors


def run_phase(
    pool: Pool, port: int, path: str, key: str, seconds: float, clients: int, batch: int = 0
) -> dict[str, Any]:
    started = time.perf_counter()
    results = pool.map(client_loop, [(port, path, key, seconds, batch)] * clients)
    elapsed = time.perf_counter() - started
    count = sum(r[0] for r in results)
    latencies = sorted(lat for r in results for lat in r[1])
    errors = sum(r[2] for r in results)
    return {
        "per_second": count / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "requests": len(latencies),
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--worker-class", help="compare another gunicorn worker class (e.g. sync) with gunicorn.conf.py's default"
    )
    args = parser.parse_args()
    options = []
    if args.worker_class:
        options += ["--worker-class", args.worker_class]
        if args.worker_class != "asgi":
            options.append("outbox_project.wsgi:application")  # the WSGI workers need the WSGI entry point

    url, key = demo_database("ingest")

    raw_rounds, single_rounds, batch_rounds = [], [], []
    with (
        Central(
            database=url,
            workers=args.workers,
            options=options,
            OUTBOX_BENCH_RAW_VIEW="true",
            OUTBOX_SITE_RATE_LIMIT=1_000_000,
        ) as server,
        multiprocessing.Pool(args.clients) as pool,
    ):
        run_phase(pool, server.port, "/bench/raw-insert/", key, 1.0, args.clients)  # warm-up
        run_phase(pool, server.port, "/api/v1/notifications/", key, 1.0, args.clients)
        for round_number in range(1, args.rounds + 1):
            raw = run_phase(pool, server.port, "/bench/raw-insert/", key, args.seconds, args.clients)
            single = run_phase(pool, server.port, "/api/v1/notifications/", key, args.seconds, args.clients)
            raw_rounds.append(raw)
            single_rounds.append(single)
            print(
                f"round {round_number}: raw {raw['per_second']:.0f} req/s, "
                f"single {single['per_second']:.0f} req/s (p50 {single['p50_ms']:.1f} ms, "
                f"p99 {single['p99_ms']:.1f} ms)",
                flush=True,
            )
        for round_number in range(1, args.rounds + 1):
            batch = run_phase(
                pool,
                server.port,
                "/api/v1/notifications/batch/",
                key,
                args.seconds,
                max(2, args.clients // 2),
                batch=args.batch_size,
            )
            batch_rounds.append(batch)
            print(
                f"round {round_number}: batch {batch['per_second']:.0f} notifications/s "
                f"(p50 {batch['p50_ms']:.0f} ms per batch of {args.batch_size})",
                flush=True,
            )

    raw = max(raw_rounds, key=lambda r: r["per_second"])
    single = max(single_rounds, key=lambda r: r["per_second"])
    batch = max(batch_rounds, key=lambda r: r["per_second"])
    errors = sum(r["errors"] for r in raw_rounds + single_rounds + batch_rounds)
    ratio = single["per_second"] / raw["per_second"]
    checks = [
        check("ingest: raw insert ceiling", raw["per_second"], "req/s", "(ceiling)", True),
        check("ingest: single post throughput", single["per_second"], "req/s", ">= 0.8 x ceiling", ratio >= 0.8, ratio),
        check("ingest: single post p50 latency", single["p50_ms"], "ms", "(reported)", True),
        check("ingest: single post p99 latency", single["p99_ms"], "ms", "(reported)", True),
        check(
            "ingest: batch throughput",
            batch["per_second"],
            "notif/s",
            ">= 10000",
            batch["per_second"] >= 10_000,
            batch["per_second"] / 10_000,
        ),
        check("ingest: failed requests", errors, "count", "== 0", errors == 0),
    ]
    write_results(
        "ingest",
        checks,
        {
            "raw": raw_rounds,
            "single": single_rounds,
            "batch": batch_rounds,
            "clients": args.clients,
            "workers": args.workers,
            "worker_class": args.worker_class or "gunicorn.conf.py",
        },
    )
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
