"""Shared benchmark plumbing: a fresh PostgreSQL database, a gunicorn server, result files.

Every benchmark writes bench-results/<name>.json as
``{"name": …, "checks": [{"figure", "value", "unit", "target", "ratio", "ok"}], "details": {…}}``
so that bench/summary.py can print one table. Targets are ratios against a ceiling measured in
the same run wherever the issue defines one, because these machines are noisy.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
PY = sys.executable
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench"


def check(figure, value, unit, target, ok, ratio=None):
    return {"figure": figure, "value": round(value, 3), "unit": unit, "target": target,
            "ratio": None if ratio is None else round(ratio, 3), "ok": bool(ok)}  # fmt: skip


def write_results(name, checks, details=None):
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"name": name, "checks": checks, "details": details or {}}, indent=2))
    print(f"\n{'figure':48} {'value':>12} {'unit':10} {'target':>16} {'ratio':>7}  ok")
    for c in checks:
        ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}"
        print(f"{c['figure']:48} {c['value']:>12,.2f} {c['unit']:10} {c['target']:>16} {ratio:>7}  {'yes' if c['ok'] else 'NO'}")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def fresh_database(suffix):
    """Drop and create a PostgreSQL database for one benchmark; returns its DATABASE_URL."""
    base = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    parsed = urlparse(base)
    if not parsed.scheme.startswith("postgres"):
        sys.exit("Benchmarks need PostgreSQL: set BENCH_DATABASE_URL=postgres://…")
    name = f"{parsed.path.lstrip('/') or 'outbox_bench'}_{suffix}"
    import psycopg

    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunparse(parsed._replace(path=f"/{name}"))
    manage("migrate", "--noinput", "-v0", database_url=url)
    return url


def demo_database(suffix):
    """A fresh database with the demo configuration; returns ``(DATABASE_URL, demo-site key)``."""
    print("Preparing a fresh PostgreSQL database with the demo configuration …", flush=True)
    url = fresh_database(suffix)
    manage("outbox_config", "import", "demo/config.json", database_url=url, capture=True)
    key = manage("create_site_key", "demo-site", database_url=url, capture=True).strip().splitlines()[-1]
    return url, key


def bench_env(database_url, **extra):
    env = dict(os.environ, DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="outbox_project.settings",
               LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))  # fmt: skip
    env.update({k: str(v) for k, v in extra.items()})
    return env


def manage(*args, database_url, capture=False, **extra):
    result = subprocess.run(
        [PY, str(ROOT / "manage.py"), *args], env=bench_env(database_url, **extra), cwd=ROOT,
        check=True, capture_output=capture, text=True,
    )  # fmt: skip
    return result.stdout if capture else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gunicorn:
    """gunicorn serving the project on a free loopback port, as production would."""

    def __init__(self, database_url, workers=3, **extra_env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [PY, "-m", "gunicorn", "outbox_project.wsgi:application", "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(workers), "--log-level", "warning"],
            env=bench_env(database_url, **extra_env), cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("gunicorn did not become healthy within 30 s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def percentile(sorted_values, fraction):
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]
