"""Site agent benchmark: forward a 10,000-notification backlog from a site buffer to a real
central (gunicorn on PostgreSQL) and verify every row reached the central table; then time a
sweep of the same backlog while central is down (every row counts a failed attempt), on the
SQLite path with ``UPDATE … RETURNING`` and on the pre-3.35 path, so the fallback that sites
with old SQLite take is measured against the one it replaces in the same run.

Then the two figures of sites seen from central: the latency from ``send()`` to the central
row (central's ``created_at`` minus the site's ``site_enqueued_at``, one machine, one clock)
with the agent's ``forward`` service running as a separate process, against the target of 1 s
and with a direct POST of the same notification measured in the same run as the floor; and
the standby drill's RPO (tests/support/standby.py) against the documented one.

Usage: python bench/bench_agent.py [--count 10000] [--latency-count 200]
"""

import argparse
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, demo_database, percentile, write_results
from sites.agent import SiteOutbox
from sites.agent import bench as agent_bench
from sites.agent.buffer import iso_utc, sqlite_has_returning, utc_now
from sites.agent.central import CentralClient
from sites.agent.contract import notification_payload
from sites.agent.standby import RPO_SECONDS
from tests.support.processes import ROOT, Central, child_env, manage_output, poll, stop
from tests.support.standby import PrimarySite, measured_rpo, restore


def counted_failure_seconds(*, count, use_returning):
    """Seconds to count one failed attempt on each of ``count`` buffered rows (what an answer
    outside central's contract does to a backlog; an outage counts nothing), on one SQLite path."""
    with tempfile.TemporaryDirectory(prefix="outbox-agent-bench-") as directory:  # noqa: SIM117 - one per path
        with SiteOutbox(Path(directory) / "buffer.sqlite3", None, None, use_returning=use_returning) as outbox:
            agent_bench.fill(outbox, count=count, list_name="Operators")
            ids = [row.notification_id for row in outbox.buffer.due(now="9999", limit=count)]
            now = iso_utc(utc_now())
            started = time.perf_counter()
            retrying, parked = outbox.buffer.record_transient_failure(
                ids, error="HTTP 302", now=now, next_attempt_at=now, max_retries=50
            )
            elapsed = time.perf_counter() - started
    if (retrying, parked) != (count, 0):
        raise SystemExit(f"counted {retrying} retrying and {parked} parked rows, expected {count} and 0")
    return elapsed


