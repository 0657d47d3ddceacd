"""Benchmark: how fast does the agent drain a backlog into central?

    python -m sites.agent.bench --central-url http://127.0.0.1:8000 --key KEY [--count 10000] [--json]

Fills a temporary buffer with ``--count`` notifications (one transaction; filling is not timed),
then calls ``forward_once`` until the buffer is empty and reports elapsed time and throughput.
Goal: a 10,000-notification backlog forwarded in under 10 s. The notifications really are
ingested by the central you point it at (list ``--list``, default ``Operators``), so use a
benchmark or test central, not production.

Exit status: 0 everything was forwarded (and, with ``--strict``, within the target);
1 something was left in the buffer or the target was missed under ``--strict``;
2 configuration error; 3 central rejected the key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sites.agent.buffer import iso_utc, utc_now
from sites.agent.contract import notification_payload
from sites.agent.forwarder import CredentialRejected
from sites.agent.outbox import SiteOutbox

TARGET_SECONDS = 10.0


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(prog="python -m sites.agent.bench", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--central-url", default=os.environ.get("OUTBOX_CENTRAL_URL"), help="central's base URL ($OUTBOX_CENTRAL_URL)"
    )
    parser.add_argument("--key", default=os.environ.get("OUTBOX_SITE_KEY"), help="site API key ($OUTBOX_SITE_KEY)")
    parser.add_argument("--count", type=int, default=10_000, help="backlog size (10000)")
    parser.add_argument("--batch-size", type=int, default=500, help="notifications per batch request (500)")
    parser.add_argument("--list", dest="list_name", default="Operators", help="notification list (Operators)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for central per request (30)")
    parser.add_argument("--target-seconds", type=float, default=TARGET_SECONDS, help="goal for the whole backlog")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def fill(outbox: SiteOutbox, *, count: int, list_name: str) -> None:
    """Put ``count`` notifications in the buffer in one transaction."""
    rows = []
    for n in range(count):
        now = iso_utc(utc_now())
        notification_id, text = notification_payload(
            list_name=list_name,
            subject=f"Bench notification {n}",
            body=f"Backlog item {n} of {count}.",
            source_instance_id=f"Bench{n % 100}",
            source_script="bench",
            type="email",
            type_data={},
            site_id=outbox.site_id,
            enqueued_at=now,
        )
        rows.append((notification_id, text, now))
    outbox.buffer.insert_many(rows)


def run(
    *,
    central_url: str,
    key: str,
    count: int,
    batch_size: int,
    list_name: str,
    timeout: float,
    target_seconds: float,
) -> dict[str, Any]:
    """Fill, drain, measure. Returns the result dict (raises CredentialRejected on 401/403)."""
    with tempfile.TemporaryDirectory(prefix="outbox-agent-bench-") as directory:  # noqa: SIM117 - Python 3.8 has no parenthesised with
        with SiteOutbox(
            Path(directory) / "buffer.sqlite3",
            central_url,
            key,
            batch_size=batch_size,
            timeout=timeout,
            retry_interval=0,
        ) as outbox:
            fill(outbox, count=count, list_name=list_name)
            totals = {"forwarded": 0, "parked": 0, "requests": 0, "sweeps": 0}
            started = time.perf_counter()
            while outbox.stats()["buffered"]:
                result = outbox.forward_once()
                totals["sweeps"] += 1
                for name in ("forwarded", "parked", "requests"):
                    totals[name] += getattr(result, name)
                if result.forwarded == 0 and result.parked == 0:
                    break  # central is failing; the leftovers are reported
            elapsed = time.perf_counter() - started
            left = outbox.stats()["buffered"]
    return {
        "benchmark": "agent-forward",
        "count": count,
        "batch_size": batch_size,
        **totals,
        "left_in_buffer": left,
        "elapsed_seconds": round(elapsed, 3),
        "per_second": round(totals["forwarded"] / elapsed, 1) if elapsed > 0 else None,
        "target_seconds": target_seconds,
        "met_target": left == 0 and totals["parked"] == 0 and elapsed < target_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    args = build_parser().parse_args(argv)
    for value, flag, variable in (
        (args.central_url, "--central-url", "OUTBOX_CENTRAL_URL"),
        (args.key, "--key", "OUTBOX_SITE_KEY"),
    ):
        if not value:
            print(f"error: pass {flag} or set {variable}", file=sys.stderr)
            return 2
    if args.count < 1 or args.batch_size < 1:
        print("error: --count and --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        report = run(
            central_url=args.central_url,
            key=args.key,
            count=args.count,
            batch_size=args.batch_size,
            list_name=args.list_name,
            timeout=args.timeout,
            target_seconds=args.target_seconds,
        )
    except CredentialRejected as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(report))
    else:
        verdict = "met" if report["met_target"] else "MISSED"
        print(
            f"agent forward: {report['forwarded']}/{report['count']} notifications "
            f"in {report['elapsed_seconds']:.2f} s "
            f"({report['per_second']}/s, {report['requests']} requests, batch {report['batch_size']}); "
            f"parked {report['parked']}, left {report['left_in_buffer']}; "
            f"target < {report['target_seconds']:.0f} s {verdict}"
        )
    if report["left_in_buffer"] or (args.strict and not report["met_target"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
