"""Priorities and fan-out in the console: the priority badge, the filter and the sort of the
outbox; the queue by priority and each site's queued deliveries (notifications × targets) above
it; a site's own rate limit in the Site form."""

from datetime import timedelta

import pytest
from django.urls import reverse

from notifications.models import EmailRecipient, Notification, NotificationList
from sites.models import Site
from tests.admin.conftest import make_notification

Priority = Notification.Priority
OUTBOX = reverse("admin:notifications_notification_changelist")


@pytest.fixture
def rows(db):
    return {
        "old_critical": make_notification(priority=Priority.CRITICAL, age=timedelta(hours=3)),
        "new_critical": make_notification(priority=Priority.CRITICAL, age=timedelta(minutes=1)),
        "high": make_notification(priority=Priority.HIGH, age=timedelta(hours=1), source_site_id="plant-b"),
        "normal": make_notification(age=timedelta(minutes=2)),
        "low": make_notification(priority=Priority.LOW, age=timedelta(seconds=5)),
    }


def listed(client, **params):
    response = client.get(OUTBOX, params)
    assert response.status_code == 200
    return [row.pk for row in response.context["cl"].result_list], response.content.decode()


def test_the_outbox_shows_each_rows_priority_as_a_badge(operator_client, rows):
    _, page = listed(operator_client)
    assert page.count('class="outbox-badge outbox-priority-critical">critical<') == 2
    assert 'class="outbox-badge outbox-priority-high">high<' in page
    assert 'class="outbox-badge outbox-priority-low">low<' in page
    assert 'class="outbox-priority-normal">normal<' in page


def test_the_priority_filter_shows_only_that_priority(operator_client, rows):
    shown, _ = listed(operator_client, priority="critical")
    assert set(shown) == {rows["old_critical"].pk, rows["new_critical"].pk}
    shown, _ = listed(operator_client, priority="low")
    assert shown == [rows["low"].pk]


def test_sorted_by_priority_the_most_urgent_come_first_newest_first_within_each(operator_client, rows):
    column = 3  # id, status, priority
    shown, _ = listed(operator_client, o=f"-{column}")
    names = ["new_critical", "old_critical", "high", "normal", "low"]
    assert shown == [rows[name].pk for name in names]
    shown, _ = listed(operator_client, o=f"{column}")
    assert shown == [rows[name].pk for name in reversed(names)]


def test_a_notifications_page_shows_its_priority(operator_client, rows):
    url = reverse("admin:notifications_notification_change", args=[rows["high"].pk])
    assert 'outbox-priority-high">high<' in operator_client.get(url).content.decode()


def test_the_outbox_shows_the_queue_by_priority_and_each_sites_queued_deliveries(operator_client, rows):
    crew = NotificationList.objects.create(name="Operators")
    for n in range(5):
        EmailRecipient.objects.create(notification_list=crew, email=f"op{n}@example.com")

    _, page = listed(operator_client)

    assert "critical 2</a> · " in page and "high 1</a> · " in page and "normal 1</a> · " in page
    assert "25 deliveries" in page  # five queued notifications to a list of five
    kpis = operator_client.get(OUTBOX).context["outbox_kpis"]
    assert {site: figures["deliveries_queued"] for site, figures in kpis["per_site"].items()} == {
        "plant-a": 20,
        "plant-b": 5,
    }


def test_a_sites_own_rate_limit_is_set_in_the_site_form(admin_client, db):
    site = Site.objects.create(site_id="plant-a", name="Plant A")
    url = reverse("admin:sites_site_change", args=[site.pk])
    form = admin_client.get(url).context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update({"rate_limit": "500", "rate_burst": "20000", "active": "on"})
    data.update({"api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0"})  # the keys inline
    data.update({"watchdogs-TOTAL_FORMS": "0", "watchdogs-INITIAL_FORMS": "0"})  # the watchdogs inline
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    site.refresh_from_db()
    assert (site.rate_limit, site.rate_burst) == (500, 20000)

    data["rate_burst"] = "20"
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "at least the largest batch" in response.content.decode()
