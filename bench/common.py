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
import resource
import sys
import threading
import time
from collections.abc import Callable
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


def threads_run(send: Callable[[list[str]], None], ids: list[str], threads: int) -> float:
    """``send`` on ``threads`` threads started together, each given every ``threads``-th of
    ``ids``; the seconds until the last is done."""
    started = time.perf_counter()
    workers = [threading.Thread(target=send, args=(ids[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def dispatchers_run(
    *,
    url: str,
    processes: int,
    concurrency: int,
    batch_size: int,
    gate: bool = False,
    cpu: dict[str, float] | None = None,
) -> list[int]:
    """Run ``processes`` dispatcher processes (``manage.py dispatch --once``, ``concurrency``
    threads each) on the database at ``url`` until each has drained what is due; their exit
    codes.

    With ``gate`` they start delivering together, once every one of them is up: the table of
    notifications is locked (EXCLUSIVE: plain reads pass, claims wait) until each process waits
    at its first claim, so that no process's start-up (Python, Django, imports: about a second
    of CPU each) runs beside the others' deliveries and counts as dispatch.

    ``cpu``, if given, receives the processes' CPU seconds (user and system): ``"total"``, and
    with ``gate`` ``"start_up"``, what they had used when the gate opened."""
    import psycopg

    before = _children_cpu_seconds()
    holder = psycopg.connect(url) if gate else None
    try:
        if holder is not None:
            holder.execute("LOCK TABLE notifications_notification IN EXCLUSIVE MODE")
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
        if holder is not None:
            _wait_for_lock_waiters(url, processes, holder.info.backend_pid)
            if cpu is not None:
                cpu["start_up"] = sum(process_cpu_seconds(worker.pid) or 0.0 for worker in workers)
            holder.commit()  # the lock goes: every process claims at once
    finally:
        if holder is not None:
            holder.close()
    codes = [worker.wait() for worker in workers]
    if cpu is not None:
        cpu["total"] = _children_cpu_seconds() - before
    return codes


def _children_cpu_seconds() -> float:
    """User and system CPU seconds of this process's children that have ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_seconds() -> float:
    """User and system CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int, *, reaped_children: bool = False) -> float | None:
    """User and system CPU seconds of the running process ``pid`` so far (with
    ``reaped_children``: of its children that have ended instead), from Linux's /proc; None
    where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        first = 13 if reaped_children else 11  # cutime, cstime; else utime, stime
        return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def postgres_cpu_seconds(url: str) -> float | None:
    """User and system CPU seconds of the PostgreSQL server's sessions that have ended (its
    postmaster's reaped children), read from Linux's /proc: for a server on this machine
    whose data directory this user can read; None otherwise. Long-lived server processes
    (checkpointer, WAL writer, autovacuum) are not counted."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        postmaster = int(Path(row[0], "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError, psycopg.Error):
        return None
    time.sleep(0.2)  # sessions that just ended (this one too) are reaped by then
    return process_cpu_seconds(postmaster, reaped_children=True)


def _wait_for_lock_waiters(url: str, count: int, holder_pid: int, timeout: float = 120) -> None:
    """Wait until ``count`` sessions wait for the lock held by the session ``holder_pid``."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [holder_pid]
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.02)
    raise RuntimeError(f"the dispatchers did not all reach their first claim within {timeout:g} s")
