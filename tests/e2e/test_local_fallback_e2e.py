"""End to end, the site speaks while central cannot be reached: a real agent process
(``python -m sites.agent forward`` with a local fallback), real central (gunicorn on the
PostgreSQL test database) that is stopped and started again, a real dispatcher, central's SMTP
server and the plant's own relay (both aiosmtpd on loopback).

Time is compressed: the fallback starts after 3 s without central instead of 5 minutes, and the
agent sweeps every 0.5 s."""

import json
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from notifications.models import EmailRecipient, Notification, NotificationList
from sites.agent import SiteOutbox
from sites.models import Site
from sites.services import site_key_issue
from tests.agent.local_relay import LocalRelay
from tests.dispatch.conftest import configure_smtp
from tests.support.processes import ROOT, Central, child_env, free_port, manage, poll, stop
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.slow
Status = Notification.Status
AFTER_SECONDS = 3
SWEEP_SECONDS = 0.5
# The agent stamps its own times to the microsecond: "…unreachable from site plant-e2e since <ts>".
UNREACHABLE_SINCE = re.compile(r"unreachable from site \S+ since (\S+Z)")


@pytest.fixture
def world(transactional_db, postgres_only, settings, tmp_path):
    """Central's SMTP server and configuration, a list, a site and its key, a dispatcher
    process, the plant's relay, and central's address (central itself is not running)."""
    settings.OUTBOX_DISPATCH_TRIGGER = False  # the dispatcher below does the delivering
    with SmtpServer(keep_content=False) as smtp, LocalRelay() as relay:
        configure_smtp(smtp, timeout_seconds=5, max_retries=10, retry_interval_seconds=1)
        operators = NotificationList.objects.create(name="Operators")
        EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
        site = Site.objects.create(site_id="plant-e2e", name="Plant E2E")
        _, key = site_key_issue(site=site)
        dispatcher = manage("dispatch", OUTBOX_DISPATCH_INTERVAL=0.2)
        try:
            yield {
                "smtp": smtp,
                "relay": relay,
                "key": key,
                "list": operators,
                "port": free_port(),
                "db": tmp_path / "buffer.sqlite3",
                "config": tmp_path / "agent.json",
            }
        finally:
            stop(dispatcher)


def forwarder(world):
    """The site's forward service, with the plant's relay as its fallback."""
    world["config"].write_text(
        json.dumps(
            {
                "db": str(world["db"]),
                "central_url": f"http://127.0.0.1:{world['port']}",
                "key": world["key"],
                "site_id": "plant-e2e",
                "sweep_interval": SWEEP_SECONDS,
                "retry_interval": SWEEP_SECONDS,
                "heartbeat_interval": 1,
                "timeout": 2,
                "fallback": world["relay"].settings(after_seconds=AFTER_SECONDS),
            }
        )
    )
    command = [sys.executable, "-m", "sites.agent", "--config", str(world["config"]), "forward", "--quiet"]
    return subprocess.Popen(command, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def raise_alarms(world):
    """A site script raises a critical alarm and a normal notice; returns their ids."""
    with SiteOutbox(world["db"], None, None) as outbox:
        critical = outbox.notify("Operators").send("Gas detector 4 high", "H2S 25 ppm", priority="critical")
        normal = outbox.notify("Operators").send("Shift report ready", "See the HMI.")
    return critical, normal


def local_status(world, notification_id):
    """The notification as the site's buffer has it."""
    with SiteOutbox(world["db"], None, None) as outbox:
        return outbox.status(notification_id)


def relay_quiet_for(relay, seconds):
    """Wait ``seconds``; True when the relay received nothing meanwhile."""
    before = relay.data_calls
    time.sleep(seconds)
    return relay.data_calls == before


def delivered(ids):
    return Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == len(ids)


def at_iso(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("resend", [False, True], ids=["central-does-not-resend", "list-resends"])
def test_with_central_stopped_a_critical_alarm_reaches_the_plants_relay_and_central_records_it_once_back(world, resend):
    world["list"].resend_after_local_delivery = resend
    world["list"].save()
    critical, normal = raise_alarms(world)
    agent = forwarder(world)  # central is stopped: nothing listens on its port
    try:
        relay = world["relay"]
        poll(lambda: relay.ids()[critical] == 1, timeout=30, message="the critical alarm never reached the relay")
        (message,) = relay.messages
        said = UNREACHABLE_SINCE.search(message.get_content())
        assert said is not None, "the local copy does not say since when central is unreachable"
        since = at_iso(said.group(1))
        poll(
            lambda: local_status(world, critical)["delivered_locally_at"],
            timeout=10,
            message="the agent did not record the local delivery",
        )
        locally = local_status(world, critical)["delivered_locally_at"]
        # Within after_seconds and one sweep of central becoming unreachable (2 s more for a busy host).
        assert AFTER_SECONDS <= (at_iso(locally) - since).total_seconds() <= AFTER_SECONDS + SWEEP_SECONDS + 2
        assert local_status(world, normal)["local_delivery"] is None
        assert not Notification.objects.exists()

        with Central(port=world["port"]):
            poll(lambda: delivered([critical, normal]), timeout=60, message="central did not deliver both")
    finally:
        stop(agent)

    row = Notification.objects.get(pk=critical)
    assert row.delivered_locally_at == at_iso(locally)
    assert relay.ids() == {critical: 1}  # never a second local copy, and the normal one never locally
    expected = {critical: 1, normal: 1} if resend else {normal: 1}  # no second email unless the list asks
    assert world["smtp"].count_by_notification_id() == expected
    assert Notification.objects.count() == 2  # each recorded once


def test_an_agent_killed_mid_fallback_and_restarted_sends_no_second_local_copy(world):
    """(Killed while the relay holds the message's end, the agent never sends it again either:
    tests/agent/test_fallback.py, which need not wait out the 60 s claim here.)"""
    relay = world["relay"]
    critical, normal = raise_alarms(world)
    agent = forwarder(world)
    try:
        poll(lambda: relay.ids()[critical] == 1, timeout=30, message="the critical alarm never reached the relay")
        agent.send_signal(signal.SIGKILL)  # mid-fallback: central still down, the outage goes on
        agent.wait()
        restarted_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        agent = forwarder(world)
        # The restarted agent finds central unreachable for after_seconds again, and goes on sweeping
        # (it tries the critical row first; a sweep stops at the first failure to reach central).
        poll(
            lambda: (
                (local_status(world, critical)["last_attempt_at"] or "") > restarted_at
                and local_status(world, critical)["local_delivery"]["state"] == "delivered"
                and relay_quiet_for(relay, AFTER_SECONDS + 4 * SWEEP_SECONDS)
            ),
            timeout=30,
            message="the restarted agent did not go through the fallback",
        )
        with Central(port=world["port"]):
            poll(lambda: delivered([critical, normal]), timeout=60, message="central did not deliver both")
    finally:
        stop(agent)
    assert relay.ids() == {critical: 1}
    assert Notification.objects.get(pk=critical).delivered_locally_at is not None
    assert world["smtp"].count_by_notification_id() == {normal: 1}
