"""End to end: the site agent forwarding to a real central (gunicorn on the test database),
a real dispatcher process and a real SMTP server. PostgreSQL only (several processes)."""

import signal
import subprocess
import sys

import pytest

from notifications.models import EmailRecipient, Notification, NotificationList
from sites.agent import SiteOutbox
from sites.models import Site
from sites.services import site_key_issue
from tests.dispatch.conftest import configure_smtp
from tests.support.db import database_url
from tests.support.processes import ROOT, Central, child_env, manage, poll, stop
from tests.support.proxy import TcpProxy
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.slow
Status = Notification.Status


@pytest.fixture
def world(transactional_db, postgres_only, settings):
    """SMTP server, configuration, a list, a site and its key; a dispatcher process running."""
    settings.OUTBOX_DISPATCH_TRIGGER = False  # the dispatcher below does the delivering
    with SmtpServer(keep_content=False) as smtp:
        configure_smtp(smtp, timeout_seconds=5, max_retries=10, retry_interval_seconds=1)
        operators = NotificationList.objects.create(name="Operators")
        EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
        site = Site.objects.create(site_id="plant-e2e", name="Plant E2E")
        _, key = site_key_issue(site=site)
        dispatcher = manage("dispatch", OUTBOX_DISPATCH_INTERVAL=0.2)
        try:
            yield {"smtp": smtp, "key": key}
        finally:
            stop(dispatcher)


def agent(tmp_path, url, key, **options):
    options.setdefault("retry_interval", 0)
    return SiteOutbox(tmp_path / "buffer.sqlite3", url, key, **options)


def drain(outbox, *, timeout=60):
    poll(
        lambda: outbox.forward_once() is not None and outbox.stats()["buffered"] == 0,
        timeout=timeout,
        interval=0.1,
        message=f"the site buffer did not drain: {outbox.stats()}",
    )


def all_delivered(ids):
    return Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == len(ids)


def test_500_sent_while_central_is_down_are_all_delivered_once_it_starts(world, tmp_path):
    central = Central()
    outbox = agent(tmp_path, central.url, world["key"])
    ids = [outbox.notify("Operators").send(f"Pump {n} tripped", "Overcurrent") for n in range(500)]
    result = outbox.forward_once()  # central is down: transient, nothing parked, nothing lost
    assert result.forwarded == 0 and result.parked == 0
    assert outbox.stats()["buffered"] == 500

    with central:
        drain(outbox)
        poll(lambda: all_delivered(ids), timeout=60, message="not every notification was delivered")
    assert outbox.stats() == {**outbox.stats(), "buffered": 0, "parked": 0}
    assert world["smtp"].count_by_notification_id() == dict.fromkeys(ids, 1)


def test_central_answering_503_for_a_while_then_recovering_loses_nothing(world, tmp_path, settings):
    # Central reaches PostgreSQL through a proxy we cut: a real "database unavailable" (503).
    db = settings.DATABASES["default"]
    proxy = TcpProxy(int(db.get("PORT") or 5432), db.get("HOST") or "127.0.0.1")
    url = database_url().replace(f":{db.get('PORT') or 5432}/", f":{proxy.port}/")
    try:
        with Central(database=url, CONN_MAX_AGE=0) as central:
            outbox = agent(tmp_path, central.url, world["key"])
            ids = [outbox.notify("Operators").send(f"Valve {n} stuck", "Check valve") for n in range(50)]
            proxy.cut()
            result = outbox.forward_once()
            assert result.forwarded == 0 and result.parked == 0
            assert outbox.stats()["buffered"] == 50
            proxy.restore()
            drain(outbox)
    finally:
        proxy.close()
    poll(lambda: all_delivered(ids), timeout=60, message="not every notification was delivered")
    assert world["smtp"].count_by_notification_id() == dict.fromkeys(ids, 1)


def test_a_forwarder_killed_mid_backlog_and_restarted_loses_nothing(world, tmp_path):
    with Central() as central:
        outbox = agent(tmp_path, central.url, world["key"])
        ids = [outbox.notify("Operators").send(f"Tank {n} high", "Level alarm") for n in range(1000)]
        env = child_env(
            OUTBOX_AGENT_DB=tmp_path / "buffer.sqlite3", OUTBOX_CENTRAL_URL=central.url, OUTBOX_SITE_KEY=world["key"]
        )
        command = [sys.executable, "-m", "sites.agent", "forward", "--batch-size", "100"]
        forwarder = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        poll(
            lambda: Notification.objects.filter(pk__in=ids).count() >= 300,
            timeout=60,
            message="the forwarder did not start forwarding",
        )
        forwarder.send_signal(signal.SIGKILL)
        forwarder.wait()
        assert outbox.stats()["buffered"] > 0  # killed mid-backlog

        restarted = subprocess.run(
            [*command[:-2], "--once"], env=env, cwd=ROOT, capture_output=True, timeout=120, check=False
        )
        assert restarted.returncode == 0, restarted.stderr
        assert outbox.stats()["buffered"] == 0 and outbox.stats()["parked"] == 0
    assert Notification.objects.filter(pk__in=ids).count() == 1000
    poll(lambda: all_delivered(ids), timeout=90, message="not every notification was delivered")
    assert world["smtp"].count_by_notification_id() == dict.fromkeys(ids, 1)


def test_status_goes_from_forwarding_at_the_site_to_central_pending_then_delivered(world, tmp_path):
    with Central() as central:
        outbox = agent(tmp_path, central.url, world["key"])
        notification_id = outbox.notify("Operators").send("Compressor 2 tripped", "Low oil pressure")
        assert outbox.status(notification_id)["status"] == "Forwarding"
        outbox.forward_once()
        assert outbox.status(notification_id)["status"] in ("Pending", "Delivered")
        poll(
            lambda: outbox.status(notification_id)["status"] == "Delivered",
            timeout=30,
            interval=0.1,
            message="the status never became Delivered",
        )
        record = outbox.status(notification_id)
        assert record["delivered_at"] and record["retry_count"] == 0
