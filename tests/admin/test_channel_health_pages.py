"""The console shows what the resilience machinery does: open channels (since when, why, how
many rows wait), failed attempts by class, expired rows, each attempt's failure class; and an
administrator can let an open channel be probed at once."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from notifications.models import ChannelHealth, DeliveryAttempt, Notification, SmtpConfiguration
from tests.admin.conftest import login, make_notification, make_user

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


def open_channel(**fields):
    """An open endpoint of the configured SMTP relay."""
    SmtpConfiguration.objects.update_or_create(
        pk=SmtpConfiguration.SINGLETON_PK,
        defaults={"host": "smtp.example.com", "port": 587, "from_address": "outbox@example.com"},
    )
    values = {
        "channel": "email",
        "endpoint": "smtp.example.com:587",
        "state": "open",
        "opened_at": timezone.now() - timedelta(minutes=3),
        "last_failure_class": "auth",
        "last_error": "SMTP authentication failed (535 bad credentials)",
        "probe_after": timezone.now() + timedelta(minutes=5),
        "probes": 2,
    }
    values.update(fields)
    return ChannelHealth.objects.create(**values)


def test_the_outbox_page_and_the_dashboard_show_an_open_channel(operator_client):
    open_channel()
    make_notification(status=Status.RETRYING)
    for url in (OUTBOX, reverse("admin:index")):
        content = operator_client.get(url).content.decode()
        assert 'id="kpi-channels"' in content and "Channels not delivering" in content
        assert "smtp.example.com:587" in content and ">auth<" in content
        assert "(2 probes so far)" in content


def test_no_channel_box_while_every_channel_is_healthy(operator_client):
    ChannelHealth.objects.create(channel="email", endpoint="smtp.example.com:587", state="closed")
    assert b'id="kpi-channels"' not in operator_client.get(OUTBOX).content


def test_failed_attempts_by_class_and_expired_rows_are_shown(operator_client):
    row = make_notification(status=Status.RETRYING)
    DeliveryAttempt.objects.create(notification=row, outcome="transient", failure_class="throttled")
    make_notification(status=Status.PARKED, expired_at=timezone.now(), last_error="Expired: not delivered within 1 h")
    content = operator_client.get(OUTBOX).content.decode()
    assert 'id="kpi-failures"' in content and "throttled 1" in content
    assert 'id="kpi-expired"' in content


def test_an_attempts_failure_class_is_on_the_notification_page(operator_client):
    row = make_notification(status=Status.RETRYING)
    DeliveryAttempt.objects.create(notification=row, outcome="transient", failure_class="connection", error="refused")
    page = operator_client.get(reverse("admin:notifications_notification_change", args=[row.pk]))
    assert b"field-failure_class" in page.content and b"connection" in page.content


def test_an_administrator_lets_an_open_channel_be_probed_now(client, db):
    login(client, make_user("adam", groups=["Administrators"]))
    health = open_channel()
    make_notification(status=Status.RETRYING)  # waiting for the relay: the probe's row
    response = client.post(
        reverse("admin:notifications_channelhealth_changelist"),
        {"action": "probe_now", "_selected_action": [health.pk]},
        follow=True,
    )
    assert response.status_code == 200
    health.refresh_from_db()
    assert health.probe_after is not None and health.probe_after <= timezone.now()


def test_operators_see_channel_health_but_cannot_probe_or_edit_it(operator_client):
    health = open_channel()
    page = operator_client.get(reverse("admin:notifications_channelhealth_changelist"))
    assert page.status_code == 200 and b"smtp.example.com:587" in page.content
    assert b"probe_now" not in page.content
    operator_client.post(
        reverse("admin:notifications_channelhealth_changelist"),
        {"action": "probe_now", "_selected_action": [health.pk]},
    )
    health.refresh_from_db()
    assert health.probe_after is not None and health.probe_after > timezone.now()
