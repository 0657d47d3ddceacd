"""The console's acknowledgement parts: the notification page's history in words, its
Acknowledge action with a note, the Unacknowledged tile and filter, time to acknowledge per
list and site; and, in a real Chromium, an operator acknowledging from the page."""

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications.models import DeliveryAttempt, Notification
from tests.admin.conftest import make_notification, make_user
from tests.admin.test_browser import ARTIFACTS, browser, log_in, page  # noqa: F401 - the browser fixtures

OUTBOX = reverse("admin:notifications_notification_changelist")


def change_url(row):
    return reverse("admin:notifications_notification_change", args=[row.pk])


@pytest.fixture
def operator_client(db):
    client = Client()
    client.force_login(make_user("olivia", groups=["Operators"]))
    return client


def test_the_page_tells_the_history_in_words_with_attempts_targets_steps_and_the_acknowledgement(operator_client):
    now = timezone.now()
    row = make_notification(
        status=Notification.Status.DELIVERED,
        asks_ack=True,
        priority=Notification.Priority.CRITICAL,
        resolved_targets=[
            {"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
            {"target": "gone@example.com", "outcome": "refused", "smtp_code": 550},
        ],
        acknowledged_at=now,
        acknowledged_by="Jane Doe",
        acknowledged_via="link",
        acknowledged_note="driving over",
    )
    DeliveryAttempt.objects.create(
        notification=row,
        started_at=now - timedelta(seconds=3),
        duration_ms=40,
        outcome=DeliveryAttempt.Outcome.TRANSIENT,
        failure_class="connection",
        error="Connection refused",
    )
    DeliveryAttempt.objects.create(
        notification=row, started_at=now - timedelta(seconds=2), duration_ms=25, outcome="success"
    )
    step = make_notification(asks_ack=True, escalation_of=row.pk, escalation_step=1, type="sms", list_name="Leads")
    content = operator_client.get(change_url(row)).content.decode()
    timeline = content[content.index('id="timeline"') :]
    timeline = timeline[: timeline.index("</ol>", timeline.rindex("outbox-event"))]
    for words in (
        "Sent by site plant-a",
        "Stored at central for list &#x27;Operators&#x27; by email, priority critical; asks for acknowledgement",
        "Attempt 1: failed; to be retried in 40 ms (connection)",
        "Connection refused",
        "Attempt 2: delivered in 25 ms",
        "op1@example.com has it (250)",
        "gone@example.com refused it for good (550)",
        "Escalated: step 1 to list &#x27;Leads&#x27; by sms",
        "Acknowledged by Jane Doe via the link in the message",
        "Note: driving over",
    ):
        assert words in timeline, words
    assert change_url(step) in timeline
    assert 'id="acknowledge-link"' not in content  # already acknowledged
    step_page = operator_client.get(change_url(step)).content.decode()
    assert "Escalation step 1 of another notification" in step_page and change_url(row) in step_page


def test_an_operator_acknowledges_with_a_note_and_it_is_recorded_under_their_name(operator_client):
    row = make_notification(asks_ack=True, priority=Notification.Priority.HIGH)
    content = operator_client.get(change_url(row)).content.decode()
    assert 'id="acknowledge-link"' in content
    url = reverse("admin:notifications_notification_acknowledge", args=[row.pk])
    form = operator_client.get(url)
    assert form.status_code == 200 and b'name="note"' in form.content
    assert Notification.objects.get(pk=row.pk).acknowledged_at is None  # the form's GET changes nothing
    response = operator_client.post(url, {"note": "called the plant"}, follow=True)
    assert "Acknowledged." in response.content.decode()
    stored = Notification.objects.get(pk=row.pk)
    assert (stored.acknowledged_via, stored.acknowledged_by, stored.acknowledged_note) == (
        "console",
        "olivia",
        "called the plant",
    )
    assert LogEntry.objects.filter(object_id=str(row.pk), change_message__contains="Acknowledged via console").exists()
    again = operator_client.post(url, {"note": "me too"}, follow=True).content.decode()
    assert "Already acknowledged by olivia" in again


def test_the_unacknowledged_tile_and_filter_show_the_rows_waiting_for_someone(operator_client):
    waiting = make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL, subject="Gas detector fault")
    make_notification(asks_ack=True, subject="Seen already", acknowledged_at=timezone.now(), acknowledged_by="x")
    make_notification(asks_ack=True, subject="Back to normal", cleared_at=timezone.now())
    make_notification(asks_ack=False, subject="Does not ask")
    content = operator_client.get(OUTBOX).content.decode()
    assert re.search(r'id="kpi-unacknowledged"[^>]*><span class="outbox-tile-value">1<', content)
    assert f'href="{OUTBOX}?ack=unacknowledged"' in content
    assert "Unacknowledged by priority" in content
    listed = operator_client.get(OUTBOX, {"ack": "unacknowledged"}).content.decode()
    assert "Gas detector fault" in listed
    assert str(waiting.pk)[:8] in listed
    for subject in ("Seen already", "Back to normal", "Does not ask"):
        assert subject not in listed
    by_priority = operator_client.get(OUTBOX, {"ack": "unacknowledged", "priority": "high"}).content.decode()
    assert "Gas detector fault" not in by_priority


