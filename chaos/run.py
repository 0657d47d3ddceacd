"""Fault-injection suite: real gunicorn, real dispatcher processes, real PostgreSQL, a real SMTP
server on loopback, and faults injected while notifications flow.

After each scenario the harness re-sends every indeterminate id until central acknowledges it,
lets the dispatchers drain, and reports:

- lost:        acknowledged, but not in the table, or not ending as expected (Delivered; Parked
               or Discarded where the scenario makes delivery impossible), or Delivered
               in the table but never received by the SMTP server — or still not final at
               3 × the scenario's deadline (a row that can never arrive);
- late:        still moving (Pending or Retrying) when the scenario's deadline passed, and
               delivered as expected before 3 × the deadline. The deadline (DRAIN_SECONDS)
               follows the progress: while rows keep reaching their final state it moves on,
               so a loaded machine that delivers slowly gets rows reported late, not lost;
- unexpected:  received by the SMTP server but never acknowledged to a client;
- duplicates:  messages received minus distinct ids received;
- non-terminal left: rows still Pending or Retrying after the drain;
- parked vs expected.

Required: lost = unexpected = non-terminal = 0 everywhere; duplicates = 0 except where a
dispatcher is killed or the SMTP server stopped, bounded there by the messages in flight at each
kill or stop. Late rows are reported, not failed. The resilience scenarios (long outage,
authentication failure, throttling relay, relay-wide refusals, a receiver answering 503, a
site cut off from central, a relay replaced during an outage) add checks of their own, stated
in their notes.

Time is compressed through short intervals: the email delivery policy retries every second
and the circuit breaker cools down for 1 s (doubling up to a few seconds) instead of 30 s.

Usage: python chaos/run.py [--short] [--only NAME[,NAME…]] [--list]
Needs PostgreSQL (CHAOS_DATABASE_URL or BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/outbox_chaos) and root for the PostgreSQL restart scenario.
Every load is bounded in count and time and targets loopback only.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.db import fresh_postgres_database  # noqa: E402

BASE_URL = os.environ.get("CHAOS_DATABASE_URL") or os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox"
)
if not BASE_URL.startswith("postgres"):
    sys.exit("The chaos suite needs PostgreSQL: set CHAOS_DATABASE_URL=postgres://…")
DATABASE_URL = fresh_postgres_database(BASE_URL, "chaos")
os.environ["DATABASE_URL"] = DATABASE_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")
# The harness runs standalone dispatchers; a configuration it saves needs no django-q2 task.
os.environ.setdefault("OUTBOX_DISPATCH_TRIGGER", "false")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import close_old_connections, connection  # noqa: E402

from chaos.load import Ledger, LoadGenerator, notification, post_same_ids_concurrently, resend_until_acked  # noqa: E402
from chaos.verdicts import DrainClock  # noqa: E402
from notifications.kpis import kpis_compute  # noqa: E402
from notifications.models import (  # noqa: E402
    ChannelHealth,
    DeliveryAttempt,
    DeliveryPolicy,
    EmailRecipient,
    Notification,
    NotificationList,
    SmtpConfiguration,
    WebhookTarget,
)
from notifications.operations import notification_discard, notification_retry  # noqa: E402
from sites.agent import SiteOutbox  # noqa: E402
from sites.models import Site  # noqa: E402
from sites.services import site_key_issue  # noqa: E402
from tests.support.processes import Central, manage, poll, stop  # noqa: E402
from tests.support.proxy import TcpProxy  # noqa: E402
from tests.support.receivers import Reply, WebhookReceiver, new_webhook_secret  # noqa: E402
from tests.support.smtp import SmtpServer  # noqa: E402

Status = Notification.Status
# How long a scenario's rows may take to reach their final state before they count as late;
# the deadline moves on while they keep arriving (PROGRESS_GRACE_SECONDS after the latest),
# and rows not final at LATE_FACTOR × the deadline are lost.
DRAIN_SECONDS = 180.0
PROGRESS_GRACE_SECONDS = 20.0
LATE_FACTOR = 3
LOOKUP_DOWN = "451 4.3.5 Server configuration problem"  # Postfix, while a lookup table is down
DISPATCH_ENV: dict[str, Any] = {
    "OUTBOX_DISPATCH_INTERVAL": 0.2,
    "OUTBOX_LEASE_SECONDS": 5,
    "OUTBOX_BATCH_SIZE": 50,
    "OUTBOX_CONCURRENCY": 4,
}
WEB_ENV: dict[str, Any] = {"OUTBOX_SITE_RATE_LIMIT": 1_000_000, "OUTBOX_DISPATCH_TRIGGER": "false"}
DOOMED = "doomed@chaos.invalid"  # the SMTP server refuses this recipient with 550
# The email policy of every scenario unless it sets its own: time compressed (a retry every
# second, a breaker that cools down for 1 s and at most 4 s).
CHAOS_POLICY: dict[str, Any] = {
    "strategy": "fixed",
    "interval_seconds": 1,
    "max_attempts": 100,
    "breaker_threshold": 5,
    "breaker_cooldown_seconds": 1,
    "breaker_max_cooldown_seconds": 4,
    "rate_per_minute": 0,
}


class World:
    """Everything a scenario needs; scenarios start and stop the pieces they fault."""

    def __init__(self, short: bool) -> None:
        self.short = short
        self.smtp = SmtpServer(keep_content=False).start()
        self.smtp.behave("refuse", refuse={DOOMED})
        SmtpConfiguration.objects.update_or_create(
            pk=SmtpConfiguration.SINGLETON_PK,
            defaults={
                "host": "127.0.0.1",
                "port": self.smtp.port,
                "security": "none",
                "from_address": "outbox@chaos.invalid",
                "timeout_seconds": 2,
                "max_retries": 100,
                "retry_interval_seconds": 1,
            },
        )
        operators = NotificationList.objects.create(name="Operators")
        EmailRecipient.objects.create(notification_list=operators, email="op1@chaos.invalid")
        EmailRecipient.objects.create(notification_list=operators, email="op2@chaos.invalid")
        doomed = NotificationList.objects.create(name="Doomed")
        EmailRecipient.objects.create(notification_list=doomed, email=DOOMED)
        site = Site.objects.create(site_id="chaos-site", name="Chaos")
        self.key = site_key_issue(site=site)[1]
        self.operator = get_user_model().objects.create_user("chaos-operator", is_staff=True)
        self.policy()
        self.web = Central(workers=2, **WEB_ENV).start()
        self.dispatchers: list[subprocess.Popen[str]] = []

    def policy(self, **fields: Any) -> None:
        """Store the email delivery policy: CHAOS_POLICY with ``fields`` over it; the breaker
        starts closed."""
        DeliveryPolicy.objects.update_or_create(channel="email", defaults={**CHAOS_POLICY, **fields})
        ChannelHealth.objects.all().delete()

    def point_smtp_at(self, port: int, **fields: Any) -> None:
        """Point the SMTP configuration at ``port`` (saving it, as an administrator would)."""
        config = SmtpConfiguration.objects.get()
        config.port = port
        for name, value in {"username": "", "password": "", **fields}.items():
            setattr(config, name, value)
        config.save()

    @property
    def url(self) -> str:
        return self.web.url

    def start_dispatchers(self, count: int = 2, **env: Any) -> None:
        for _ in range(count):
            self.dispatchers.append(manage("dispatch", **{**DISPATCH_ENV, **env}))

    def stop_dispatchers(self, sig: int = signal.SIGTERM) -> None:
        for process in self.dispatchers:
            stop(process, sig=sig)
        self.dispatchers = []

    def close(self) -> None:
        self.stop_dispatchers()
        self.web.stop()
        self.smtp.stop()


# --- evaluation -----------------------------------------------------------------------------


class Receiving(Protocol):
    """What received the scenario's messages: SMTP servers, a webhook receiver, … ."""

    def copies_by_notification_id(self) -> Counter[str | None]:
        """Per notification id, the most copies one recipient (a mailbox, a hook) received. A
        notification that reached some recipients in one transaction and the others in a
        later one (a refusal began or ended in the middle of its RCPT TO commands) is one copy,
        not a duplicate: nobody received it twice."""
        ...


