"""Channel health follows the configuration: an endpoint no longer configured is dropped (and
leaves the outbox_channel_open metric), rows waiting count for the configured endpoint only, an
administrator may close an endpoint with a reason or have it probed — or closed, when nothing
would be sent there — and saving any setting delivery depends on lets the endpoint be probed
at once and asks for a dispatch."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from notifications import metrics, trigger
from notifications.adapters.email import smtp_endpoint
from notifications.health import channel_health_prune, channels_unhealthy, dispatch_channels
from notifications.kpis import kpis_compute
from notifications.models import (
    ChannelConfiguration,
    ChannelHealth,
    DeliveryPolicy,
    DispatchRequest,
    EmailRecipient,
    Notification,
    NotificationList,
    SmtpConfiguration,
    WebhookTarget,
)
from tests.admin.conftest import login, make_user
from tests.admin.test_smtp_admin import form_data
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass, store_policy
from tests.observability.test_metrics import scrape
from tests.support.processes import poll
from tests.support.smtp import closed_port

Status = Notification.Status
State = ChannelHealth.State
HEALTH_PAGE = reverse("admin:notifications_channelhealth_changelist")
pytestmark = pytest.mark.usefixtures("operators_list")


def relay_down():
    """Point the SMTP configuration at a port nobody listens on; returns its endpoint."""
    port = closed_port()
    SmtpConfiguration.objects.update_or_create(
        pk=1, defaults={"host": "127.0.0.1", "port": port, "from_address": "outbox@example.com", "timeout_seconds": 2}
    )
    return smtp_endpoint(host="127.0.0.1", port=port)


def open_by_outage(count=3):
    """The relay goes down under ``count`` notifications: its endpoint opens, they wait."""
    old = relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=600, breaker_max_cooldown_seconds=600)
    rows = queue(count)
    run_pass(concurrency=1)
    assert ChannelHealth.objects.get(endpoint=old).state == State.OPEN
    return old, rows


def channel_open_metric():
    metrics.kpi_cache.clear()
    return scrape()[("outbox_channel_open", (("channel", "email"),))]


def test_an_endpoint_no_longer_configured_is_dropped_and_leaves_the_metric(db, smtp_server):
    old, rows = open_by_outage()
    assert channel_open_metric() == 1
    configure_smtp(smtp_server)  # an administrator points the configuration at the other relay
    assert not ChannelHealth.objects.filter(endpoint=old).exists()
    assert kpis_compute()["channels"] == []
    assert channel_open_metric() == 0
    Notification.objects.update(next_attempt_at=timezone.now())
    run_pass()
    assert [fresh(row).status for row in rows] == [Status.DELIVERED] * 3


def test_an_endpoint_left_behind_by_a_change_the_signals_never_saw_is_dropped_by_the_next_pass(db, smtp_server):
    old, _ = open_by_outage()
    SmtpConfiguration.objects.update(port=smtp_server.port)  # e.g. an UPDATE in the database shell
    assert ChannelHealth.objects.filter(endpoint=old).exists()
    assert kpis_compute()["channels"] == []  # never shown: nothing goes there
    dispatch_channels()  # what every pass starts with
    assert not ChannelHealth.objects.filter(endpoint=old).exists()


def test_rows_waiting_count_for_the_configured_endpoint_and_not_for_an_old_one(db, client):
    old, _ = open_by_outage(count=4)
    current = relay_down()
    # The old endpoint's row, as a pass that started before the change may leave it.
    ChannelHealth.objects.create(channel="email", endpoint=old, state=State.OPEN, opened_at=timezone.now())
    ChannelHealth.objects.create(channel="email", endpoint=current, state=State.OPEN, opened_at=timezone.now())
    (shown,) = channels_unhealthy()
    assert (shown["endpoint"], shown["rows_waiting"]) == (current, 4)
    client = login(client, make_user("adam", groups=["Administrators"]))
    page = client.get(HEALTH_PAGE).content.decode()
    assert page.count('class="field-waiting">4<') == 1 and page.count('class="field-waiting">0<') == 1
    assert channel_health_prune() == 1


def test_an_administrator_closes_an_endpoint_with_a_reason_recorded_in_its_history(db, client):
    old, _ = open_by_outage()
    relay_down()  # the configuration moved on; the old endpoint's row is still there
    ChannelHealth.objects.create(channel="email", endpoint=old, state=State.OPEN, opened_at=timezone.now())
    stale = ChannelHealth.objects.get(endpoint=old)
    client = login(client, make_user("adam", groups=["Administrators"]))
    action = {"action": "close_endpoints", "_selected_action": [stale.pk]}
    page = client.post(HEALTH_PAGE, action)
    assert b"Reason (required)" in page.content and b"no longer configured: removed" in page.content
    refused = client.post(HEALTH_PAGE, {**action, "post": "yes", "reason": ""})
    assert b"This field is required" in refused.content
    assert ChannelHealth.objects.filter(pk=stale.pk).exists()
    done = client.post(HEALTH_PAGE, {**action, "post": "yes", "reason": "relay replaced by smtp2"}, follow=True)
    assert b"Closed 1 endpoint" in done.content
    assert not ChannelHealth.objects.filter(pk=stale.pk).exists()
    (entry,) = LogEntry.objects.filter(object_id=str(stale.pk))
    assert "relay replaced by smtp2" in entry.change_message and entry.user.username == "adam"


def test_closing_the_configured_endpoint_makes_its_waiting_rows_due_again(db, client):
    current, _ = open_by_outage()
    health = ChannelHealth.objects.get(endpoint=current)
    client = login(client, make_user("adam", groups=["Administrators"]))
    client.post(
        HEALTH_PAGE, {"action": "close_endpoints", "_selected_action": [health.pk], "post": "yes", "reason": "fixed"}
    )
    health.refresh_from_db()
    assert (health.state, health.consecutive_failures, health.probe_after) == (State.CLOSED, 0, None)
    Notification.objects.update(next_attempt_at=timezone.now())
    assert run_pass(concurrency=1).claimed == 3  # all due again; the relay is still down …
    assert ChannelHealth.objects.get(endpoint=current).state == State.OPEN  # … so it opens again


def test_operators_can_neither_close_nor_probe_an_endpoint(db, client):
    current, _ = open_by_outage()
    health = ChannelHealth.objects.get(endpoint=current)
    client = login(client, make_user("olivia", groups=["Operators"]))
    page = client.get(HEALTH_PAGE)
    assert b"close_endpoints" not in page.content
    client.post(
        HEALTH_PAGE, {"action": "close_endpoints", "_selected_action": [health.pk], "post": "yes", "reason": "x"}
    )
    assert ChannelHealth.objects.get(pk=health.pk).state == State.OPEN


def test_probe_now_on_an_endpoint_nothing_goes_to_closes_it_and_says_why(db, client):
    old, _ = open_by_outage()
    client = login(client, make_user("adam", groups=["Administrators"]))
    # Nothing waits for the configured endpoint any more (an operator discarded the rows).
    Notification.objects.update(status=Status.DISCARDED, next_attempt_at=None)
    health = ChannelHealth.objects.get(endpoint=old)
    page = client.post(HEALTH_PAGE, {"action": "probe_now", "_selected_action": [health.pk]}, follow=True)
    assert b"Closed instead of probed" in page.content and b"no notification waits for it" in page.content
    assert ChannelHealth.objects.get(pk=health.pk).state == State.CLOSED
    # An endpoint that is no longer configured: closed and removed.
    relay_down()
    stale = ChannelHealth.objects.create(channel="email", endpoint=old, state=State.OPEN, opened_at=timezone.now())
    page = client.post(HEALTH_PAGE, {"action": "probe_now", "_selected_action": [stale.pk]}, follow=True)
    assert b"no longer configured" in page.content
    assert not ChannelHealth.objects.filter(pk=stale.pk).exists()


# --- a saved configuration is dispatched at once -------------------------------------------------


def queued_dispatch_tasks():
    return [
        payload
        for payload in OrmQ.objects.filter(key=Conf.CLUSTER_NAME).values_list("payload", flat=True)
        if SignedPackage.loads(payload)["func"] == trigger.DISPATCH_TASK
    ]


@pytest.mark.dispatch_trigger
@pytest.mark.django_db(transaction=True)
def test_saving_the_smtp_configuration_through_the_admin_form_probes_at_once_and_queues_a_dispatch(
    operators_list, client
):
    current, _ = open_by_outage()
    probe_after = ChannelHealth.objects.get(endpoint=current).probe_after
    assert probe_after is not None and probe_after > timezone.now() + timedelta(minutes=9)
    # Nothing waits: no queued task, and no request the trigger would take for a waiting one.
    OrmQ.objects.all().delete()
    DispatchRequest.objects.all().delete()
    client = login(client, make_user("adam", groups=["Administrators"]))
    config = SmtpConfiguration.objects.get()
    url = reverse("admin:notifications_smtpconfiguration_change", args=[config.pk])
    response = client.post(url, form_data(config, password="the fixed password"))
    assert response.status_code == 302
    health = ChannelHealth.objects.get(endpoint=current)
    assert health.state == State.OPEN and health.consecutive_failures == 0
    assert health.probe_after is not None and health.probe_after <= timezone.now()
    poll(lambda: len(queued_dispatch_tasks()) == 1, timeout=5, message="saving queued no dispatch task")


def webhook_target():
    operators = NotificationList.objects.get(name="Operators")
    return WebhookTarget(notification_list=operators, url="https://hooks.example.com/a", secret="whsec_" + "A" * 32)


# Each change, and whether it concerns the email channel (whose endpoint is open here).
SAVES = {
    "a delivery policy": (lambda: store_policy(interval_seconds=30), True),
    "a policy removed": (lambda: DeliveryPolicy.objects.filter(channel="email").delete(), True),
    "a list's recipients": (
        lambda: EmailRecipient.objects.create(
            notification_list=NotificationList.objects.get(name="Operators"), email="op3@example.com"
        ),
        True,
    ),
    "a list (its targets of any channel)": (lambda: NotificationList.objects.get(name="Operators").save(), True),
    "the SMS channel's configuration": (
        lambda: ChannelConfiguration.objects.create(channel="sms", provider="twilio"),
        False,
    ),
    "a webhook target": (lambda: webhook_target().save(), False),
}


@pytest.mark.parametrize("change", list(SAVES))
def test_saving_a_setting_delivery_depends_on_lets_its_channel_be_probed_and_asks_for_a_dispatch(
    db, change, django_capture_on_commit_callbacks
):
    current, _ = open_by_outage()
    save, concerns_email = SAVES[change]
    with django_capture_on_commit_callbacks() as callbacks:
        save()
    assert trigger.dispatch_request in callbacks
    probe_after = ChannelHealth.objects.get(endpoint=current).probe_after
    assert probe_after is not None
    assert (probe_after <= timezone.now()) == concerns_email  # another channel's change leaves email's breaker be