def test_the_outbox_shows_time_to_acknowledge_per_list_and_site(operator_client):
    now = timezone.now()
    make_notification(
        asks_ack=True,
        created_at=now - timedelta(minutes=3),
        acknowledged_at=now,
        acknowledged_by="x",
        acknowledged_via="sms",
    )
    content = operator_client.get(OUTBOX).content.decode()
    assert 'id="kpi-time-to-ack"' in content
    section = content[content.index('id="kpi-time-to-ack"') :]
    assert "<th>Operators</th><td>1</td><td>3 min</td>" in section


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_in_a_browser_an_operator_acknowledges_from_the_notification_page(page, live_server):  # noqa: F811
    operator = make_user("olivia", groups=["Operators"])
    row = make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL, subject="Gas detector 4 fault")
    log_in(page, live_server, operator)
    page.goto(f"{live_server.url}{change_url(row)}")
    page.click("#acknowledge-link")
    page.fill("textarea[name=note]", "on my way")
    page.click("#confirm-acknowledge")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Acknowledged." in page.locator("ul.messagelist").inner_text()
    assert "Acknowledged by olivia via the console" in page.locator("#timeline").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#timeline").screenshot(path=str(ARTIFACTS / "console-notification-history.png"))
    assert page.locator("#acknowledge-link").count() == 0
    assert Notification.objects.get(pk=row.pk).acknowledged_note == "on my way"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_on_a_phone_the_link_page_fits_the_screen_and_its_button_acknowledges(browser, live_server):  # noqa: F811
    from notifications.ack_links import ack_token_make

    row = make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL, subject="Gas detector 4 fault")
    context = browser.new_context(viewport={"width": 375, "height": 667}, is_mobile=True, has_touch=True)
    context.set_default_timeout(15_000)
    phone = context.new_page()
    try:
        phone.goto(f"{live_server.url}/ack/{ack_token_make(notification_id=row.pk)}/")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 375  # no sideways scrolling
        button = phone.locator("#acknowledge")
        assert button.is_visible() and button.bounding_box()["height"] >= 44  # a thumb-sized target
        assert Notification.objects.get(pk=row.pk).acknowledged_at is None  # opening it changed nothing
        ARTIFACTS.mkdir(exist_ok=True)
        phone.screenshot(path=str(ARTIFACTS / "ack-page-phone.png"), full_page=True)
        phone.fill("input[name=name]", "Jane Doe")
        with phone.expect_navigation() as navigation:
            button.tap()  # a real browser's POST: its Origin and cookie pass the CSRF check
        assert navigation.value is not None and navigation.value.status == 200
        phone.wait_for_selector("#ack-outcome")
        phone.screenshot(path=str(ARTIFACTS / "ack-page-phone-done.png"), full_page=True)
        assert "Acknowledged" in phone.locator("#ack-outcome").inner_text()
    finally:
        context.close()
    stored = Notification.objects.get(pk=row.pk)
    assert (stored.acknowledged_by, stored.acknowledged_via) == ("Jane Doe", "link")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_link_pages_and_the_acknowledge_form_have_no_serious_accessibility_violations(
    browser,  # noqa: F811
    live_server,
    theme,
):
    import json

    from notifications.ack_links import ack_token_make
    from tests.admin.test_accessibility import axe_load_with_every_page, axe_serious

    operator = make_user("olivia", groups=["Operators"])
    waiting = make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL, subject="Gas detector fault")
    done = make_notification(
        asks_ack=True, acknowledged_at=timezone.now(), acknowledged_by="Jane Doe", acknowledged_via="link"
    )
    # The link pages on a phone; the console (built for 1280 px and wider) on a desktop screen.
    screens = {
        (390, 844): {
            "ack-confirm": f"/ack/{ack_token_make(notification_id=waiting.pk)}/",
            "ack-done": f"/ack/{ack_token_make(notification_id=done.pk)}/",
            "ack-invalid": "/ack/not-a-token/",
        },
        (1440, 900): {
            "console-notification": change_url(waiting),
            "console-acknowledge": reverse("admin:notifications_notification_acknowledge", args=[waiting.pk]),
        },
    }
    found = {}
    for (width, height), pages in screens.items():
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=theme, bypass_csp=True)
        context.set_default_timeout(15_000)
        axe_load_with_every_page(context)
        tab = context.new_page()
        try:
            log_in(tab, live_server, operator)
            for name, url in pages.items():
                tab.goto(f"{live_server.url}{url}")
                violations = axe_serious(tab)
                if violations:
                    found[name] = violations
        finally:
            context.close()
    assert found == {}, json.dumps(found, indent=2)