class Mailboxes:
    """What one or more SMTP servers received together, counted per recipient."""

    def __init__(self, *servers: SmtpServer) -> None:
        self.servers = servers

    def copies_by_notification_id(self) -> Counter[str | None]:
        copies: Counter[tuple[str | None, str]] = Counter()
        for server in self.servers:
            copies.update(server.copies_by_notification_and_recipient())
        most: Counter[str | None] = Counter()
        for (nid, _recipient), n in copies.items():
            most[nid] = max(most[nid], n)
        return most


class OneHook:
    """A webhook receiver with the scenario's single hook: each request is a copy to that one
    recipient (``accepted_at``: count only the requests answered 2xx at that path)."""

    def __init__(self, receiver: WebhookReceiver, accepted_at: str | None = None) -> None:
        self.receiver, self.accepted_at = receiver, accepted_at

    def copies_by_notification_id(self) -> Counter[str | None]:
        if self.accepted_at is None:
            return self.receiver.count_by_notification_id()
        return self.receiver.accepted_by_notification_id(self.accepted_at)


@dataclass
class Drain:
    """How the wait for a scenario's rows ended: ``drained`` (none is Pending or Retrying any
    more), ``late`` (still moving when the deadline passed) and ``stuck`` (still not final at
    LATE_FACTOR × the deadline). True when drained."""

    drained: bool
    late: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return self.drained


def _still_moving(ids: list[str]) -> set[str] | None:
    """The ids still Pending or Retrying; None while the database cannot be read."""
    close_old_connections()
    try:
        return {
            str(pk)
            for pk in Notification.objects.filter(pk__in=ids, status__in=Notification.NON_TERMINAL).values_list(
                "pk", flat=True
            )
        }
    except Exception:  # the database may be restarting
        connection.close()
        return None


def drain(ids: list[str], timeout: float = DRAIN_SECONDS) -> Drain:
    """Wait until none of ``ids`` is Pending or Retrying, with a deadline that follows the
    progress (chaos/verdicts.py): rows still moving when it passes are late; those still not
    final at LATE_FACTOR × ``timeout`` are stuck."""
    clock = DrainClock(time.monotonic(), timeout, grace=PROGRESS_GRACE_SECONDS, factor=LATE_FACTOR)
    moving = set(ids)
    while True:
        now_moving = _still_moving(ids)
        moving = moving if now_moving is None else now_moving
        verdict = clock.observe(now=time.monotonic(), moving=moving)
        if verdict is not None:
            stuck = moving if verdict == "stuck" else set()
            return Drain(verdict == "drained", late=clock.late or set(), stuck=stuck)
        time.sleep(0.25)


def evaluate(
    name: str,
    world: World,
    *,
    acked: Iterable[str],
    expected_parked: Iterable[str] = (),
    dup_bound: int = 0,
    rejected: int = 0,
    note: str = "",
    started: float,
    smtp: "Receiving | None" = None,
) -> dict[str, Any]:
    """The scenario's result row; ``smtp``: what received (default: the world's SMTP server).
    A duplicate is a second copy to the same recipient."""
    acked = set(acked)
    expected_parked = set(expected_parked)
    close_old_connections()
    waited = drain(list(acked))
    rows = {
        str(pk): status for pk, status in Notification.objects.filter(pk__in=list(acked)).values_list("pk", "status")
    }
    receiving = smtp or Mailboxes(world.smtp)
    received = Counter({nid: n for nid, n in receiving.copies_by_notification_id().items() if nid})
    lost = []
    for nid in acked:
        status = rows.get(nid)
        if status is None:
            lost.append(nid)
        elif nid in expected_parked:
            if status not in (Status.PARKED, Status.DISCARDED):
                lost.append(nid)
        elif status != Status.DELIVERED or received[nid] == 0:
            lost.append(nid)
    unexpected = [nid for nid in received if nid not in acked]
    duplicates = sum(received.values()) - len(received)
    non_terminal = sum(1 for status in rows.values() if status in Notification.NON_TERMINAL)
    parked = sum(1 for nid, status in rows.items() if status in (Status.PARKED, Status.DISCARDED))
    late = waited.late - set(lost)  # arrived late but as expected
    ok = (
        not lost
        and not unexpected
        and non_terminal == 0
        and duplicates <= dup_bound
        and waited.drained
        and parked == len(expected_parked)
    )
    return {
        "scenario": name,
        "acked": len(acked),
        "rejected": rejected,
        "lost": len(lost),
        "late": len(late),
        "unexpected": len(unexpected),
        "duplicates": duplicates,
        "dup_bound": dup_bound,
        "non_terminal": non_terminal,
        "parked": parked,
        "expected_parked": len(expected_parked),
        "seconds": round(time.monotonic() - started, 1),
        "ok": ok,
        "note": note,
        "lost_ids": lost[:5],
        "late_ids": sorted(late)[:5],
    }


def run_load(
    world: World,
    *,
    seconds: float,
    rate: float = 80,
    limit: int | None = None,
    make: Callable[[str], dict[str, Any]] = notification,
    during: Callable[[], None] | None = None,
) -> Ledger:
    """Post new notifications for ``seconds`` while ``during(stop_event)`` injects faults;
    then re-send indeterminate ids until acknowledged. Returns the ledger."""
    ledger = Ledger()
    load = LoadGenerator(
        world.url, world.key, ledger, rate=rate, duration=seconds, limit=limit or int(rate * seconds), make=make
    ).start()
    if during:
        during()
    load.join()
    left = resend_until_acked(world.url, world.key, ledger, deadline_seconds=120)
    if left:
        print(f"  warning: {len(left)} ids never acknowledged", flush=True)
    return ledger


# --- scenarios ------------------------------------------------------------------------------


def scenario_same_ids(world: World) -> dict[str, Any]:
    """Eight clients post the same ids at the same moment."""
    started = time.monotonic()
    world.start_dispatchers(2)
    ledger = Ledger()
    post_same_ids_concurrently(world.url, world.key, ledger, count=100 if world.short else 300, threads=8)
    resend_until_acked(world.url, world.key, ledger)
    result = evaluate(
        "concurrent identical posts",
        world,
        acked=ledger.ids("ack"),
        started=started,
        rejected=len(ledger.ids("reject")),
    )
    world.stop_dispatchers()
    return result


def _children(pid: int) -> list[int]:
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def scenario_web_kill(world: World) -> dict[str, Any]:
    """SIGKILL a gunicorn worker three times under load (the master starts a new one)."""
    kills = []
    master = world.web.process
    assert master is not None, "central is running"

    def kill_workers() -> None:
        for _ in range(3):
            time.sleep(1.5)
            workers = _children(master.pid)
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                kills.append(workers[0])

    result = _under_load(
        world,
        "SIGKILL web worker x3",
        kill_workers,
        seconds=6 if world.short else 10,
        note=lambda: f"killed {len(kills)} workers; indeterminate answers re-sent",
    )
    poll(world.web.healthy, timeout=30, message="gunicorn did not recover")
    return result


def _postgres_restart() -> str | None:
    clusters = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not clusters or not shutil.which("pg_ctlcluster"):
        return "no local pg_ctlcluster"
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", clusters[-1], "main", "restart", "-m", "immediate"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return None


def scenario_postgres_restart(world: World) -> dict[str, Any]:
    """PostgreSQL restarted in immediate mode (a crash) three times under load."""
    if os.geteuid() != 0:
        return {"scenario": "PostgreSQL restart (immediate)", "skipped": "needs root to restart the local cluster"}
    restarts = []

    def restart() -> None:
        for _ in range(1 if world.short else 3):
            time.sleep(2)
            restarts.append(_postgres_restart() or "restarted")

    count = 1 if world.short else 3
    return _under_load(
        world,
        f"PostgreSQL restart (immediate) x{count}",
        restart,
        seconds=6 if world.short else 12,
        note=lambda: ", ".join(restarts),
    )


