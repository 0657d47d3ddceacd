"""End to end, acknowledgements both ways: a plant's code raises a notification through the site's
buffer, a real agent process (``python -m sites.agent forward``) forwards it to real central
(gunicorn on the PostgreSQL test database); a person acknowledges it at central and the
acknowledgement travels back in a heartbeat answer to the running agent, which stores it in the
buffer, where the plant's code (this process, not the forwarder) reads it — once, also across
restarts of the agent and of the reader. The other way, the plant's own acknowledgement and
clearing, made while the link is cut, reach central's status record when the link is back."""

import functools
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from notifications.acknowledgement import acknowledge
from notifications.clock import database_now
from notifications.models import EmailRecipient, Notification, NotificationList
from sites.agent import SiteOutbox
from sites.models import Site, SiteCommand, SiteHeartbeat
from sites.services import site_key_issue
from tests.support.processes import ROOT, Central, child_env, poll, stop
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.slow


class Plant:
    """The site: its buffer, a forwarding agent process (started and stopped at will) behind a
    link that can be cut, and the plant's own code reading and writing the same buffer."""

    def __init__(self, tmp_path, url, key):
        self.db = tmp_path / "buffer.sqlite3"
        self.config = tmp_path / "agent.json"
        self.config.write_text(
            json.dumps(
                {
                    "db": str(self.db),
                    "central_url": url,
                    "key": key,
                    "sweep_interval": 0.3,
                    "retry_interval": 0.3,
                    "heartbeat_interval": 0.5,
                    "timeout": 2,
                }
            )
        )
        self.agent = None
        self.hmi = SiteOutbox(self.db, None, None)  # the plant's code: no link of its own

    def start_agent(self):
        command = [sys.executable, "-m", "sites.agent", "--config", str(self.config), "forward", "--quiet"]
        self.agent = subprocess.Popen(
            command, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def stop_agent(self):
        if self.agent is not None:
            stop(self.agent)
            self.agent = None

    def restart_hmi(self):
        self.hmi.close()
        self.hmi = SiteOutbox(self.db, None, None)

    def close(self):
        self.stop_agent()
        self.hmi.close()


@pytest.fixture
def world(transactional_db, postgres_only, tmp_path):
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
    site = Site.objects.create(site_id="plant-ack", name="Plant Ack")
    _, key = site_key_issue(site=site)
    with Central() as central:
        link = TcpProxy(central.port)
        plant = Plant(tmp_path, link.url, key)
        plant.start_agent()
        try:
            yield {"plant": plant, "link": link, "central": central, "key": key}
        finally:
            plant.close()
            link.close()


def heard_since(moment):
    return SiteHeartbeat.objects.filter(site__site_id="plant-ack", received_at__gt=moment).exists()


def at_central(notification_id):
    return Notification.objects.filter(pk=notification_id).exists()


def raise_alarm(plant, subject):
    notification_id = plant.hmi.notify("Operators").send(subject, "Overcurrent", priority="high")
    poll(lambda: at_central(notification_id), timeout=30, message=f"{subject!r} never reached central")
    return notification_id


def consumed_until(plant, count, *, timeout=30):
    """Read with consume=True until ``count`` acknowledgements have come; returns them."""
    seen = []

    def arrived():
        seen.extend(plant.hmi.acknowledgements(consume=True))
        return len(seen) >= count

    poll(arrived, timeout=timeout, interval=0.2, message=f"the plant's code read {len(seen)} of {count}")
    return seen


def test_an_acknowledgement_made_at_central_reaches_the_plant_once_also_across_restarts(world):
    plant = world["plant"]
    first = raise_alarm(plant, "Pump 3 tripped")
    second = raise_alarm(plant, "Pump 4 tripped")

    acknowledge(first, via="link", by="olga.ortiz@plant-ack.example.com", note="on my way")
    (ack,) = consumed_until(plant, 1)
    assert ack["notification_id"] == first
    assert ack["acknowledged_via"] == "link"
    assert ack["acknowledged_by"] == "o***@plant-ack.example.com"  # masked for the site
    assert ack["note"] == "on my way"
    assert ack["acknowledged_at"] is not None
    # status() carries it too, beside central's status record.
    with SiteOutbox(plant.db, world["central"].url, world["key"]) as reader:
        status = reader.status(first)
    assert status is not None and status["location"] == "central"
    assert status["acknowledgement"] == ack

    # The agent stops; a person acknowledges the second alarm meanwhile; the agent starts again.
    plant.stop_agent()
    before_second = datetime.now(UTC)
    acknowledge(second, via="console", by="shift-lead")
    plant.restart_hmi()  # the plant's reader restarts too: what it read stays read
    plant.start_agent()
    (ack,) = consumed_until(plant, 1)
    assert (ack["notification_id"], ack["acknowledged_via"]) == (second, "console")
    assert ack["acknowledged_by"] == "s***"  # a user name, masked for the site

    # More heartbeats come and go: nothing comes twice, neither to the plant nor into the buffer.
    poll(
        lambda: SiteCommand.objects.filter(action="acknowledged", state="done").count() == 2,
        timeout=30,
        message="the agent did not confirm both acknowledged commands",
    )
    for _ in range(3):
        moment = database_now()
        poll(functools.partial(heard_since, moment), timeout=30, message="no heartbeat")
        assert plant.hmi.acknowledgements(consume=True) == []
    everything = plant.hmi.acknowledgements()
    assert [a["notification_id"] for a in everything] == [first, second]
    assert [a["notification_id"] for a in plant.hmi.acknowledgements(since=before_second)] == [second]


def test_the_plants_acknowledgement_and_clearing_made_while_the_link_is_cut_reach_centrals_status_record(world):
    plant, link = world["plant"], world["link"]
    acknowledged_id = raise_alarm(plant, "Tank 1 high")
    cleared_id = raise_alarm(plant, "Tank 2 high")

    link.cut()
    plant.hmi.acknowledge(acknowledged_id, by="B. Ortiz", note="Pump 3 on standby")
    plant.hmi.clear(cleared_id, note="Level back to normal")
    assert plant.hmi.buffer.site_actions_waiting() == 2
    link.restore()

    poll(
        lambda: (
            Notification.objects.filter(pk=acknowledged_id, acknowledged_at__isnull=False).exists()
            and Notification.objects.filter(pk=cleared_id, cleared_at__isnull=False).exists()
        ),
        timeout=30,
        message="the plant's acknowledgement and clearing did not reach central",
    )
    poll(lambda: plant.hmi.buffer.site_actions_waiting() == 0, timeout=30, message="the calls stayed buffered")
    with SiteOutbox(plant.db, world["central"].url, world["key"]) as reader:
        acknowledged = reader.status(acknowledged_id)
        cleared = reader.status(cleared_id)
    assert acknowledged is not None and cleared is not None
    assert acknowledged["acknowledged_via"] == "site"
    assert acknowledged["acknowledged_by"] == "B. Ortiz"
    assert acknowledged["acknowledged_note"] == "Pump 3 on standby"
    assert acknowledged["cleared_at"] is None
    assert cleared["cleared_at"] is not None and cleared["cleared_note"] == "Level back to normal"
    assert cleared["acknowledged_at"] is None  # cleared is not acknowledged
    # The site's own acknowledgement is not sent back to it, however many heartbeats come.
    for _ in range(2):
        moment = database_now()
        poll(functools.partial(heard_since, moment), timeout=30, message="no heartbeat")
    assert plant.hmi.acknowledgements() == []
    assert not SiteCommand.objects.filter(action="acknowledged").exists()
