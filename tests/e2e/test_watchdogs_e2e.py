"""End to end, watchdogs: a site script pings a watchdog through the site's buffer, a real agent
process (``python -m sites.agent forward``) forwards the pings and its heartbeats to real
central (gunicorn on the PostgreSQL test database) over a link we cut and restore, and central
judges the watchdogs (the function the worker runs every minute, called here at the moments
that matter). Intervals are seconds instead of minutes."""

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from notifications.clock import database_now
from notifications.models import EmailRecipient, NotificationList
from sites.agent import SiteOutbox
from sites.models import Site, SiteHeartbeat, Watchdog, WatchdogAlert
from sites.services import site_key_issue
from sites.watchdogs import watchdogs_evaluate
from tests.support.processes import ROOT, Central, child_env, poll, stop
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.slow
Kind = WatchdogAlert.Kind
EVERY = 2  # the script promises a ping every 2 s


class Script:
    """A site script's main loop that pings its watchdog after each scan, until paused."""

    def __init__(self, db):
        self.outbox = SiteOutbox(db, None, None)
        self.running = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.done.is_set():
            if self.running.is_set():
                self.outbox.watchdog("pump-loop", every_seconds=EVERY, list_name="Operators")
            time.sleep(0.2)

    def start(self):
        self.running.set()
        self.thread.start()
        return self

    def close(self):
        self.done.set()
        self.thread.join()
        self.outbox.close()


@pytest.fixture
def world(transactional_db, postgres_only, tmp_path):
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
    site = Site.objects.create(site_id="plant-dog", name="Plant Dog")
    _, key = site_key_issue(site=site)
    db = tmp_path / "buffer.sqlite3"
    with Central() as central:
        link = TcpProxy(central.port)
        config = tmp_path / "agent.json"
        config.write_text(
            json.dumps(
                {
                    "db": str(db),
                    "central_url": link.url,
                    "key": key,
                    "sweep_interval": 0.3,
                    "retry_interval": 0.3,
                    "heartbeat_interval": 0.5,
                    "timeout": 2,
                }
            )
        )
        command = [sys.executable, "-m", "sites.agent", "--config", str(config), "forward", "--quiet"]
        agent = subprocess.Popen(command, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        script = Script(db).start()
        try:
            yield {"site": site, "link": link, "script": script}
        finally:
            script.close()
            stop(agent)
            link.close()


def raised(kind):
    return WatchdogAlert.objects.filter(kind=kind).count()


def heard_since(site, moment):
    """Central has had a heartbeat from the site's agent after ``moment``."""
    return SiteHeartbeat.objects.filter(site=site, received_at__gt=moment).exists()


def pinged_since(moment):
    return Watchdog.objects.filter(name="pump-loop", last_ping_at__gt=moment).exists()


def test_a_watchdog_raises_one_notification_when_its_script_stops_and_one_when_it_resumes_but_none_for_a_cut_link(
    world,
):
    site, link, script = world["site"], world["link"], world["script"]
    started = database_now() - timedelta(seconds=1)
    poll(lambda: pinged_since(started), timeout=30, message="no ping reached central")
    # Until its agent's first heartbeat arrives, central cannot tell the site has an agent and
    # judges its watchdogs against its own clock (as for a site that posts directly).
    poll(lambda: heard_since(site, started), timeout=30, message="no heartbeat reached central")

    # The WAN is cut for three intervals while the script goes on pinging.
    link.cut()
    cut = database_now()
    time.sleep(3 * EVERY)
    assert not watchdogs_evaluate().raised  # the site has not been heard from: nothing to judge
    link.restore()
    restored = database_now()
    poll(lambda: heard_since(site, restored), timeout=30, message="no heartbeat after the link came back")
    assert not watchdogs_evaluate().raised  # even if the heartbeat overtook the ping made during the cut
    poll(lambda: pinged_since(cut), timeout=30, message="the ping made during the cut never arrived")
    confirmed = database_now()
    poll(lambda: heard_since(site, confirmed), timeout=30, message="no second heartbeat after the link came back")
    assert not watchdogs_evaluate().raised  # no false "silent"

    # The script stops (hangs): central hears the site, and no ping, for two intervals.
    script.running.clear()
    stopped = database_now()
    poll(
        lambda: heard_since(site, stopped + timedelta(seconds=2 * EVERY + 1)),
        timeout=30,
        message="no heartbeat two intervals after the script stopped",
    )
    poll(lambda: watchdogs_evaluate().raised, timeout=30, interval=0.5, message="the silent script raised nothing")
    assert not watchdogs_evaluate().raised
    assert raised(Kind.SILENT) == 1 and Watchdog.objects.get().state == Watchdog.State.SILENT

    # It resumes: one "pinging again", raised when the ping arrives.
    script.running.set()
    poll(lambda: raised(Kind.RECOVERED) == 1, timeout=30, message="no 'pinging again' notification")
    watchdogs_evaluate()
    assert (raised(Kind.SILENT), raised(Kind.RECOVERED)) == (1, 1)


def test_a_site_whose_link_stays_down_raises_one_site_silent_notification_and_one_when_it_is_back(world, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 3  # judged in this process
    site, link = world["site"], world["link"]
    poll(lambda: heard_since(site, database_now() - timedelta(seconds=1)), timeout=30, message="no heartbeat")

    link.cut()
    poll(
        lambda: watchdogs_evaluate().raised == {"site_silent": 1},
        timeout=30,
        interval=0.5,
        message="the silent site raised no 'site silent' notification",
    )
    time.sleep(2 * EVERY)
    watchdogs_evaluate()  # still silent: nothing more, and no watchdog judged on its own
    link.restore()
    restored = database_now()
    poll(lambda: heard_since(site, restored), timeout=30, message="no heartbeat after the link came back")
    report = watchdogs_evaluate()

    assert report.raised == {"site_back": 1}
    assert (raised(Kind.SITE_SILENT), raised(Kind.SITE_BACK), raised(Kind.SILENT)) == (1, 1, 0)