def scenario_dispatcher_kill(world: World) -> dict[str, Any]:
    """SIGKILL a dispatcher mid-batch ten times; each kill may re-send what it had in flight."""
    started = time.monotonic()
    count = 600 if world.short else 2000
    ledger = run_load(world, seconds=count / 400, rate=400, limit=count)
    ids = ledger.ids("ack")
    world.smtp.behave("refuse", refuse={DOOMED}, delay_seconds=0.01)
    in_flight = set()  # accepted by the SMTP server while the row was not yet recorded Delivered
    kills = 3 if world.short else 10
    for _ in range(kills):
        victim = manage("dispatch", **DISPATCH_ENV)
        before = sum(world.smtp.count_by_notification_id().values())

        def busy_or_gone(before: int = before, victim: subprocess.Popen[str] = victim) -> bool:
            return sum(world.smtp.count_by_notification_id().values()) >= before + 20 or victim.poll() is not None

        poll(busy_or_gone, timeout=30, message="the dispatcher delivered nothing")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        received = set(world.smtp.count_by_notification_id())
        close_old_connections()
        recorded = {
            str(pk)
            for pk in Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).values_list("pk", flat=True)
        }
        in_flight |= received - recorded
    world.smtp.behave("refuse", refuse={DOOMED})
    world.start_dispatchers(2)
    result = evaluate(
        f"SIGKILL dispatcher x{kills}",
        world,
        acked=ids,
        dup_bound=len(in_flight),
        started=started,
        note="bound = messages the SMTP server had accepted but the killed dispatcher had not recorded, at each kill",
    )
    duplicated = {nid for nid, n in world.smtp.count_by_notification_id().items() if n > 1}
    if not duplicated <= in_flight:
        result["ok"] = False
        result["note"] += f"; {len(duplicated - in_flight)} duplicates were NOT in flight at a kill"
    world.stop_dispatchers()
    return result


def _under_load(
    world: World, title: str, fault: Callable[[], None], *, seconds: float = 6, note: Callable[[], str] = lambda: ""
) -> dict[str, Any]:
    """Two dispatchers run while new notifications are posted and ``fault()`` is injected."""
    started = time.monotonic()
    world.start_dispatchers(2)
    ledger = run_load(world, seconds=seconds, during=fault)
    connection.close()  # the fault may have broken this process's connection too
    result = evaluate(title, world, acked=ledger.ids("ack"), started=started, note=note())
    world.stop_dispatchers()
    return result


def scenario_smtp_down(world: World) -> dict[str, Any]:
    """The SMTP server is down for a while, then back."""

    def outage() -> None:
        time.sleep(1)
        world.smtp.stop()
        time.sleep(3)
        world.smtp.start()

    return _under_load(world, "SMTP down, then back", outage)


def scenario_smtp_hang(world: World) -> dict[str, Any]:
    """The SMTP server hangs past the client timeout (2 s), then recovers."""

    def hang() -> None:
        time.sleep(1)
        world.smtp.behave("hang", hang_seconds=5, refuse={DOOMED})
        time.sleep(4)
        world.smtp.behave("refuse", refuse={DOOMED})

    return _under_load(world, "SMTP hangs past timeout", hang)


def scenario_smtp_transient_codes(world: World) -> dict[str, Any]:
    """421/450/451/452 at DATA for a while (transient: retried), then accepted."""

    def codes() -> None:
        for reply in (
            "421 4.3.2 shutting down",
            "450 4.2.0 mailbox busy",
            "451 4.3.0 local error",
            "452 4.3.1 insufficient storage",
        ):
            world.smtp.code_4xx = reply
            world.smtp.behave("4xx")
            time.sleep(1.2)
        world.smtp.behave("refuse", refuse={DOOMED})

    return _under_load(world, "SMTP 421/450/451/452, then OK", codes)


def scenario_smtp_permanent_codes(world: World) -> dict[str, Any]:
    """550 (refused recipient), 552 and 554 at DATA: parked, never retried; mixed with refusal of
    some recipients (delivered to the others)."""
    started = time.monotonic()
    acked, expected_parked = [], []
    for reply in ("552 5.3.4 message too big", "554 5.7.1 rejected"):
        ledger = run_load(world, seconds=1, rate=60)
        ids = ledger.ids("ack")
        world.smtp.code_5xx = reply
        world.smtp.behave("5xx")
        world.start_dispatchers(1)
        drain(ids, timeout=60)
        world.stop_dispatchers()
        world.smtp.behave("refuse", refuse={DOOMED})
        acked += ids
        expected_parked += ids
    # 550 for one recipient of a two-recipient list: delivered to the other; a list whose only
    # recipient is refused: parked.
    world.smtp.behave("refuse", refuse={DOOMED, "op2@chaos.invalid"})
    mixed = run_load(
        world,
        seconds=2,
        rate=60,
        make=lambda nid: notification(nid, list_name="Doomed" if int(nid[0], 16) % 2 else "Operators"),
    )
    world.start_dispatchers(2)
    doomed = [nid for nid in mixed.ids("ack") if int(nid[0], 16) % 2]
    acked += mixed.ids("ack")
    expected_parked += doomed
    result = evaluate(
        "SMTP 550/552/554 + partial refusal", world, acked=acked, expected_parked=expected_parked, started=started
    )
    world.stop_dispatchers()
    world.smtp.behave("refuse", refuse={DOOMED})
    return result


def _skewed_dispatcher(seconds: float) -> subprocess.Popen[str]:
    """A dispatcher process whose application clock is ``seconds`` off (chaos/skewed.py)."""
    return manage(
        "dispatch", launcher=[ROOT / "chaos" / "skewed.py", seconds], stdout=subprocess.DEVNULL, **DISPATCH_ENV
    )


def scenario_clock_skew(world: World) -> dict[str, Any]:
    """Dispatchers whose clocks are 1 h ahead, right and 1 h behind the database, and a web process
    1 h ahead: leases and due times use the database clock, so nothing is stolen or stranded."""
    started = time.monotonic()
    dispatchers = [_skewed_dispatcher(skew) for skew in (3600, 0, -3600)]
    web = Central(workers=1, launcher=[ROOT / "chaos" / "skewed.py", 3600], **WEB_ENV)
    try:
        web.start()
        ledger = Ledger()
        LoadGenerator(web.url, world.key, ledger, rate=60, duration=5, limit=300).start().join()
        resend_until_acked(web.url, world.key, ledger)
        return evaluate(
            "app clock skewed +/-1 h",
            world,
            acked=ledger.ids("ack"),
            started=started,
            note="web +1 h; dispatchers +1 h, on time and -1 h",
        )
    finally:
        web.stop()
        for process in dispatchers:
            stop(process)


def scenario_operator_race(world: World) -> dict[str, Any]:
    """Operators retry and discard parked rows while dispatchers run."""
    started = time.monotonic()
    # First: parked by a 554 …
    ledger = run_load(world, seconds=2, rate=100)
    ids = ledger.ids("ack")
    world.smtp.code_5xx = "554 5.7.1 rejected"
    world.smtp.behave("5xx")
    world.start_dispatchers(2)
    drain(ids, timeout=60)
    world.smtp.behave("refuse", refuse={DOOMED})
    retry_ids, discard_ids = ids[::2], ids[1::2]
    stop_event = threading.Event()

    def operator(action: Callable[..., object], targets: list[str]) -> None:
        close_old_connections()
        while not stop_event.is_set():
            action(notification_ids=targets, user=world.operator)
            time.sleep(0.05)
        connection.close()

    threads = [
        threading.Thread(target=operator, args=(notification_retry, retry_ids)),
        threading.Thread(target=operator, args=(partial(notification_discard, reason="chaos"), discard_ids)),
        threading.Thread(target=operator, args=(notification_retry, discard_ids)),
    ]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop_event.set()
    for thread in threads:
        thread.join()
    # A discard that lost every race leaves rows parked, and retried ones get delivered: both
    # are what operators asked for. What must hold: terminal states only, no duplicates.
    close_old_connections()
    drain(ids, timeout=60)
    statuses = dict(Notification.objects.filter(pk__in=ids).values_list("pk", "status"))
    not_delivered = [str(pk) for pk, status in statuses.items() if status != Status.DELIVERED]
    result = evaluate(
        "operator Retry/Discard vs dispatcher",
        world,
        acked=ids,
        expected_parked=not_delivered,
        started=started,
        note=f"{len(not_delivered)} discarded/parked, {len(ids) - len(not_delivered)} delivered",
    )
    # The 554 phase delivered nothing, so every delivery happened after an operator Retry.
    world.stop_dispatchers()
    return result


