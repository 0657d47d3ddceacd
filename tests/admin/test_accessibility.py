"""Accessibility of the console's main pages in a real headless Chromium: axe-core (vendored in
tests/support/vendor/, injected from the file — no network) finds no serious or critical
violation on each page in the light and the dark theme, on a desktop and a phone screen
(390×844). With ``OUTBOX_SCREENSHOTS=1`` (``make screenshots`` sets it and runs only this
test) a full-page screenshot of each page is written to test-artifacts/; the suite leaves them
out (72 full-page captures, a noticeable part of this test's time).

Skipped, with the reason printed, where /usr/bin/chromium or the playwright package is absent.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications.health import channel_endpoints
from notifications.models import (
    ChannelHealth,
    EmailRecipient,
    IncidentNote,
    Notification,
    NotificationList,
    SmtpConfiguration,
)
from sites.models import Site, SiteHeartbeat
from tests.admin.conftest import make_notification, make_user
from tests.admin.test_browser import ARTIFACTS, browser, log_in  # noqa: F401  (fixture)

SCREENSHOTS = os.environ.get("OUTBOX_SCREENSHOTS") == "1"
AXE_JS = Path(__file__).resolve().parents[1] / "support" / "vendor" / "axe-4.10.3.min.js"
Status = Notification.Status

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def console_data():
    """A little of everything the main pages show."""
    from django.utils import timezone

    operators = NotificationList.objects.create(name="Operators", description="Control room")
    EmailRecipient.objects.create(notification_list=operators, email="ops@example.com")
    SmtpConfiguration.objects.create(
        host="smtp.example.com", port=587, security="starttls", from_address="outbox@example.com"
    )
    site = Site.objects.create(site_id="plant-a", name="Plant A")
    SiteHeartbeat.objects.create(site=site, received_at=timezone.now(), agent_version="1.0")
    make_notification(status=Status.PARKED, subject="Chiller 2 high pressure")
    make_notification(status=Status.RETRYING, subject="Feeder 9 offline", retry_count=2, last_error="451 later")
    make_notification(status=Status.DELIVERED, subject="Pump 3 tripped", age=timedelta(hours=2))
    make_notification(status=Status.PENDING, subject="Boiler 1 pressure low", age=timedelta(hours=3))
    detail = make_notification(status=Status.DISCARDED, subject="Test alarm")
    return {"list": operators, "site": site, "notification": detail}


def main_pages(data):
    smtp = SmtpConfiguration.objects.get()
    return [
        ("dashboard", reverse("admin:index")),
        ("dashboard-7d", reverse("admin:index") + "?trends=7d"),
        ("outbox", reverse("admin:notifications_notification_changelist")),
        # Filtered: the tiles and the per-site table count the matching rows.
        ("outbox-filtered", reverse("admin:notifications_notification_changelist") + "?site=plant-a"),
        ("notification", reverse("admin:notifications_notification_change", args=[data["notification"].pk])),
        ("lists", reverse("admin:notifications_notificationlist_changelist")),
        ("list", reverse("admin:notifications_notificationlist_change", args=[data["list"].pk])),
        ("list-recipients", reverse("admin:notifications_notificationlist_recipients", args=[data["list"].pk])),
        ("list-send-test", reverse("admin:notifications_notificationlist_send_test", args=[data["list"].pk])),
        ("smtp", reverse("admin:notifications_smtpconfiguration_change", args=[smtp.pk])),
        ("sites", reverse("admin:sites_site_changelist")),
        ("site", reverse("admin:sites_site_change", args=[data["site"].pk])),
        ("parked-groups", reverse("admin:notifications_notification_parked")),
        ("channel-breakdown", reverse("admin:notifications_notification_channel") + "?channel=email"),
        ("policies", reverse("admin:notifications_deliverypolicy_changelist")),
        ("policy-add", reverse("admin:notifications_deliverypolicy_add") + "?channel=webhook"),
        ("flood-report", reverse("admin:notifications_notification_flood")),
        ("silences", reverse("admin:notifications_silence_changelist")),
        ("silence-add", reverse("admin:notifications_silence_add") + "?site=plant-a&preset=2h"),
    ]


def axe_load_with_every_page(context):
    """Have ``context`` load axe-core into every page it opens (an init script, given once),
    rather than send it to each page after the page has loaded: with violations only in the
    results, that took this test from 22 s to 13 s per screen and theme."""
    context.add_init_script(path=str(AXE_JS))


def axe_serious(page):
    """The serious and critical axe-core violations on the current page (WCAG 2.x A and AA);
    axe-core is injected first unless the page's context loads it already."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE_JS))
    result = page.evaluate(
        """async () => await axe.run(document, {runOnly: {type: 'tag',
             values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa']},
             resultTypes: ['violations']})"""
    )
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [node["target"] for node in v["nodes"]][:5],
            "summary": v["nodes"][0].get("failureSummary", "") if v["nodes"] else "",
        }
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_main_pages_have_no_serious_accessibility_violations(
    browser,  # noqa: F811
    live_server,
    console_data,
    theme,
    width,
    height,
):
    ARTIFACTS.mkdir(exist_ok=True)
    administrator = make_user("adam", groups=["Administrators"])
    suffix = "" if width > 800 else "-phone"
    # An open channel and a note on it: the status line, the channel box and the notes are checked too.
    ChannelHealth.objects.create(
        channel="email", endpoint=channel_endpoints()["email"] or "", state="open", opened_at=timezone.now()
    )
    IncidentNote.objects.create(subject="channel:email", text="relay team called, ETA 04:00", author="olivia")
    # bypass_csp lets the test inject axe-core; the pages themselves run under their real policy.
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=theme, bypass_csp=True)
    context.set_default_timeout(15_000)
    axe_load_with_every_page(context)
    page = context.new_page()
    try:
        log_in(page, live_server, administrator)
        found = {}
        for name, url in main_pages(console_data):
            response = page.goto(f"{live_server.url}{url}")
            assert response is not None and response.status == 200, (name, url)
            if SCREENSHOTS:
                page.screenshot(path=str(ARTIFACTS / f"console-{name}-{theme}{suffix}.png"), full_page=True)
            violations = axe_serious(page)
            if violations:
                found[name] = violations
        assert found == {}, json.dumps(found, indent=2)
    finally:
        context.close()


