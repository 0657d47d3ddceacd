"""End to end, sites seen from central: real central (gunicorn on the PostgreSQL test database),
real agent processes (``python -m sites.agent forward`` and ``send``), a real dispatcher and SMTP
server; operators act through the console (Django's test client on the same database).

The forwarders here sweep once an hour, so a notification that reaches central at once got
there through the wake-up, and a retried row through an operator command."""

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from notifications.models import EmailRecipient, Notification, NotificationList
from sites.agent import SiteOutbox
from sites.models import Site, SiteCommand, SiteHeartbeat, SiteParkedNotification
from sites.services import site_key_issue
from tests.admin.conftest import make_user
from tests.dispatch.conftest import configure_smtp
from tests.support.processes import ROOT, Central, child_env, manage, poll, stop
from tests.support.smtp import SmtpServer
from tests.support.staff import staff_key_header

pytestmark = pytest.mark.slow
Status = Notification.Status
Parked = SiteParkedNotification.State
PARKED_AT_SITES = reverse("admin:sites_siteparkednotification_changelist")
SMALL_LIMIT = 4096  # central's body limit while the big notification is refused


@pytest.fixture
def world(transactional_db, postgres_only, settings, tmp_path):
    settings.OUTBOX_DISPATCH_TRIGGER = False  # the dispatcher process does the delivering
    with SmtpServer(keep_content=False) as smtp:
        configure_smtp(smtp, timeout_seconds=5, max_retries=10, retry_interval_seconds=1)
        operators = NotificationList.objects.create(name="Operators")
        EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
        site = Site.objects.create(site_id="plant-sites", name="Plant Sites")
        _, key = site_key_issue(site=site)
        dispatcher = manage("dispatch", OUTBOX_DISPATCH_INTERVAL=0.2)
        try:
            yield {"smtp": smtp, "key": key, "site": site, "db": tmp_path / "buffer.sqlite3"}
        finally:
            stop(dispatcher)


def agent_env(world, central_url):
    return child_env(OUTBOX_AGENT_DB=world["db"], OUTBOX_CENTRAL_URL=central_url, OUTBOX_SITE_KEY=world["key"])


