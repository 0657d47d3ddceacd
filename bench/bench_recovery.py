"""Password fixed → first delivery: how long after an administrator saves the fix the first
waiting notification reaches the relay, after an outage long enough to have pushed the
breaker's cool-down far out.

The outage is compressed tenfold: the email policy retries every 6 s (60 s) and the wrong
password — every attempt refused with 535 — lasts 24 s (4 minutes). The breaker's cool-down is
not compressed (first probe after 180 s): after a real 4-minute outage the next probe is
minutes away, beyond the 150 s within which a dispatch task waits for a due time, so no worker
waits for it — the situation in which a saved fix used to wait for the next every-minute
sweep (47–53 s measured). Real components: PostgreSQL, a real django-q2 worker
(``manage.py qcluster``, triggered dispatch), an SMTP server with AUTH on loopback. Ingest and
the fix run in this process, through the same functions as the API (notifications_ingest) and
the console (the SMTP configuration's admin form, saved in a transaction as the admin does).

Measured from the save to the first message the relay accepts; target ≤ 2 s. For reference,
measured in the same run: ingest → delivery of a healthy relay (the trigger's own latency),
and how far away the next probe was when the fix was saved.

Writes bench-results/recovery.json. Usage: python bench/bench_recovery.py [--outage 24]
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, fresh_database, setup_django, write_results
from tests.support.processes import manage, stop
from tests.support.smtp import SmtpServer

USER, RIGHT, WRONG = "outbox", "right-password", "expired-password"
TARGET_SECONDS = 2.0
# The retries compressed tenfold (60 s → 6 s); the breaker's cool-down as far out as a real
# 4-minute outage leaves it (see the module docstring).
POLICY = {
    "strategy": "fixed",
    "interval_seconds": 6,
    "max_attempts": 10,
    "breaker_threshold": 5,
    "breaker_cooldown_seconds": 180,
    "breaker_max_cooldown_seconds": 600,
}


def configure(sink: SmtpServer) -> None:
    from notifications.models import DeliveryPolicy, EmailRecipient, NotificationList, SmtpConfiguration
    from sites.models import Site

    SmtpConfiguration.objects.update_or_create(
        pk=SmtpConfiguration.SINGLETON_PK,
        defaults={
            "host": sink.host,
            "port": sink.port,
            "security": "none",
            "username": USER,
            "password": RIGHT,
            "from_address": "outbox@bench.invalid",
            "timeout_seconds": 2,
        },
    )
    operators = NotificationList.objects.create(name="Operators")
    for address in ("op1@bench.invalid", "op2@bench.invalid"):
        EmailRecipient.objects.create(notification_list=operators, email=address)
    DeliveryPolicy.objects.update_or_create(channel="email", defaults=POLICY)
    Site.objects.get_or_create(site_id="bench-recovery", defaults={"name": "Bench"})


def admin_save_password(password: str) -> None:
    """Save ``password`` through the SMTP configuration's admin form, in one transaction, as
    the console's change page does."""
    from django.db import transaction

    from notifications.admin.smtp import SmtpConfigurationForm
    from notifications.models import SmtpConfiguration

    config = SmtpConfiguration.objects.get()
    data = {
        name: getattr(config, name)
        for name in (
            "host",
            "port",
            "security",
            "username",
            "from_address",
            "timeout_seconds",
            "greeting_timeout_seconds",
            "data_timeout_seconds",
            "max_retries",
            "retry_interval_seconds",
            "auth_method",
        )
    }
    form = SmtpConfigurationForm(data={**data, "password": password}, instance=config)
    if not form.is_valid():
        raise RuntimeError(f"the SMTP form refused the values: {form.errors.as_text()}")
    with transaction.atomic():
        form.save()


def ingest(count: int = 1) -> list[str]:
    """``count`` notifications through ingest (which asks for a dispatch once committed)."""
    from notifications.ingest import notification_validate, notifications_ingest
    from tests.support.payloads import make_payload

    items = []
    for _ in range(count):
        item, rejection = notification_validate(make_payload(), site_id="bench-recovery")
        assert item is not None, rejection
        items.append(item)
    notifications_ingest(site_id="bench-recovery", inputs=items)
    return [str(item.notification_id) for item in items]


