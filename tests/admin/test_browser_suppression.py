"""Suppression in a real headless Chromium: the outbox page shows a chattering alarm as
"×N, last HH:MM" and a suppressed row's reason; an operator silences a site for 2 hours from a
notification's page, and delivers a suppressed row anyway from its page.

Skipped, with the reason printed, where Chromium or Playwright is absent (see test_browser.py).
"""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications.models import Notification, Silence
from tests.admin.conftest import make_notification, make_user
from tests.admin.test_browser import ARTIFACTS, browser, log_in  # noqa: F401 (the browser fixture)

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(browser, live_server):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    yield page
    context.close()


def test_the_outbox_shows_occurrences_and_reasons_and_an_operator_delivers_one_anyway(page, live_server):
    anchor = make_notification(
        status=Status.DELIVERED,
        dedup_key="level-switch",
        occurrences=37,
        last_occurrence_at=timezone.now(),
        subject="Level switch 7 high",
    )
    duplicate = make_notification(
        status=Status.SUPPRESSED, dedup_key="level-switch", suppressed_by=f"duplicate:{anchor.pk}", subject="Again"
    )
    page.goto(f"{live_server.url}{OUTBOX}")
    anchor_row = page.locator("#result_list tbody tr", has_text="Level switch 7 high")
    assert "×37, last" in anchor_row.inner_text()
    duplicate_row = page.locator("#result_list tbody tr", has_text="Again")
    assert "a duplicate of" in duplicate_row.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "outbox-suppression.png"))

    page.goto(f"{live_server.url}{reverse('admin:notifications_notification_change', args=[duplicate.pk])}")
    page.click("#release-button")
    page.wait_for_selector(".messagelist")
    assert "Released 1 notification" in page.locator(".messagelist").inner_text()
    duplicate.refresh_from_db()
    assert duplicate.status == Status.PENDING


def test_an_operator_silences_a_site_for_2_hours_from_a_notifications_page(page, live_server):
    notification = make_notification(source_site_id="plant-b")
    page.goto(f"{live_server.url}{reverse('admin:notifications_notification_change', args=[notification.pk])}")
    page.click("text=Silence this site for 2 h")
    page.fill("#id_reason", "Plant B: pump overhaul")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist")
    silence = Silence.objects.get()
    assert silence.site == "plant-b"
    assert silence.created_by == "olivia"
    length = silence.ends_at - silence.starts_at
    assert timedelta(minutes=119) < length <= timedelta(hours=2, minutes=1)