def send_to_row_latencies(*, url: str, central_url: str, key: str, count: int) -> list[float]:
    """Seconds from each ``send()`` to its central row, with the forward service (default 10 s
    sweep) running in its own process; one send every 50 ms."""
    import psycopg

    with tempfile.TemporaryDirectory(prefix="outbox-agent-latency-") as directory:
        db = Path(directory) / "buffer.sqlite3"
        env = child_env(database=url, OUTBOX_AGENT_DB=db, OUTBOX_CENTRAL_URL=central_url, OUTBOX_SITE_KEY=key)
        with SiteOutbox(db, None, None) as outbox:
            outbox.stats()  # the buffer exists before the service starts
            service = subprocess.Popen(
                [sys.executable, "-m", "sites.agent", "forward", "--quiet"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                poll(lambda: Path(f"{db}-forwarder").exists(), timeout=30, message="the forward service did not start")
                notifier = outbox.notify("Operators")
                ids = []
                for n in range(count):
                    ids.append(notifier.send(f"Latency probe {n}", "How long from send() to central's row?"))
                    time.sleep(0.05)  # the send rate, not a wait for an event
                with psycopg.connect(url) as connection:

                    def all_at_central() -> bool:
                        row = connection.execute(
                            "SELECT count(*) FROM notifications_notification WHERE notification_id = ANY(%s)",
                            ([uuid.UUID(i) for i in ids],),
                        ).fetchone()
                        return row is not None and row[0] == count

                    poll(all_at_central, timeout=120, interval=0.2, message="not every probe reached central")
                    rows = connection.execute(
                        "SELECT EXTRACT(EPOCH FROM created_at - site_enqueued_at) FROM notifications_notification"
                        " WHERE notification_id = ANY(%s)",
                        ([uuid.UUID(i) for i in ids],),
                    ).fetchall()
            finally:
                stop(service)
    return sorted(float(seconds) for (seconds,) in rows)


def direct_post_latencies(*, central_url: str, key: str, count: int) -> list[float]:
    """The floor: the same notification POSTed straight to central, round trip in seconds."""
    latencies = []
    with CentralClient(central_url, key, timeout=30) as client:
        for n in range(count):
            _, text = notification_payload(
                list_name="Operators",
                subject=f"Direct probe {n}",
                body="How long is one POST?",
                source_instance_id=None,
                source_script=None,
                type="email",
                type_data=None,
                site_id=None,
                enqueued_at=iso_utc(utc_now()),
            )
            started = time.perf_counter()
            response = client.post_notification(text)
            latencies.append(time.perf_counter() - started)
            if response.status != 201:
                raise SystemExit(f"direct POST answered {response.describe()}")
    return sorted(latencies)


def standby_rpo(*, key: str) -> tuple[float, int, int]:
    """The standby drill with central down: ``(measured RPO s, acknowledged, restored)``."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{placeholder.getsockname()[1]}"
    directory = Path(tempfile.mkdtemp(prefix="outbox-standby-bench-"))
    try:
        primary = PrimarySite(directory / "primary", directory / "replica", central_url=dead, key=key).start()
        poll(lambda: len(primary.acknowledged()) >= 200, timeout=120, message="the primary did not send")
        died = primary.die()
        acks = primary.acknowledged()
        restored_db = directory / "standby" / "buffer.sqlite3"
        restore(restored_db, directory / "replica")
        with SiteOutbox(restored_db, None, None) as standby:
            kept = {row.notification_id for row in standby.buffer.due(now="9999", limit=1_000_000)}
        return measured_rpo(acks, died=died, kept=kept), len(acks), len(kept)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--latency-count", type=int, default=200)
    args = parser.parse_args()

    url, key = demo_database("agent")
    with Central(database=url, workers=2, OUTBOX_SITE_RATE_LIMIT=1_000_000) as server:
        report = agent_bench.run(
            central_url=server.url,
            key=key,
            count=args.count,
            batch_size=500,
            list_name="Operators",
            timeout=30,
            target_seconds=10.0,
        )
        latencies = send_to_row_latencies(url=url, central_url=server.url, key=key, count=args.latency_count)
        floor = direct_post_latencies(central_url=server.url, key=key, count=args.latency_count)
    latency_p50, latency_p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    floor_p50 = percentile(floor, 0.5)
    print(
        f"send → central row over {len(latencies)}: p50 {latency_p50 * 1000:.1f} ms, p99 {latency_p99 * 1000:.1f} ms; "
        f"direct POST p50 {floor_p50 * 1000:.1f} ms"
    )
    rpo, acknowledged, restored = standby_rpo(key=key)
    print(f"standby drill: {acknowledged} acknowledged, {restored} restored, measured RPO {rpo} s")
    stored = int(
        manage_output(
            "shell",
            "-v",
            "0",
            "-c",
            "from notifications.models import Notification; "
            "print(Notification.objects.filter(subject__startswith='Bench notification').count())",
            database=url,
        ).strip()
    )
    print(f"forwarded {report['forwarded']} in {report['elapsed_seconds']} s; central holds {stored} rows")
    # Best of three, alternating, so a busy moment does not decide.
    logging.getLogger("sites.agent").setLevel(logging.ERROR)
    fallbacks, returnings = [], []
    for _ in range(3):
        fallbacks.append(counted_failure_seconds(count=args.count, use_returning=False))
        if sqlite_has_returning():
            returnings.append(counted_failure_seconds(count=args.count, use_returning=True))
    fallback = min(fallbacks)
    returning = min(returnings) if returnings else None
    print(f"counted failure over {args.count:,}: pre-3.35 path {fallback:.3f} s, RETURNING path {returning} s")
    checks = [
        check(
            f"agent: forward {args.count:,} backlog",
            report["elapsed_seconds"],
            "s",
            "< 10 s",
            report["elapsed_seconds"] < 10,
            10 / max(report["elapsed_seconds"], 1e-9),
        ),
        check("agent: rows at central / rows sent", stored / args.count, "ratio", "== 1.0", stored == args.count),
        check("agent: left in site buffer", report["left_in_buffer"], "rows", "== 0", report["left_in_buffer"] == 0),
        # Target from the issue (1 s); ratio against a direct POST of the same notification (floor).
        check(
            "agent: send → central row p50",
            latency_p50 * 1000,
            "ms",
            "<= 1000 ms",
            latency_p50 <= 1.0,
            floor_p50 / max(latency_p50, 1e-9),
        ),
        check("agent: send → central row p99", latency_p99 * 1000, "ms", "<= 1000 ms", latency_p99 <= 1.0),
        check("agent: direct POST p50 (floor)", floor_p50 * 1000, "ms", "reference", True),
        check("agent: standby RPO (measured)", rpo, "s", f"<= {RPO_SECONDS:g} s", rpo <= RPO_SECONDS),
        # Ceiling: the RETURNING path measured in this run; the fallback may cost at most 2x it.
        check(
            f"agent: counted failure over {args.count:,}, pre-3.35 SQLite path",
            fallback,
            "s",
            "< 2x RETURNING" if returning else "< 10 s",
            fallback < (2 * returning if returning else 10),
            (returning / fallback) if returning else None,
        ),
    ]
    write_results(
        "agent",
        checks,
        {
            **report,
            "counted_failure_seconds": {"fallback": fallback, "returning": returning},
            "send_to_row_seconds": {"p50": latency_p50, "p99": latency_p99, "count": len(latencies)},
            "direct_post_seconds": {"p50": floor_p50, "p99": percentile(floor, 0.99)},
            "standby": {"rpo_seconds": rpo, "acknowledged": acknowledged, "restored": restored},
        },
    )
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