def forwarder(world, central_url, *extra):
    """The agent's forward service: sweeps hourly, heartbeats every 0.5 s."""
    command = [sys.executable, "-m", "sites.agent", "forward", "--quiet", "--sweep-interval", "3600"]
    command += ["--heartbeat-interval", "0.5", "--retry-interval", "3600", "--timeout", "5", *extra]
    return subprocess.Popen(
        command, env=agent_env(world, central_url), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def send(world, central_url, *extra, subject="Pump 3 tripped", body="Motor overload"):
    """``python -m sites.agent send`` in its own process; returns the id it printed."""
    sent = subprocess.run(
        [
            sys.executable,
            "-m",
            "sites.agent",
            "send",
            "--list",
            "Operators",
            "--subject",
            subject,
            "--body",
            body,
            *extra,
        ],
        env=agent_env(world, central_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return sent.stdout.strip()


def heartbeats_arrive(world):
    poll(
        lambda: SiteHeartbeat.objects.filter(site=world["site"]).exists(),
        timeout=30,
        message="no heartbeat reached central",
    )


def site_stats(world):
    with SiteOutbox(world["db"], None, None) as outbox:
        return outbox.stats()


def operator_console():
    console = Client()
    console.force_login(make_user(f"operator-{uuid.uuid4().hex[:6]}", groups=["Operators"]))
    return console


def parked_at_central(world, notification_id):
    return SiteParkedNotification.objects.filter(site=world["site"], notification_id=notification_id).first()


def act(console, action, rows, **extra):
    response = console.post(
        PARKED_AT_SITES, {"action": action, "_selected_action": [row.pk for row in rows], **extra}, follow=True
    )
    assert response.status_code == 200


def delivered_once(world, notification_id):
    return (
        Notification.objects.filter(pk=notification_id, status=Status.DELIVERED).exists()
        and world["smtp"].count_by_notification_id().get(notification_id) == 1
    )


def test_a_send_reaches_central_at_once_through_the_running_forwarder(world):
    with Central() as central:
        service = forwarder(world, central.url)
        try:
            heartbeats_arrive(world)  # the first (empty) sweep is over; the next one is an hour away
            notification_id = send(world, central.url)
            poll(
                lambda: Notification.objects.filter(pk=notification_id).exists(),
                timeout=30,
                message="the send did not wake the forwarder",
            )
        finally:
            stop(service)
    poll(lambda: delivered_once(world, notification_id), timeout=60, message="not delivered exactly once")


def test_a_site_that_stops_heartbeating_is_shown_silent(world, admin_client, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 2
    authorization = staff_key_header(User.objects.create_user("boss", is_staff=True))
    sites_page = reverse("admin:sites_site_changelist")
    with Central(OUTBOX_SITE_SILENT_AFTER=2) as central:
        service = forwarder(world, central.url)
        try:
            heartbeats_arrive(world)
            assert "site-silent" not in admin_client.get(sites_page).content.decode()
        finally:
            stop(service)
        poll(
            lambda: "site-silent" in admin_client.get(sites_page).content.decode(),
            timeout=30,
            message="the site never showed silent",
        )
        kpis = requests.get(f"{central.url}/api/v1/kpis/", headers={"Authorization": authorization}, timeout=10).json()
    assert kpis["per_site"]["plant-sites"]["silent"] is True and kpis["global"]["silent_sites"] == 1


def test_rows_parked_at_the_site_are_retried_and_discarded_from_central(world):
    """A notification larger than central's (lowered) body limit is refused with 413 and one
    of a type central does not know with 400; both park at the site and appear at central. The
    operator raises the limit again and retries the first (delivered exactly once), and discards
    the second with a reason (gone from the site)."""
    central = Central(OUTBOX_MAX_BODY_BYTES=SMALL_LIMIT).start()
    service = forwarder(world, central.url)
    try:
        heartbeats_arrive(world)
        big = send(world, central.url, subject="Full report", body="x" * (SMALL_LIMIT + 1000))
        unknown = send(world, central.url, "--type", "pager", subject="Pump 4 tripped")
        poll(
            lambda: parked_at_central(world, big) and parked_at_central(world, unknown),
            timeout=30,
            message="the site-parked rows did not appear at central",
        )
        assert "Too large for central: HTTP 413" in parked_at_central(world, big).reason
        assert "Unknown notification type 'pager'" in parked_at_central(world, unknown).reason

        central.stop()  # the fix: central's limit back to its default
        central = Central(port=central.port).start()
        console = operator_console()
        act(console, "retry_at_site", [parked_at_central(world, big)])
        act(
            console,
            "discard_at_site",
            [parked_at_central(world, unknown)],
            post="yes",
            reason="No pager channel at this plant",
        )

        poll(lambda: delivered_once(world, big), timeout=60, message="the retried row was not delivered once")
        poll(
            lambda: set(SiteCommand.objects.values_list("state", flat=True)) == {"done"},
            timeout=30,
            message=f"commands not acknowledged: {list(SiteCommand.objects.values('action', 'state', 'detail'))}",
        )
        poll(
            lambda: (
                parked_at_central(world, big).state == Parked.RETRIED
                and parked_at_central(world, unknown).state == Parked.DISCARDED
            ),
            timeout=30,
            message="central's view of the site did not heal",
        )
    finally:
        stop(service)
        central.stop()
    assert site_stats(world) == {"buffered": 0, "parked": 0}
    assert not Notification.objects.filter(pk=unknown).exists()
    discard = SiteCommand.objects.get(action="discard")
    assert discard.reason == "No pager channel at this plant" and discard.detail == "discarded at the site"


def test_a_command_issued_while_the_agent_is_down_is_executed_when_it_restarts(world):
    central = Central(OUTBOX_MAX_BODY_BYTES=SMALL_LIMIT).start()
    service = forwarder(world, central.url)
    try:
        heartbeats_arrive(world)
        big = send(world, central.url, subject="Full report", body="y" * (SMALL_LIMIT + 1000))
        poll(lambda: parked_at_central(world, big), timeout=30, message="the parked row did not appear at central")
        stop(service)  # the agent is down …
        central.stop()
        central = Central(port=central.port).start()  # … and central restarts with its default limit
        act(operator_console(), "retry_at_site", [parked_at_central(world, big)])
        assert SiteCommand.objects.get().state == SiteCommand.State.PENDING
        assert site_stats(world)["parked"] == 1

        service = forwarder(world, central.url)  # the agent comes back
        poll(lambda: delivered_once(world, big), timeout=60, message="the retried row was not delivered once")
        poll(
            lambda: SiteCommand.objects.get().state == SiteCommand.State.DONE,
            timeout=30,
            message="the command was not acknowledged",
        )
    finally:
        stop(service)
        central.stop()
    assert site_stats(world) == {"buffered": 0, "parked": 0}


def test_the_agent_reports_its_state_in_the_console_and_the_kpis(world):
    with Central() as central:
        for n in range(3):
            send(world, central.url, subject=f"Tank {n} high")  # no forwarder yet: buffered
        service = forwarder(world, central.url, "--batch-size", "1")
        try:
            poll(
                lambda: Notification.objects.filter(source_site_id="plant-sites").count() == 3,
                timeout=30,
                message="the backlog was not forwarded",
            )
            poll(
                lambda: (
                    SiteHeartbeat.objects.filter(site=world["site"], buffered=0, last_forward_at__isnull=False)
                    .exclude(agent_version="")
                    .exists()
                ),
                timeout=30,
                message="no heartbeat after the forward",
            )
        finally:
            stop(service, sig=signal.SIGTERM)
    heartbeat = SiteHeartbeat.objects.get(site=world["site"])
    assert heartbeat.parked == 0 and heartbeat.last_error == ""
    assert json.loads(json.dumps(site_stats(world))) == {"buffered": 0, "parked": 0}


def test_the_buffer_directory_is_left_clean_after_the_forwarder_stops(world):
    with Central() as central:
        service = forwarder(world, central.url)
        heartbeats_arrive(world)
        stop(service)
    assert not Path(str(world["db"]) + "-forwarder").exists()
