"""This dispatcher beside a well-known peer: django-post_office and Outbox deliver the same
10,000 one-recipient mails to the same SMTP sink (bench/sink.py, answering at once), each with
2 processes, in one run.

* **django-post_office** in its documented set-up for volume: ``manage.py send_queued_mail
  --processes 2`` (a pool of 2 processes, each sending its share of a batch on
  ``THREADS_PER_PROCESS`` threads that keep their SMTP connection open across mails), with
  ``BATCH_SIZE`` raised from 100 to 5,000 (``--po-batch-size``: fewer, larger batches; 1,000
  was slower) and ``THREADS_PER_PROCESS`` at its default of 5 (``--po-threads``: on a
  two-core machine 16 and 32 threads were slower), and ``LOG_LEVEL`` 2 (a log row per mail,
  its default: the audit trail Outbox keeps too, one attempt row per delivery). It is
  installed for this benchmark only, into a virtual environment of its own
  (``bench-results/.peers-venv``, from bench/requirements-peers.txt), and runs in a small
  Django project of its own written to a temporary directory, against a PostgreSQL database
  of its own. Each mail carries an ``X-Notification-Id`` header, so the sink counts it.
* **Outbox**: 2 ``manage.py dispatch --once`` processes of 16 deliveries at a time each.

Both are timed from outside, the same way: from starting the command until it has exited
with every mail handed over, start-up included, and the sink must have every mail exactly
once. The two alternate for ``--rounds`` (3) rounds; the best round of each counts (a shared
machine only ever slows a run down), and the median of the rounds' ratios is reported
beside it. Target: Outbox ≥ 1.5 × django-post_office.

Writes bench-results/peers.json. Usage: python bench/bench_peers.py [--count 10000] …
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    RESULTS,
    bench_database_url,
    check,
    dispatchers_run,
    fresh_database,
    setup_django,
    write_results,
)
from tests.support.db import drop_postgres_database
from tests.support.processes import ROOT, SmtpSink

REQUIREMENTS = Path(__file__).resolve().parent / "requirements-peers.txt"
VENV = RESULTS / ".peers-venv"
SUBJECT = "Pump 3 tripped"
BODY = "Pump 3 at station North tripped on overcurrent at 10:00:00 UTC.\nCheck the motor protection relay."
RECIPIENT = "op1@bench.invalid"

PEER_SETTINGS = """\
import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["post_office"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": {name!r}, "USER": {user!r},
    "HOST": {host!r}, "PORT": {port!r}, "PASSWORD": {password!r}}}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}}]
EMAIL_BACKEND = "post_office.EmailBackend"
EMAIL_HOST = "127.0.0.1"
EMAIL_PORT = int(os.environ["PEER_SMTP_PORT"])
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = "outbox@bench.invalid"
POST_OFFICE = {{
    "BACKENDS": {{"default": "django.core.mail.backends.smtp.EmailBackend"}},
    "BATCH_SIZE": {batch_size},
    "THREADS_PER_PROCESS": {threads},
    "LOG_LEVEL": 2,
    "DEFAULT_PRIORITY": "medium",
}}
LOGGING = {{"version": 1, "disable_existing_loggers": False, "root": {{"level": "WARNING"}}}}
"""

PEER_MANAGE = """\
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "peerproject.settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""

PEER_QUEUE = """\
import sys
from post_office import mail
ids = [line.strip() for line in open(sys.argv[1]) if line.strip()]
for start in range(0, len(ids), 1000):
    mail.send_many([
        {{"recipients": [{recipient!r}], "sender": "outbox@bench.invalid", "subject": {subject!r},
          "message": {body!r}, "headers": {{"X-Notification-Id": notification_id}}}}
        for notification_id in ids[start:start + 1000]
    ])
"""


def peer_python() -> Path:
    """The Python of the peers' virtual environment, created (and django-post_office installed
    into it) the first time."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"Creating {VENV.relative_to(ROOT)} with {REQUIREMENTS.name} …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
    return python


def peer_project(directory: Path, *, url: str, batch_size: int, threads: int) -> Path:
    """A Django project with django-post_office only, against the database at ``url``."""
    from urllib.parse import urlparse

    parts = urlparse(url)
    package = directory / "peerproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(
        PEER_SETTINGS.format(
            name=parts.path.lstrip("/"),
            user=parts.username or "postgres",
            host=parts.hostname or "127.0.0.1",
            port=str(parts.port or 5432),
            password=parts.password or "",
            batch_size=batch_size,
            threads=threads,
        )
    )
    (directory / "manage.py").write_text(PEER_MANAGE)
    (directory / "queue_mails.py").write_text(PEER_QUEUE.format(recipient=RECIPIENT, subject=SUBJECT, body=BODY))
    return directory


def empty_database(url: str) -> None:
    """(Re)create the empty PostgreSQL database at ``url``."""
    import psycopg
    from psycopg import sql

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def post_office_round(python: Path, project: Path, url: str, count: int, processes: int) -> dict[str, Any]:
    """Queue ``count`` mails in django-post_office's database and time ``send_queued_mail``."""
    import psycopg

    empty_database(url)
    sink = SmtpSink("bench.sink")
    own = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")  # Outbox's, not the peer's
    env = {key: value for key, value in os.environ.items() if key not in own} | {"PEER_SMTP_PORT": str(sink.port)}

    def run(*args: str) -> None:
        subprocess.run([str(python), "manage.py", *args], cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)

    try:
        run("migrate", "-v0")
        ids = [str(uuid.uuid4()) for _ in range(count)]
        (project / "ids.txt").write_text("\n".join(ids))
        subprocess.run(
            [str(python), "-c", "import django; django.setup(); exec(open('queue_mails.py').read())", "ids.txt"],
            cwd=project,
            env=dict(env, DJANGO_SETTINGS_MODULE="peerproject.settings"),
            check=True,
        )
        lockfile = project / "send_queued_mail"
        started = time.perf_counter()
        run("send_queued_mail", "--processes", str(processes), "--lockfile", str(lockfile))
        seconds = time.perf_counter() - started
    except BaseException:
        sink.stop()  # no sink process left behind
        raise
    received = Counter(sink.stop())
    with psycopg.connect(url) as conn:
        statuses: dict[int, int] = dict(
            conn.execute("SELECT status, count(*) FROM post_office_email GROUP BY status").fetchall()
        )
    sent = statuses.get(0, 0)  # post_office's STATUS.sent
    exactly_once = set(received) == set(ids) and all(n == 1 for n in received.values()) and sent == count
    result = {"seconds": seconds, "per_second": count / seconds, "exactly_once": exactly_once, "statuses": statuses}
    print(
        f"django-post_office, {processes} processes: {count / seconds:,.0f}/s ({seconds:.2f} s), "
        f"exactly once: {exactly_once}",
        flush=True,
    )
    return result


