"""A notification some recipients refused for good is delivered partially, and says so: in the
status record of the API, on the console's notification page, in the KPIs and through the
outbox page's filter. Delivered by the real dispatcher to a real SMTP server on loopback."""

import pytest
from django.urls import reverse

from notifications.kpis import kpis_compute
from notifications.models import EmailRecipient, Notification, NotificationList
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