def scenario_agent_link(world: World, tmp_dir: str) -> dict[str, Any]:
    """The site agent's link to central is cut and restored while it forwards."""
    started = time.monotonic()
    world.start_dispatchers(2)
    proxy = TcpProxy(world.web.port)
    outbox = SiteOutbox(
        Path(tmp_dir) / "agent.sqlite3", proxy.url, world.key, retry_interval=0.2, batch_size=50, timeout=2
    )
    stop_event = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop_event,), kwargs={"progress": None})
    ids = []
    forwarder.start()
    try:
        for round_number in range(4):
            ids += [outbox.notify("Operators").send(f"Agent {round_number}-{n}", "link test") for n in range(100)]
            time.sleep(0.3)
            proxy.cut()
            time.sleep(1)
            proxy.restore()
        poll(lambda: outbox.stats()["buffered"] == 0, timeout=120, interval=0.2, message="agent buffer never drained")
    finally:
        stop_event.set()
        forwarder.join(timeout=30)
        proxy.close()
    parked_at_site = outbox.stats()["parked"]
    result = evaluate(
        "agent link cut/restored x4",
        world,
        acked=ids,
        started=started,
        note=f"site buffer empty; parked at site: {parked_at_site}",
    )
    if parked_at_site:
        result["ok"] = False
    world.stop_dispatchers()
    return result


