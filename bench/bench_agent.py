"""Site agent benchmark: forward a 10,000-notification backlog from a site buffer to a real
central (gunicorn on PostgreSQL) and verify every row reached the central table.

Usage: python bench/bench_agent.py [--count 10000]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Gunicorn, check, demo_database, manage, write_results  # noqa: E402
from sites.agent import bench as agent_bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    args = parser.parse_args()

    url, key = demo_database("agent")
    with Gunicorn(url, workers=2, OUTBOX_SITE_RATE_LIMIT="1000000") as server:
        report = agent_bench.run(
            central_url=server.url, key=key, count=args.count, batch_size=500,
            list_name="Operators", timeout=30, target_seconds=10.0,
        )  # fmt: skip
    stored = int(manage("shell", "-v", "0", "-c",
                        "from notifications.models import Notification; print(Notification.objects.count())",
                        database_url=url, capture=True).strip())  # fmt: skip
    print(f"forwarded {report['forwarded']} in {report['elapsed_seconds']} s; central holds {stored} rows")
    checks = [
        check(f"agent: forward {args.count:,} backlog", report["elapsed_seconds"], "s", "< 10 s",
              report["elapsed_seconds"] < 10, 10 / max(report["elapsed_seconds"], 1e-9)),
        check("agent: rows at central / rows sent", stored / args.count, "ratio", "== 1.0", stored == args.count),
        check("agent: left in site buffer", report["left_in_buffer"], "rows", "== 0", report["left_in_buffer"] == 0),
    ]  # fmt: skip
    write_results("agent", checks, report)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
