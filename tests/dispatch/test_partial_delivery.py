"""A notification some recipients refused for good is delivered partially, and says so: in the
status record of the API, on the console's notification page, in the KPIs, on the dashboard's
trends and through the outbox page's filter. Delivered by the real dispatcher to a real SMTP
server on loopback."""

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications.kpis import kpis_compute
from notifications.models import EmailRecipient, Notification, NotificationList
from notifications.trends import trends_compute
from tests.admin.conftest import login, make_user
from tests.dispatch.conftest import fresh, queue, run_pass

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


@pytest.fixture
def partially_delivered(smtp_server, smtp_config, site, operators_list):
    crowd = NotificationList.objects.create(name="Everyone")
    members = [f"member{number:03d}@example.com" for number in range(120)]
    EmailRecipient.objects.bulk_create(EmailRecipient(notification_list=crowd, email=email) for email in members)
    smtp_server.rcpt_limit = 50
    smtp_server.behave("refuse", refuse={"member007@example.com", "member099@example.com"})
    (partial,) = queue(list_name="Everyone")
    (whole,) = queue()
    assert run_pass().delivered == 2
    return fresh(partial), fresh(whole)


def test_the_status_record_says_to_how_many_it_was_delivered_and_why_not_to_the_others(api, partially_delivered):
    partial, whole = partially_delivered
    record = api.get(f"/api/v1/notifications/{partial.pk}/").json()
    assert record["status"] == "Delivered"
    assert record["delivery_summary"] == "delivered to 118 of 120, 2 refused (550)"
    assert record["target_counts"] == {
        "total": 120,
        "delivered": 118,
        "refused": 2,
        "deferred": 0,
        "ambiguous": 0,
        "unknown": 0,
        "refused_codes": [550],
    }
    assert api.get(f"/api/v1/notifications/{whole.pk}/").json()["delivery_summary"] == "delivered to 2 of 2"
    # Not attempted yet: nothing to say.
    (waiting,) = queue()
    record = api.get(f"/api/v1/notifications/{waiting.pk}/").json()
    assert (record["delivery_summary"], record["target_counts"]) == ("", None)


def test_the_console_shows_the_summary_on_the_notification_page(client, partially_delivered):
    partial, _ = partially_delivered
    login(client, make_user("olivia", groups=["Operators"]))
    page = client.get(reverse("admin:notifications_notification_change", args=[partial.pk]))
    assert page.status_code == 200
    assert "delivered to 118 of 120, 2 refused (550)" in page.content.decode()


def test_partially_delivered_notifications_are_counted_and_filtered(client, partially_delivered):
    partial, _ = partially_delivered
    kpis = kpis_compute()
    assert kpis["global"]["delivered_last_interval"] == 2
    assert kpis["global"]["partially_delivered_last_interval"] == 1
    assert kpis["per_site"]["plant-a"]["partially_delivered_last_interval"] == 1
    login(client, make_user("olivia", groups=["Operators"]))
    page = client.get(OUTBOX, {"targets": "partial"})
    assert {row.pk for row in page.context["cl"].result_list} == {partial.pk}
    assert 'id="kpi-partial"' in client.get(OUTBOX).content.decode()


def test_a_partial_delivery_is_its_own_trend_series_and_its_refusals_are_not_failures(
    client, smtp_server, smtp_config, site, operators_list
):
    """Through the real dispatcher: one notification reaches op1 and op3 while op2's mailbox
    refuses it for now, then for good (delivered to 2 of 3); another, to a list whose only
    member's mailbox refuses it for now, reaches nobody. Only the second is a failure on the
    failed chart; the first is delivered partially, its failed attempt counted apart."""
    EmailRecipient.objects.create(notification_list=operators_list, email="op3@example.com")
    lonely = NotificationList.objects.create(name="Night desk")
    EmailRecipient.objects.create(notification_list=lonely, email="night@example.com")
    smtp_server.behave("refuse", refuse={"op2@example.com", "night@example.com"}, refuse_code=451)
    (partial,) = queue()
    (outage,) = queue(list_name="Night desk")
    run_pass()
    smtp_server.behave("refuse", refuse={"op2@example.com", "night@example.com"}, refuse_code=550)
    Notification.objects.filter(pk=partial.pk).update(next_attempt_at=timezone.now())
    run_pass()
    partial, outage = fresh(partial), fresh(outage)
    assert partial.status == Status.DELIVERED and partial.targets_refused == 1
    assert outage.status == Status.RETRYING
    first, second = partial.attempts.order_by("started_at", "id")
    assert (first.failure_class, first.targets_delivered) == ("provider_error", 2)
    assert (second.outcome, second.targets_delivered) == ("success", 2)
    assert outage.attempts.get().targets_delivered == 0

    overall = trends_compute().overall
    assert (overall.total("delivered"), overall.total("partial")) == (1, 1)
    assert (overall.total("failed"), overall.total("failed_partial")) == (1, 1)
    # The KPIs' failures by class still count every failed attempt.
    assert sum(kpis_compute()["global"]["failures_last_interval"].values()) == 2
    login(client, make_user("olivia", groups=["Operators"]))
    dashboard = client.get(reverse("admin:index")).content.decode()
    assert 'aria-label="Delivered partially per hour, last 24 hours: 1 in total' in dashboard
    assert 'aria-label="Failed per hour, last 24 hours: 1 in total' in dashboard