def scenario_wan_cut_critical(world: World, tmp_dir: str) -> dict[str, Any]:
    """A site's WAN is cut for "10 minutes" while it raises critical alarms and notices.

    Every critical one goes out once through the plant's own relay (the agent's local
    fallback), and all reach central once the link is back: the critical ones recorded there
    as delivered locally and not sent again, the notices delivered by central."""
    from tests.agent.local_relay import LocalRelay

    title = "WAN cut 10 min with critical alarms"
    started = time.monotonic()
    # Time compressed: the cut lasts 20 s (8 s short) for 10 minutes, the fallback starts after
    # half of it as 300 s of 600 would, the agent sweeps every 0.25 s instead of 10 s.
    cut_seconds = 8.0 if world.short else 20.0
    after = cut_seconds / 2
    criticals_wanted, notices_wanted = (20, 30) if world.short else (60, 100)
    world.start_dispatchers(2)
    link = TcpProxy(world.web.port)
    relay = LocalRelay().__enter__()
    outbox = SiteOutbox(
        Path(tmp_dir) / "wan-cut.sqlite3",
        link.url,
        world.key,
        sweep_interval=0.25,
        retry_interval=0.25,
        heartbeat_interval=0.5,
        timeout=2,
        site_id="chaos-site",
        fallback=relay.settings(after_seconds=after),
    )
    stop_event = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop_event,), kwargs={"progress": None})
    forwarder.start()
    criticals: list[str] = []
    notices = [outbox.notify("Operators").send(f"Before the cut {n}", "wan test") for n in range(10)]
    try:
        poll(lambda: outbox.stats()["buffered"] == 0, timeout=60, interval=0.1, message="no forwarding before the cut")
        link.cut()
        cut_at = time.monotonic()
        # Alarms keep coming during the cut; the last ones a few sweeps before it ends.
        raising = cut_seconds - 1.5
        for n in range(criticals_wanted + notices_wanted):
            if n % ((criticals_wanted + notices_wanted) // criticals_wanted) == 0 and len(criticals) < criticals_wanted:
                criticals.append(outbox.notify("Operators").send(f"Gas alarm {n}", "H2S high", priority="critical"))
            else:
                notices.append(outbox.notify("Operators").send(f"Notice {n}", "wan test"))
            time.sleep(raising / (criticals_wanted + notices_wanted))
        poll(
            lambda: set(relay.ids()) >= set(criticals),
            timeout=cut_seconds + 30,
            interval=0.1,
            message="not every critical alarm reached the plant's relay during the cut",
        )
        time.sleep(max(0.0, cut_at + cut_seconds - time.monotonic()))
        link.restore()
        poll(
            lambda: outbox.stats()["buffered"] == 0, timeout=120, interval=0.2, message="the site buffer never drained"
        )
    finally:
        stop_event.set()
        forwarder.join(timeout=30)
        outbox.close()
        link.close()
        relay.__exit__(None, None, None)
    result = evaluate(title, world, acked=notices, started=started)
    drain(criticals)
    close_old_connections()
    at_central = dict(
        Notification.objects.filter(pk__in=criticals).values_list("pk", "delivered_locally_at").iterator()
    )
    statuses = Counter(Notification.objects.filter(pk__in=criticals).values_list("status", flat=True))
    local = relay.ids()
    sent_by_central = world.smtp.count_by_notification_id()
    lost = [nid for nid in criticals if uuid.UUID(nid) not in at_central]
    local_once = sum(1 for nid in criticals if local[nid] == 1)
    recorded = sum(1 for moment in at_central.values() if moment is not None)
    resent = sum(1 for nid in criticals if sent_by_central[nid])
    result["acked"] += len(criticals)
    result["lost"] += len(lost)
    result["duplicates"] += sum(local.values()) - len(local)
    result["note"] = (
        f"{len(criticals)} critical alarms: {local_once} delivered locally exactly once, {recorded} recorded at central "
        f"as delivered locally ({statuses[Status.DELIVERED]} Delivered), {resent} sent again by central; "
        f"{len(notices)} notices delivered by central after the cut"
    )
    if (
        lost
        or local_once != len(criticals)
        or recorded != len(criticals)
        or resent
        or sum(local.values()) != len(criticals)
    ):
        result["ok"] = False
    if statuses[Status.DELIVERED] != len(criticals):
        result["ok"] = False
    world.stop_dispatchers()
    return result


def scenario_agent_standby(world: World, tmp_dir: str) -> dict[str, Any]:
    """The site agent is killed with its disk lost, and a standby takes over from the replica."""
    from sites.agent.standby import RPO_SECONDS, StandbyError, find_litestream
    from tests.support.standby import PrimarySite, measured_rpo, restore

    title = "agent killed with its disk lost, standby takes over"
    try:
        find_litestream()
    except StandbyError as error:
        return {"scenario": title, "skipped": str(error)}
    started = time.monotonic()
    world.start_dispatchers(2)
    base = Path(tmp_dir) / "standby"
    link = TcpProxy(world.web.port)  # the primary's link: cut mid-way, so a backlog builds up
    total = 150 if world.short else 400
    try:
        primary = PrimarySite(base / "primary", base / "replica", central_url=link.url, key=world.key).start()
        poll(lambda: len(primary.acknowledged()) >= total // 3, timeout=120, message="the primary did not send")
        link.cut()
        poll(lambda: len(primary.acknowledged()) >= total, timeout=120, message="the primary did not send")
        died = primary.die()
    finally:
        link.close()
    acks = primary.acknowledged()
    ids = [notification_id for notification_id, _ in acks]
    close_old_connections()
    before = {str(pk) for pk in Notification.objects.filter(pk__in=ids).values_list("pk", flat=True)}
    standby_db = base / "standby" / "buffer.sqlite3"
    restore(standby_db, base / "replica")
    with SiteOutbox(standby_db, world.url, world.key, retry_interval=0.2, timeout=5) as standby:
        kept = {row.notification_id for row in standby.buffer.due(now="9999", limit=1_000_000)}
        poll(
            lambda: standby.forward_once() is not None and standby.stats()["buffered"] == 0,
            timeout=120,
            interval=0.2,
            message="the standby did not drain",
        )
    close_old_connections()
    at_central = {str(pk) for pk in Notification.objects.filter(pk__in=ids).values_list("pk", flat=True)}
    required = {notification_id for notification_id, moment in acks if moment <= died - RPO_SECONDS}
    within = {notification_id for notification_id, moment in acks if moment > died - RPO_SECONDS}
    rpo = measured_rpo(acks, died=died, kept=kept | before)
    result = evaluate(
        title,
        world,
        acked=required | (within & at_central),
        started=started,
        note=(
            f"{len(acks)} acknowledged by send(): {len(before)} forwarded by the primary before its link was cut, "
            f"{len(kept)} restored and forwarded by the standby; {len(within)} within the {RPO_SECONDS:g} s RPO "
            f"of the kill, {len(within - at_central)} of them lost; measured RPO {rpo} s"
        ),
    )
    if rpo > RPO_SECONDS:
        result["ok"] = False
    world.stop_dispatchers()
    return result


def scenario_poison_smtp_reply(world: World) -> dict[str, Any]:
    """The SMTP server accepts one message in ten with a NUL byte in its 250 reply."""
    started = time.monotonic()
    world.smtp.poison_marker = "POISON"
    try:
        world.start_dispatchers(2)
        count = 300 if world.short else 1000
        ledger = run_load(
            world,
            seconds=count / 100,
            rate=100,
            limit=count,
            make=lambda nid: notification(nid, subject=f"{'POISON ' if int(nid[-1], 16) < 2 else ''}Pump {nid[:8]}"),
        )
        ids = ledger.ids("ack")
        poisoned = sum(1 for nid in ids if int(nid[-1], 16) < 2)
        result = evaluate(
            "poison SMTP reply",
            world,
            acked=ids,
            started=started,
            note=f"{poisoned} replies carried a NUL byte; each delivered once, stored escaped",
        )
    finally:
        world.smtp.poison_marker = None
        world.stop_dispatchers()
    return result


def scenario_poison_in_site_batch(world: World, tmp_dir: str) -> dict[str, Any]:
    """A site buffer holds notifications central cannot parse (type_data nested thousands deep,
    as an agent without today's checks stored them) among innocent ones, forwarded in batches."""
    started = time.monotonic()
    world.start_dispatchers(2)
    outbox = SiteOutbox(Path(tmp_dir) / "poison.sqlite3", world.url, world.key, retry_interval=0.2, batch_size=50)
    innocent: list[str] = []
    poison: list[str] = []
    count = 200 if world.short else 1000
    try:
        notifier = outbox.notify("Operators")
        for n in range(count):
            if n % 50 == 17:
                poison_id = str(uuid.uuid4())
                depth = 5000
                payload = (
                    f'{{"notification_id": "{poison_id}", "list_name": "Operators", "subject": "poison {n}", '
                    f'"body": "x", "type_data": {"[" * depth}{"]" * depth}, "site_enqueued_at": "2026-11-21T10:00:00Z"}}'
                )
                outbox.buffer.insert(notification_id=poison_id, payload=payload, created_at="2026-11-21T10:00:00Z")
                poison.append(poison_id)
            else:
                innocent.append(notifier.send(f"Innocent {n}", "in a batch with a poison row"))
        for _ in range(20):
            outbox.forward_once()
            if outbox.stats()["buffered"] == 0:
                break
        stats = outbox.stats()
    finally:
        outbox.close()
    close_old_connections()
    stored_poison = Notification.objects.filter(pk__in=poison).count()
    result = evaluate(
        "poison notification in a site batch",
        world,
        acked=innocent,
        started=started,
        note=f"{len(poison)} poison rows parked at the site ({stats['parked']} parked), {stored_poison} at central; "
        f"{len(innocent)} innocent rows forwarded",
    )
    if stats["parked"] != len(poison) or stats["buffered"] or stored_poison:
        result["ok"] = False
    world.stop_dispatchers()
    return result


# --- resilience: long outage, authentication failure, throttling relay -----------------------


def in_flight(smtp: SmtpServer | WebhookReceiver, ids: Iterable[str]) -> set[str]:
    """Ids the SMTP server has received but the table does not yet record Delivered: a message
    whose reply is lost when the server goes away now may be sent again."""
    close_old_connections()
    received = {nid for nid in smtp.count_by_notification_id() if nid}
    recorded = {
        str(pk)
        for pk in Notification.objects.filter(pk__in=list(ids), status=Status.DELIVERED).values_list("pk", flat=True)
    }
    return received - recorded


def attempts_per_row(ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``{id: (failed attempts, of which probes)}`` for every row of ``ids`` that failed."""
    per_row: dict[str, list[int]] = {}
    failed = DeliveryAttempt.objects.filter(notification_id__in=list(ids)).exclude(failure_class="")
    for notification_id, detail in failed.values_list("notification_id", "detail"):
        counts = per_row.setdefault(str(notification_id), [0, 0])
        counts[0] += 1
        counts[1] += 1 if (detail or {}).get("probe") else 0
    return {nid: (failed_count, probes) for nid, (failed_count, probes) in per_row.items()}


def scenario_long_outage(world: World) -> dict[str, Any]:
    """The SMTP server is down for 5 × max_attempts × interval (15 s), then back: nothing parks,
    every row is delivered once, and a row fails at most once plus the probes it carried."""
    started = time.monotonic()
    max_attempts, interval = 3, 1
    outage = 5 * max_attempts * interval
    world.policy(max_attempts=max_attempts, interval_seconds=interval, breaker_max_cooldown_seconds=4)
    world.start_dispatchers(2)
    ids: list[str] = []
    flight: set[str] = set()
    opened: list[bool] = []

    def down_and_back() -> None:
        time.sleep(1)
        flight.update(in_flight(world.smtp, ids))
        world.smtp.stop()
        time.sleep(outage / 2)
        close_old_connections()
        opened.append(ChannelHealth.objects.exclude(state=ChannelHealth.State.CLOSED).exists())
        time.sleep(outage / 2)
        world.smtp.start()
        connection.close()

    ledger = Ledger()
    load = LoadGenerator(world.url, world.key, ledger, rate=40, duration=4 if world.short else 10, limit=400).start()
    outage_thread = threading.Thread(target=down_and_back)
    outage_thread.start()
    load.join()
    resend_until_acked(world.url, world.key, ledger, deadline_seconds=120)
    ids += ledger.ids("ack")
    outage_thread.join()
    result = evaluate(
        f"long SMTP outage ({outage} s = 5 x {max_attempts} x {interval} s)",
        world,
        acked=ids,
        dup_bound=len(flight),
        started=started,
    )
    per_row = attempts_per_row(ids)
    probes = DeliveryAttempt.objects.filter(notification_id__in=ids, detail__probe=True).count()
    most = max((failed for failed, _ in per_row.values()), default=0)
    beyond_bound = [nid for nid, (failed, carried) in per_row.items() if failed > 1 + carried]
    result["note"] = (
        f"channel open during the outage: {bool(opened and opened[0])}; {probes} probes; "
        f"{sum(f for f, _ in per_row.values())} failed attempts on {len(per_row)} of {len(ids)} rows; "
        f"most failed attempts of one row {most}; rows beyond 1 + their probes: {len(beyond_bound)}; "
        f"dup bound = messages in flight when the server stopped"
    )
    if beyond_bound or not (opened and opened[0]):
        result["ok"] = False
    world.stop_dispatchers()
    world.policy()
    return result


def scenario_auth_failure(world: World) -> dict[str, Any]:
    """The relay refuses our password (535) until it is fixed: nothing parks, the channel shows
    open with class auth, everything is delivered once the password is saved."""
    started = time.monotonic()
    relay = SmtpServer(auth=("outbox", "right-password"), keep_content=False).start()
    world.point_smtp_at(relay.port, username="outbox", password="expired-password")
    world.policy()
    world.start_dispatchers(2)
    ledger = run_load(world, seconds=3 if world.short else 8, rate=40)
    ids = ledger.ids("ack")
    poll(
        lambda: ChannelHealth.objects.filter(state__in=["open", "half_open"], last_failure_class="auth").exists(),
        timeout=30,
        message="the channel did not open for the authentication failure",
    )
    time.sleep(3)  # a few probes, all refused
    close_old_connections()
    shown = [c for c in kpis_compute()["channels"] if c["channel"] == "email"]
    parked_while_refused = Notification.objects.filter(pk__in=ids, status=Status.PARKED).count()
    world.point_smtp_at(relay.port, username="outbox", password="right-password")  # the fix
    fixed_at = time.monotonic()
    result = evaluate("SMTP auth failure (535 until fixed)", world, acked=ids, started=started, smtp=Mailboxes(relay))
    recovery = time.monotonic() - fixed_at
    entry = shown[0] if shown else {}
    result["note"] = (
        f"KPI channels while refused: state {entry.get('state')}, class {entry.get('last_failure_class')}, "
        f"{entry.get('rows_waiting')} rows waiting, {entry.get('probes')} probes; parked while refused "
        f"{parked_while_refused}; all delivered {recovery:.1f} s after the password was saved"
    )
    if entry.get("last_failure_class") != "auth" or parked_while_refused:
        result["ok"] = False
    world.stop_dispatchers()
    relay.stop()
    world.point_smtp_at(world.smtp.port)
    world.policy()
    return result


def scenario_throttling_relay(world: World) -> dict[str, Any]:
    """The relay answers 421 4.7.0 above 10 messages in 5 s (120/min). Without a rate limit its
    refusals are waited out (nothing parks); with rate_per_minute 80 the attempts started in
    every window stay within the bucket's bound, the relay's rate is kept and it never has to
    refuse."""
    started = time.monotonic()
    limit, window = 10, 5.0
    # Short: 24 rows still overrun the relay unpaced (posted within a second) and take 18 s paced.
    count = 24 if world.short else 120
    world.smtp.behave("throttle", limit=limit, window_seconds=window)
    # Phase 1: no rate limit: the relay refuses, the rows wait, everything arrives.
    world.policy()
    world.start_dispatchers(2)
    first = run_load(world, seconds=count / 40, rate=40, limit=count)
    first_ids = first.ids("ack")
    drain(first_ids, timeout=240)
    refused_unpaced = world.smtp.throttled
    world.stop_dispatchers()
    # Phase 2: rate_per_minute below the relay's rate, with a margin for the time a message
    # takes from its start to the relay: nothing to refuse.
    rate = 80
    world.policy(rate_per_minute=rate)
    time.sleep(window)  # the relay's window forgets phase 1
    throttled_before = world.smtp.throttled
    world.smtp.accepted_times.clear()
    world.start_dispatchers(2)
    second = run_load(world, seconds=count / 40, rate=40, limit=count)
    second_ids = second.ids("ack")
    ids = first_ids + second_ids
    result = evaluate(f"throttling relay (421 4.7.0 above {limit}/{window:g} s)", world, acked=ids, started=started)
    refused_paced = world.smtp.throttled - throttled_before
    most = world.smtp.most_accepted_in_any(window)
    per_minute = world.smtp.most_accepted_in_any(60.0)
    # What the rate limit itself promises: attempts started (as recorded) in any window.
    starts = sorted(
        moment.timestamp()
        for moment in DeliveryAttempt.objects.filter(notification_id__in=second_ids).values_list(
            "started_at", flat=True
        )
    )
    started_most = max(
        (sum(1 for other in starts[i:] if other - moment < window) for i, moment in enumerate(starts)), default=0
    )
    bound = rate / 60 * window + max(1, -(-rate // 60))
    result["note"] = (
        f"unpaced: relay refused {refused_unpaced}, parked 0 of {len(first_ids)}; paced at {rate}/min: "
        f"attempts started in any {window:g} s at most {started_most} (bucket bound {bound:g}), relay accepted "
        f"at most {most} in any {window:g} s (it allows {limit}) and refused {refused_paced}; "
        f"most in any 60 s {per_minute}"
    )
    if refused_unpaced == 0 or refused_paced or most > limit or started_most > bound:
        result["ok"] = False
    world.stop_dispatchers()
    world.smtp.behave("refuse", refuse={DOOMED})
    world.policy()
    return result


def scenario_webhook_down(world: World) -> dict[str, Any]:
    """The webhook receiver is down for a while, then back: nothing lost, nothing parked."""
    started = time.monotonic()
    receiver = WebhookReceiver().start()
    hooks = NotificationList.objects.create(name="Hooks")
    secret = new_webhook_secret()
    receiver.secrets["/hook"] = secret
    WebhookTarget.objects.create(notification_list=hooks, url=receiver.url("/hook"), secret=secret)
    DeliveryPolicy.objects.update_or_create(channel="webhook", defaults=CHAOS_POLICY)
    world.start_dispatchers(2)
    ids: list[str] = []
    flight: set[str] = set()
    opened: list[bool] = []

    def down_and_back() -> None:
        time.sleep(1)
        flight.update(in_flight(receiver, ids))
        receiver.stop()
        time.sleep(6)
        close_old_connections()
        opened.append(
            ChannelHealth.objects.filter(channel="webhook").exclude(state=ChannelHealth.State.CLOSED).exists()
        )
        receiver.start()
        connection.close()

    def make(notification_id: str) -> dict[str, Any]:
        return {**notification(notification_id, list_name="Hooks"), "type": "webhook"}

    ledger = Ledger()
    load = LoadGenerator(
        world.url, world.key, ledger, rate=40, duration=4 if world.short else 8, limit=320, make=make
    ).start()
    outage_thread = threading.Thread(target=down_and_back)
    outage_thread.start()
    load.join()
    resend_until_acked(world.url, world.key, ledger, deadline_seconds=120)
    ids += ledger.ids("ack")
    outage_thread.join()
    result = evaluate(
        "webhook receiver down, then back (6 s)",
        world,
        acked=ids,
        dup_bound=len(flight),
        started=started,
        smtp=OneHook(receiver),
    )
    unverified = sum(1 for record in receiver.received if record.verified is not True)
    result["note"] = (
        f"channel open during the outage: {bool(opened and opened[0])}; {unverified} requests failed "
        "signature verification; dup bound = requests in flight when the receiver stopped"
    )
    if unverified:
        result["ok"] = False
    world.stop_dispatchers()
    receiver.stop()
    return result


# --- outages of other shapes: relay-wide refusals, a 503 receiver, a site cut off, a new relay --


def shift_list() -> str:
    """A list of three members (the breaker recognises a relay-wide answer from three
    notifications to three recipients); its name."""
    shift, created = NotificationList.objects.get_or_create(name="Shift")
    if created:
        for member in ("lead1", "lead2", "lead3"):
            EmailRecipient.objects.create(notification_list=shift, email=f"{member}@chaos.invalid")
    return shift.name


def _email_health_during(outage: float, marks: list[str]) -> None:
    """Half way through ``outage``: note the email endpoint's state and last error."""
    time.sleep(outage / 2)
    close_old_connections()
    marks.extend(
        f"{row.state}: {row.last_error[:60]}"
        for row in ChannelHealth.objects.filter(channel="email").exclude(state=ChannelHealth.State.CLOSED)
    )
    time.sleep(outage / 2)


def own_failures_most(ids: Iterable[str]) -> int:
    """The most failed attempts charged to one row (not the channel's)."""
    charged = Notification.objects.filter(pk__in=list(ids)).values_list("retry_count", "channel_failures")
    return max((tried - channel for tried, channel in charged), default=0)


def scenario_relay_wide_451(world: World) -> dict[str, Any]:
    """The relay answers 451 4.3.5 to every recipient (a lookup table or policy service down) for
    5 × max_attempts × interval, then recovers: the breaker opens relay-wide, nothing parks, every
    member receives every row once, with no operator action. For a second before, the lookup
    fails for two of the three members only: those rows reach the members in two transactions."""
    started = time.monotonic()
    max_attempts, interval = 3, 1
    outage = 5 * max_attempts * interval
    world.policy(max_attempts=max_attempts, interval_seconds=interval)
    list_name = shift_list()
    world.start_dispatchers(2)
    marks: list[str] = []

    def refused_then_back() -> None:
        # Once the dispatchers deliver (they take a moment to start), the lookup fails for two
        # of the members first: rows delivered to lead1 now and to the others after the outage,
        # in two transactions.
        poll(lambda: world.smtp.count > 0, timeout=30, message="the dispatchers delivered nothing")
        world.smtp.rcpt_replies = {"lead2@chaos.invalid": LOOKUP_DOWN, "lead3@chaos.invalid": LOOKUP_DOWN}
        time.sleep(1)
        world.smtp.rcpt_reply = LOOKUP_DOWN
        _email_health_during(outage, marks)
        world.smtp.rcpt_replies = {}
        world.smtp.rcpt_reply = None
        connection.close()

    ledger = run_load(
        world,
        seconds=4 if world.short else 10,
        rate=20,
        make=lambda nid: notification(nid, list_name=list_name),
        during=lambda: threading.Thread(target=refused_then_back).start(),
    )
    time.sleep(max(0.0, outage + 2.5 - (time.monotonic() - started)))  # the refusals last their time
    ids = ledger.ids("ack")
    result = evaluate(
        f"relay-wide 451 4.3.5 ({outage} s = 5 x {max_attempts} x {interval} s)", world, acked=ids, started=started
    )
    relay_wide = [mark for mark in marks if "relay-wide 451 4.3.5" in mark]
    # A row whose RCPT TO commands straddled the start or end of the refusals reached some
    # members in one transaction and the rest in a later one: every member must have it once.
    copies = world.smtp.copies_by_notification_and_recipient()
    members = [f"{member}@chaos.invalid" for member in ("lead1", "lead2", "lead3")]
    missing = sum(1 for nid in ids for member in members if copies[(nid, member)] == 0)
    acked = set(ids)
    split = sum(1 for nid, n in world.smtp.count_by_notification_id().items() if nid in acked and n > 1)
    result["note"] = (
        f"channel during the refusals: {marks[0] if marks else 'closed'}; most attempts charged to one row "
        f"{own_failures_most(ids)} (parks at {max_attempts}); rows delivered in two transactions {split}; "
        f"member copies missing {missing}"
    )
    if not relay_wide or missing:
        result["ok"] = False
    world.stop_dispatchers()
    world.policy()
    return result


def scenario_webhook_503(world: World) -> dict[str, Any]:
    """A receiver behind a proxy answers 503 to every request on the list's single hook for
    5 × max_attempts × interval, then recovers: the webhook breaker opens relay-wide, nothing
    parks, the hook receives every row once."""
    max_attempts, interval = 3, 1
    outage = 5 * max_attempts * interval
    receiver = WebhookReceiver().start()
    hooks, _ = NotificationList.objects.get_or_create(name="Hooks503")
    path = "/only"
    secret = new_webhook_secret()
    receiver.secrets[path] = secret
    WebhookTarget.objects.create(notification_list=hooks, url=receiver.url(path), secret=secret)
    DeliveryPolicy.objects.update_or_create(
        channel="webhook", defaults={**CHAOS_POLICY, "max_attempts": max_attempts, "interval_seconds": interval}
    )

    def make(notification_id: str) -> dict[str, Any]:
        return {**notification(notification_id, list_name="Hooks503"), "type": "webhook"}

    world.start_dispatchers(2)
    # The outage starts once the dispatchers deliver (on a loaded machine they take seconds to
    # start): one notification through first, left out of the count.
    run_load(world, seconds=1, rate=1, limit=1, make=make)
    for _ in range(600):
        if receiver.accepted_by_notification_id(path):
            break
        time.sleep(0.1)
    receiver.reset()
    started = time.monotonic()
    marks: list[str] = []

    def unavailable_then_back() -> None:
        time.sleep(1)
        receiver.script(path, [Reply(503, "Service Unavailable")])
        # Watched through the outage (the breaker is open between probes, closed for a moment
        # when nothing is waiting): what the endpoint's failure was while it was open.
        close_old_connections()
        end = time.monotonic() + outage
        while time.monotonic() < end and not marks:
            marks.extend(
                row.last_error[:60]
                for row in ChannelHealth.objects.filter(channel="webhook").exclude(state=ChannelHealth.State.CLOSED)
            )
            time.sleep(0.2)
        time.sleep(max(0.0, end - time.monotonic()))
        receiver.script(path, [Reply(200)])
        connection.close()

    ledger = run_load(
        world,
        seconds=4 if world.short else 10,
        rate=20,
        make=make,
        during=lambda: threading.Thread(target=unavailable_then_back).start(),
    )
    time.sleep(max(0.0, outage + 1.5 - (time.monotonic() - started)))
    ids = ledger.ids("ack")
    result = evaluate(
        f"webhook receiver 503 ({outage} s = 5 x {max_attempts} x {interval} s)",
        world,
        acked=ids,
        started=started,
        smtp=OneHook(receiver, accepted_at=path),
    )
    result["note"] = (
        f"webhook channel during the outage: {marks[0] if marks else 'closed'}; "
        f"most attempts charged to one row {own_failures_most(ids)} (parks at {max_attempts})"
    )
    if not any(mark.startswith("relay-wide HTTP 503") for mark in marks):
        result["ok"] = False
    world.stop_dispatchers()
    receiver.stop()
    return result


def _agent_forwarder(db: Path, central_url: str, key: str, *, max_retries: int, retry_interval: float) -> Any:
    """A real site agent process (python -m sites.agent … forward) forwarding ``db``'s buffer."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sites.agent",
            "--db",
            str(db),
            "--central-url",
            central_url,
            "--key",
            key,
            "forward",
            "--retry-interval",
            str(retry_interval),
            "--max-retries",
            str(max_retries),
            "--sweep-interval",
            "0.5",
            "--timeout",
            "2",
            "--heartbeat-interval",
            "1",
            "--quiet",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def scenario_central_unreachable(world: World, tmp_dir: str) -> dict[str, Any]:
    """A site agent (a real process) cannot reach central for 5 × max_retries × retry_interval
    while its scripts keep sending; then the link is back: nothing parks at the site, every row
    is delivered once, with no operator action."""
    started = time.monotonic()
    max_retries, retry_interval = (3, 0.5) if world.short else (5, 1.0)
    outage = 5 * max_retries * retry_interval
    world.start_dispatchers(2)
    link = TcpProxy(world.web.port)
    db = Path(tmp_dir) / "cut-off-site.sqlite3"
    agent = _agent_forwarder(db, link.url, world.key, max_retries=max_retries, retry_interval=retry_interval)
    site = SiteOutbox(db, None, None)  # the plant's scripts: they only write to the buffer
    ids: list[str] = []
    try:
        notifier = site.notify("Operators")
        ids += [notifier.send(f"Before the cut {n}", "site link test") for n in range(20)]
        poll(lambda: site.stats()["buffered"] == 0, timeout=60, interval=0.2, message="the agent forwarded nothing")
        link.cut()
        cut_at = time.monotonic()
        n = 0
        while time.monotonic() - cut_at < outage:
            ids.append(notifier.send(f"During the cut {n}", "site link test"))
            n += 1
            time.sleep(0.2)  # the plant's alarm rate during the outage
        parked_during = site.stats()["parked"]
        link.restore()
        poll(
            lambda: site.stats()["buffered"] == 0, timeout=120, interval=0.2, message="the site's buffer never drained"
        )
        stats = site.stats()
    finally:
        stop(agent)
        site.close()
        link.close()
    result = evaluate(
        f"central unreachable from a site ({outage:g} s = 5 x {max_retries} x {retry_interval:g} s)",
        world,
        acked=ids,
        started=started,
        note=f"parked at the site during the cut {parked_during}, after {stats['parked']}; "
        f"{len(ids) - 20} sent during the cut",
    )
    if parked_during or stats["parked"]:
        result["ok"] = False
    world.stop_dispatchers()
    return result


def _post_batches(world: World, key: str, ledger: Ledger, payloads: list[dict[str, Any]], *, size: int) -> None:
    """Post ``payloads`` in batches of ``size`` with ``key``, logging each item's outcome: a
    created or replayed item is acked, a rejected one refused; every item of a batch answered
    otherwise (a 429, a 5xx, no answer) is indeterminate and re-sent later, one by one."""
    import http.client

    connection_ = http.client.HTTPConnection("127.0.0.1", world.web.port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
    for start in range(0, len(payloads), size):
        chunk = payloads[start : start + size]
        try:
            connection_.request("POST", "/api/v1/notifications/batch/", json.dumps({"notifications": chunk}), headers)
            response = connection_.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            connection_.close()
            for payload in chunk:
                ledger.record(payload, "indeterminate")
            continue
        results = json.loads(body)["results"] if response.status == 200 else [{"result": "failed"}] * len(chunk)
        for payload, result in zip(chunk, results, strict=True):
            outcome = {"created": "ack", "replayed": "ack", "rejected": "reject"}.get(result["result"], "indeterminate")
            ledger.record(payload, outcome)
    connection_.close()


def scenario_flood_from_one_site(world: World) -> dict[str, Any]:
    """One site floods central with batches while another sends critical notifications."""
    started = time.monotonic()
    flood_site = Site.objects.get_or_create(site_id="flood-site", defaults={"name": "Flood"})[0]
    flood_key = site_key_issue(site=flood_site)[1]
    world.start_dispatchers(2)
    flood_ledger, critical_ledger = Ledger(), Ledger()
    count = 2000 if world.short else 10_000
    flood = [notification(str(uuid.uuid4())) for _ in range(count)]
    critical_load = LoadGenerator(
        world.url,
        world.key,
        critical_ledger,
        rate=4,
        duration=3600,
        limit=100_000,
        threads=1,
        make=lambda nid: {**notification(nid), "priority": "critical"},
    ).start()
    _post_batches(world, flood_key, flood_ledger, flood, size=500)
    resend_until_acked(world.url, flood_key, flood_ledger, deadline_seconds=120)
    drain(flood_ledger.ids("ack"), timeout=600)  # the criticals keep coming while the flood drains
    critical_load.stop()
    resend_until_acked(world.url, world.key, critical_ledger, deadline_seconds=120)
    critical = critical_ledger.ids("ack")
    drain(critical)
    close_old_connections()
    delivered_rows = Notification.objects.filter(pk__in=critical, delivered_at__isnull=False)
    waits = sorted(
        (delivered - created).total_seconds()
        for created, delivered in delivered_rows.values_list("created_at", "delivered_at")
        if delivered is not None
    )
    p99 = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))] if waits else float("nan")
    flood_seconds = time.monotonic() - started
    result = evaluate(
        "flood from one site, critical from another",
        world,
        acked=[*flood_ledger.ids("ack"), *critical],
        rejected=len(flood_ledger.ids("reject")) + len(critical_ledger.ids("reject")),
        started=started,
        note=(
            f"{count} flooded in batches of 500 while {len(critical)} critical notifications came from another site "
            f"(4/s); critical ingest→delivered p99 {p99:.2f} s (max {max(waits, default=float('nan')):.2f} s) "
            f"while the flood took {flood_seconds:.0f} s to deliver"
        ),
    )
    result["critical_p99_seconds"] = round(p99, 3)
    world.stop_dispatchers()
    return result


def channel_open_metric(url: str) -> float | None:
    """``outbox_channel_open{channel="email"}`` as central's /metrics says (from loopback)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r'^outbox_channel_open\{channel="email"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def scenario_relay_reconfigured(world: World) -> dict[str, Any]:
    """The relay goes down; while its endpoint is open an administrator points the SMTP
    configuration at another relay: no endpoint is left open, outbox_channel_open is back to
    0, and every row is delivered once."""
    started = time.monotonic()
    other = SmtpServer(keep_content=False).start()
    other.behave("refuse", refuse={DOOMED})
    world.start_dispatchers(2)
    flight: set[str] = set()
    seen_open: list[float | None] = []
    ids: list[str] = []

    def down_then_moved() -> None:
        time.sleep(1)
        flight.update(in_flight(world.smtp, ids))
        world.smtp.stop()
        close_old_connections()
        poll(
            lambda: ChannelHealth.objects.exclude(state=ChannelHealth.State.CLOSED).exists(),
            timeout=30,
            message="the old relay's endpoint never opened",
        )
        time.sleep(1)  # long enough for a scrape to see it open
        seen_open.append(channel_open_metric(world.url))
        world.point_smtp_at(other.port)  # saved as an administrator would
        connection.close()

    ledger = run_load(
        world, seconds=4 if world.short else 8, rate=40, during=lambda: threading.Thread(target=down_then_moved).start()
    )
    ids += ledger.ids("ack")
    poll(lambda: bool(seen_open), timeout=60, message="the relay was never replaced")
    result = evaluate(
        "relay reconfigured during an outage",
        world,
        acked=ids,
        dup_bound=len(flight),
        started=started,
        smtp=Mailboxes(world.smtp, other),
    )
    close_old_connections()
    left_open = list(ChannelHealth.objects.exclude(state=ChannelHealth.State.CLOSED).values_list("endpoint", flat=True))
    # A scrape's figures are cached for OUTBOX_METRICS_CACHE_SECONDS (5 s): give it a few.
    metric = channel_open_metric(world.url)
    deadline = time.monotonic() + 30
    while metric != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        metric = channel_open_metric(world.url)
    result["note"] = (
        f"outbox_channel_open while the old relay was down {seen_open[0]}, after the change {metric}; "
        f"endpoints left open {left_open or 'none'}; dup bound = messages in flight when the relay stopped"
    )
    if left_open or metric != 0 or seen_open[0] != 1:
        result["ok"] = False
    world.stop_dispatchers()
    world.smtp.start()
    world.point_smtp_at(world.smtp.port)
    other.stop()
    return result


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "same-ids": scenario_same_ids,
    "web-kill": scenario_web_kill,
    "postgres-restart": scenario_postgres_restart,
    "dispatcher-kill": scenario_dispatcher_kill,
    "smtp-down": scenario_smtp_down,
    "smtp-hang": scenario_smtp_hang,
    "smtp-transient": scenario_smtp_transient_codes,
    "smtp-permanent": scenario_smtp_permanent_codes,
    "clock-skew": scenario_clock_skew,
    "operator-race": scenario_operator_race,
    "agent-link": scenario_agent_link,
    "agent-standby": scenario_agent_standby,
    "wan-cut-critical": scenario_wan_cut_critical,
    "poison-smtp-reply": scenario_poison_smtp_reply,
    "poison-site-batch": scenario_poison_in_site_batch,
    "long-outage": scenario_long_outage,
    "auth-failure": scenario_auth_failure,
    "throttling-relay": scenario_throttling_relay,
    "webhook-down": scenario_webhook_down,
    "relay-wide-451": scenario_relay_wide_451,
    "webhook-503": scenario_webhook_503,
    "central-unreachable": scenario_central_unreachable,
    "relay-reconfigured": scenario_relay_reconfigured,
    "flood-site": scenario_flood_from_one_site,
}
# Scenarios that need the run's temporary directory (a site buffer).
NEEDS_TMP_DIR = {"agent-link", "agent-standby", "poison-site-batch", "central-unreachable", "wan-cut-critical"}


def print_table(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'scenario':52} {'acked':>6} {'lost':>5} {'late':>5} {'unexp':>6} {'dups':>5} {'bound':>6} "
        f"{'non-term':>8} {'parked':>6} {'expect':>6} {'secs':>6}  ok"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        if "skipped" in r:
            print(f"{r['scenario']:52} skipped: {r['skipped']}")
            continue
        print(
            f"{r['scenario']:52} {r['acked']:>6} {r['lost']:>5} {r.get('late', 0):>5} {r['unexpected']:>6} "
            f"{r['duplicates']:>5} {r['dup_bound']:>6} {r['non_terminal']:>8} {r['parked']:>6} "
            f"{r['expected_parked']:>6} {r['seconds']:>6}  {'yes' if r['ok'] else 'NO'}"
        )
    for r in results:
        if r.get("note"):
            print(f"  {r['scenario']}: {r['note']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="smaller loads and fewer faults (CI)")
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")

    world = World(short=args.short)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-chaos-") as tmp_dir:
            for name in names:
                function = SCENARIOS[name]
                print(f"== {name}: {(function.__doc__ or '').splitlines()[0]}", flush=True)
                world.smtp.reset()
                result = function(world, tmp_dir) if name in NEEDS_TMP_DIR else function(world)
                if result is not None:
                    results.append(result)
                    print(f"   {json.dumps({k: v for k, v in result.items() if k != 'note'})}", flush=True)
    finally:
        world.close()
    print_table(results)
    out = ROOT / "bench-results" / "chaos.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"short": args.short, "results": results}, indent=2))
    failed = [r for r in results if "skipped" not in r and not r["ok"]]
    skipped = [r for r in results if "skipped" in r]
    print(
        f"\n{len(results) - len(failed) - len(skipped)} of {len(results)} scenarios passed"
        f"{f', {len(skipped)} skipped' if skipped else ''}; wrote {out.relative_to(ROOT)}"
        f"{'; failed: ' + ', '.join(r['scenario'] for r in failed) if failed else ''}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