def wait_for_count(sink: SmtpServer, count: int, timeout: float) -> float:
    """Wait until ``sink`` has accepted ``count`` messages; the monotonic time of the last."""
    sink.wait_for(count, timeout=timeout)
    return sorted(sink.accepted_times)[count - 1]


def healthy_latency(sink: SmtpServer, rounds: int = 3) -> float:
    """Ingest → accepted by the relay, with the relay healthy: the median of ``rounds``."""
    samples = []
    for _ in range(rounds):
        before = sink.count
        started = time.monotonic()
        ingest()
        samples.append(wait_for_count(sink, before + 1, timeout=60) - started)
    return statistics.median(samples)


def outage(sink: SmtpServer, seconds: float) -> list[str]:
    """A wrong password saved, then a notification every 2 s for ``seconds``: all refused."""
    admin_save_password(WRONG)
    ids: list[str] = []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        ids += ingest()
        time.sleep(2.0)  # the plant's alarm rate during the outage
    return ids


def worker_started(url: str) -> Any:
    """A django-q2 worker (``manage.py qcluster``), returned once it has run a task (a harmless
    one: the worker is up)."""
    from django_q.models import Success
    from django_q.tasks import async_task

    worker = manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    task_id = async_task("math.floor", 1.5)
    deadline = time.monotonic() + 60
    while not Success.objects.filter(id=task_id).exists():
        if time.monotonic() > deadline:
            stop(worker)
            raise RuntimeError("the django-q2 worker ran no task within 60 s")
        time.sleep(0.1)
    return worker


def breaker() -> dict[str, Any]:
    from notifications.clock import database_now
    from notifications.models import ChannelHealth

    row = ChannelHealth.objects.filter(channel="email").first()
    if row is None:
        return {"state": "none"}
    away = None if row.probe_after is None else (row.probe_after - database_now()).total_seconds()
    return {
        "state": row.state,
        "class": row.last_failure_class,
        "cooldown_seconds": row.cooldown_seconds,
        "probes": row.probes,
        "next_probe_in": away,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--outage", type=float, default=24.0, help="seconds of wrong password (24: 4 min / 10)")
    args = parser.parse_args()
    url = fresh_database("recovery")
    setup_django(url)
    from notifications.models import Notification

    sink = SmtpServer(auth=(USER, RIGHT), keep_content=False).start()
    configure(sink)
    worker = worker_started(url)
    try:
        ingest()  # the first dispatch also opens the worker's connections: not timed
        wait_for_count(sink, 1, timeout=60)
        reference = healthy_latency(sink)
        print(f"healthy relay: ingest → delivery {reference:.3f} s (median of 3)", flush=True)
        waiting = outage(sink, args.outage)
        state = breaker()
        print(f"after {args.outage:g} s of a wrong password: {state}", flush=True)
        delivered_before = sink.count
        saved = time.monotonic()
        admin_save_password(RIGHT)
        first = wait_for_count(sink, delivered_before + 1, timeout=120) - saved
        everything = wait_for_count(sink, delivered_before + len(waiting), timeout=120) - saved
        parked = Notification.objects.filter(status=Notification.Status.PARKED).count()
    finally:
        stop(worker, timeout=30)
        sink.stop()
    print(f"password fixed → first delivery {first:.3f} s; all {len(waiting)} waiting delivered {everything:.3f} s")
    checks = [
        check(
            "password fixed → first delivery",
            first,
            "s",
            f"≤ {TARGET_SECONDS:g} s",
            first <= TARGET_SECONDS and parked == 0,
            ratio=first / TARGET_SECONDS,
        )
    ]
    details = {
        "outage_seconds": args.outage,
        "time_compression": "10 (retries and the outage; not the breaker's cool-down)",
        "policy": POLICY,
        "breaker_when_fixed": state,
        "healthy_ingest_to_delivery_seconds": reference,
        "fixed_to_first_over_healthy": first / reference if reference else None,
        "fixed_to_all_delivered_seconds": everything,
        "waiting_when_fixed": len(waiting),
        "parked": parked,
    }
    write_results("recovery", checks, details)
    return 0 if checks[0]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
