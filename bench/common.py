"""Shared benchmark plumbing: a fresh PostgreSQL database and result files. Processes (gunicorn,
manage.py commands, SMTP sinks) come from tests/support/processes.py, as for the tests and the
chaos suite.

Every benchmark writes bench-results/<name>.json as
``{"name": …, "checks": [{"figure", "value", "unit", "target", "ratio", "ok"}], "details": {…}}``
so that bench/summary.py can print one table. Targets are ratios against a ceiling measured in
the same run wherever the issue defines one, because these machines are noisy.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.support.db import fresh_postgres_database
from tests.support.processes import ROOT, manage, manage_output

RESULTS = ROOT / "bench-results"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench"


def check(figure: str, value: float, unit: str, target: str, ok: bool, ratio: float | None = None) -> dict[str, Any]:
    """One row of a benchmark's result table."""
    return {
        "figure": figure,
        "value": round(value, 3),
        "unit": unit,
        "target": target,
        "ratio": None if ratio is None else round(ratio, 3),
        "ok": bool(ok),
    }


def write_results(name: str, checks: list[dict[str, Any]], details: dict[str, Any] | None = None) -> Path:
    """Write bench-results/<name>.json, print the table; returns the file's path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"name": name, "checks": checks, "details": details or {}}, indent=2))
    print(f"\n{'figure':48} {'value':>12} {'unit':10} {'target':>16} {'ratio':>7}  ok")
    for c in checks:
        ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}"
        print(
            f"{c['figure']:48} {c['value']:>12,.2f} {c['unit']:10} {c['target']:>16} {ratio:>7}  {'yes' if c['ok'] else 'NO'}"
        )
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def bench_database_url() -> str:
    """BENCH_DATABASE_URL, or the default; exits with a message unless it is PostgreSQL."""
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    if not url.startswith("postgres"):
        sys.exit("Benchmarks need PostgreSQL: set BENCH_DATABASE_URL=postgres://…")
    return url


def fresh_database(suffix: str) -> str:
    """A freshly created and migrated PostgreSQL database for one benchmark; its DATABASE_URL."""
    return fresh_postgres_database(bench_database_url(), suffix)


def demo_database(suffix: str) -> tuple[str, str]:
    """A fresh database with the demo configuration; returns ``(DATABASE_URL, demo-site key)``."""
    print("Preparing a fresh PostgreSQL database with the demo configuration …", flush=True)
    url = fresh_database(suffix)
    manage_output("outbox_config", "import", "demo/config.json", database=url)
    key = manage_output("create_site_key", "demo-site", database=url).strip().splitlines()[-1]
    return url, key


def setup_django(url: str) -> None:
    """Set Django up in this process against the database at ``url``."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The value at ``fraction`` (0…1) of an ascending list; NaN for an empty one."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def dispatchers_run(*, url: str, processes: int, concurrency: int, batch_size: int) -> list[int]:
    """Run ``processes`` dispatcher processes (``manage.py dispatch --once``, ``concurrency``
    threads each) on the database at ``url`` until each has drained what is due; their exit
    codes."""
    workers = [
        manage(
            "dispatch",
            "--once",
            "-v0",
            "--concurrency",
            str(concurrency),
            "--batch-size",
            str(batch_size),
            database=url,
            stdout=None,
            stderr=None,
        )
        for _ in range(processes)
    ]
    return [worker.wait() for worker in workers]