def test_console_actions_are_reachable_by_keyboard_and_at_least_24px(browser, live_server, console_data):  # noqa: F811
    operator = make_user("olivia", groups=["Operators"])
    parked = Notification.objects.get(subject="Chiller 2 high pressure")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        log_in(page, live_server, operator)
        page.goto(f"{live_server.url}{reverse('admin:notifications_notification_change', args=[parked.pk])}")
        retry = page.locator("#retry-button")
        box = retry.bounding_box()
        assert box is not None and box["height"] >= 24 and box["width"] >= 24, box
        # Tab from the top of the page until the Retry button has the focus, then press Enter.
        for _ in range(60):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement && document.activeElement.id") == "retry-button":
                break
        else:
            pytest.fail("the Retry button cannot be reached with the Tab key")
        page.keyboard.press("Enter")
        page.wait_for_selector("ul.messagelist li.success")
        parked.refresh_from_db()
        assert parked.status == Status.PENDING
    finally:
        context.close()


def test_branding_and_favicon(browser, live_server, console_data):  # noqa: F811
    administrator = make_user("adam", groups=["Administrators"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        log_in(page, live_server, administrator)
        assert page.title().endswith("| Outbox")
        assert page.locator("#site-name").inner_text().strip() == "Outbox"
        icon = page.locator("link[rel=icon]").get_attribute("href")
        assert icon and icon.endswith("favicon.svg")
        response = page.request.get(f"{live_server.url}{icon}")
        assert response.status == 200 and b"<svg" in response.body()
    finally:
        context.close()