def outbox_round(url: str, count: int, processes: int, concurrency: int, batch_size: int) -> dict[str, Any]:
    """Queue ``count`` notifications to a one-member list and time ``dispatch --once``."""
    from notifications.ingest import notification_validate, notifications_ingest
    from notifications.models import EmailRecipient, Notification, NotificationList, SmtpConfiguration

    Notification.objects.all().delete()
    sink = SmtpSink("bench.sink")
    SmtpConfiguration.objects.update_or_create(
        pk=SmtpConfiguration.SINGLETON_PK,
        defaults={"host": "127.0.0.1", "port": sink.port, "security": "none", "from_address": "outbox@bench.invalid"},
    )
    peers, _ = NotificationList.objects.get_or_create(name="Peers")
    EmailRecipient.objects.get_or_create(notification_list=peers, email=RECIPIENT)
    ids: list[str] = []
    for start in range(0, count, 1000):
        items = []
        for _ in range(min(1000, count - start)):
            payload = {"notification_id": str(uuid.uuid4()), "list_name": "Peers", "subject": SUBJECT, "body": BODY}
            item, rejection = notification_validate(payload, site_id="bench")
            assert item is not None, rejection
            items.append(item)
        notifications_ingest(site_id="bench", inputs=items)
        ids += [str(item.notification_id) for item in items]
    started = time.perf_counter()
    codes = dispatchers_run(url=url, processes=processes, concurrency=concurrency, batch_size=batch_size)
    seconds = time.perf_counter() - started
    received = Counter(sink.stop())
    delivered = Notification.objects.filter(status=Notification.Status.DELIVERED).count()
    exactly_once = set(received) == set(ids) and all(n == 1 for n in received.values()) and delivered == count
    result = {"seconds": seconds, "per_second": count / seconds, "exactly_once": exactly_once, "exit_codes": codes}
    print(
        f"Outbox, {processes} dispatch processes × {concurrency}: {count / seconds:,.0f}/s ({seconds:.2f} s), "
        f"exactly once: {exactly_once}",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="mails per run (10,000)")
    parser.add_argument("--processes", type=int, default=2, help="processes of each (2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3); the best of each counts")
    parser.add_argument("--concurrency", type=int, default=16, help="Outbox: deliveries at a time per process (16)")
    parser.add_argument("--batch-size", type=int, default=200, help="Outbox: rows per claim (200)")
    parser.add_argument("--po-batch-size", type=int, default=5000, help="post_office: BATCH_SIZE (5000)")
    parser.add_argument("--po-threads", type=int, default=5, help="post_office: THREADS_PER_PROCESS (5)")
    args = parser.parse_args()

    python = peer_python()
    url = fresh_database("peers")
    peer_url = bench_database_url().rsplit("/", 1)[0] + "/outbox_bench_peers_post_office"
    os.environ["OUTBOX_DISPATCH_TRIGGER"] = "false"  # only the dispatch processes deliver here
    setup_django(url)
    rounds: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as directory:
            project = peer_project(
                Path(directory), url=peer_url, batch_size=args.po_batch_size, threads=args.po_threads
            )
            for _ in range(args.rounds):
                rounds.append(
                    {
                        "post_office": post_office_round(python, project, peer_url, args.count, args.processes),
                        "outbox": outbox_round(url, args.count, args.processes, args.concurrency, args.batch_size),
                    }
                )
    finally:
        from django.db import connections

        connections.close_all()
        drop_postgres_database(url)
        drop_postgres_database(peer_url)

    best_peer = max(r["post_office"]["per_second"] for r in rounds)
    best_outbox = max(r["outbox"]["per_second"] for r in rounds)
    ratio = best_outbox / best_peer
    all_once = all(r[name]["exactly_once"] for r in rounds for name in ("post_office", "outbox"))
    checks = [
        check(
            f"django-post_office, {args.processes} processes × {args.po_threads} threads",
            best_peer,
            "msg/s",
            "(reference)",
            all_once,
        ),
        check(f"Outbox, {args.processes} processes × {args.concurrency}", best_outbox, "msg/s", "(report)", all_once),
        check("Outbox ÷ django-post_office", ratio, "×", "≥ 1.5", ratio >= 1.5 and all_once, ratio / 1.5),
    ]
    details = {
        "count": args.count,
        "rounds": rounds,
        "median_ratio": statistics.median(r["outbox"]["per_second"] / r["post_office"]["per_second"] for r in rounds),
        "post_office": {"batch_size": args.po_batch_size, "threads_per_process": args.po_threads, "log_level": 2},
    }
    write_results("peers", checks, details)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
