"""The outbox page in a real headless Chromium: the table fits 1280 and 1440 px wide screens
with 200 mixed rows, long text opens by keyboard, the header stays in view; an administrator
groups Parked rows by cause, creates the missing list, retries the group and watches the
redrive view reach "all delivered" through a real dispatcher pass and SMTP server; the time
presets; the CSV export; the auto-refresh toggle. Screenshots go to test-artifacts/.

Skipped, with the reason printed, where Chromium or Playwright is absent (see test_browser.py).
"""

import csv
import io
import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse

from notifications.dispatch.runner import dispatch_pass
from notifications.models import Notification, SmtpConfiguration
from tests.admin.conftest import make_notification, make_user
from tests.admin.test_browser import ARTIFACTS, browser, log_in  # noqa: F401 (the browser fixture)
from tests.support.smtp import SmtpServer

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")
UNKNOWN = "Permanent failure (configuration): Unknown notification list 'Night-Shift'."

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_SUBJECT = "Compressor 4 discharge temperature above the high-high limit on line three, " * 3
LONG_ERROR = (
    "Retries exhausted (10): 451 4.3.0 Mail server temporarily rejected message because the mailbox "
    "quota of the receiving system is exceeded; please contact the postmaster of example.com " * 2
)


def mixed_rows(count: int) -> None:
    statuses = [Status.PENDING, Status.RETRYING, Status.DELIVERED, Status.PARKED, Status.DISCARDED]
    for n in range(count):
        status = statuses[n % len(statuses)]
        make_notification(
            status=status,
            age=timedelta(minutes=n),
            subject=LONG_SUBJECT if n % 2 else f"Pump {n} tripped",
            last_error=LONG_ERROR if status in (Status.PARKED, Status.RETRYING) else "",
            list_name="Maintenance and reliability engineering on-call" if n % 3 == 0 else "Operators",
            source_site_id=f"plant-{n % 7:02d}-north-east",
            retry_count=n % 11,
        )


@pytest.fixture
def viewport_page(browser):  # noqa: F811
    contexts = []

    def open_page(width: int, height: int):
        context = browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (1440, 900)])
def test_the_outbox_table_fits_the_screen_with_200_mixed_rows(viewport_page, live_server, width, height):
    ARTIFACTS.mkdir(exist_ok=True)
    mixed_rows(200)
    page = viewport_page(width, height)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}?all=")
    assert page.locator("#result_list tbody tr").count() == 200
    overflow = page.evaluate(
        """() => ({
            page: document.documentElement.scrollWidth - document.documentElement.clientWidth,
            results: (() => { const r = document.querySelector('#changelist .results');
                              return r.scrollWidth - r.clientWidth; })(),
            tableRight: document.querySelector('#result_list').getBoundingClientRect().right,
            viewport: window.innerWidth,
            rowHeight: document.querySelector('#result_list tbody tr').getBoundingClientRect().height,
        })"""
    )
    assert overflow["page"] <= 0, overflow
    assert overflow["results"] <= 0, overflow
    assert overflow["tableRight"] <= overflow["viewport"], overflow
    assert overflow["rowHeight"] < 45, overflow  # one line per row, not five
    page.evaluate("() => document.querySelector('#changelist-search').scrollIntoView()")
    page.screenshot(path=str(ARTIFACTS / f"outbox-{width}.png"))

    # The header stays in view while the rows scroll.
    page.mouse.wheel(0, 3000)
    page.wait_for_function("() => window.scrollY > 1000")
    top = page.evaluate("() => document.querySelector('#result_list thead th').getBoundingClientRect().top")
    assert -1 <= top <= 2, top

    # A long error opens to its full text from the keyboard.
    page.evaluate("() => window.scrollTo(0, 0)")
    clipped = page.locator("#result_list td.field-last_error_excerpt details.outbox-clip").first
    clipped.locator("summary").focus()
    page.keyboard.press("Enter")
    assert clipped.get_attribute("open") is not None
    full = clipped.locator(".outbox-clip-full")
    assert full.is_visible() and "postmaster of example.com" in full.inner_text()
    after = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert after <= 0


def test_parked_group_create_list_retry_and_redrive_to_all_delivered(viewport_page, live_server):
    ARTIFACTS.mkdir(exist_ok=True)
    rows = [
        make_notification(
            status=Status.PARKED,
            list_name="Night-Shift",
            last_error=UNKNOWN,
            failure_code="unknown_list",
            source_site_id=site,
        )
        for site in ("plant-a", "plant-a", "plant-b")
    ]
    make_notification(status=Status.PARKED)  # another cause, left alone
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("adam", groups=["Administrators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    page.click("#parked-groups-link")
    group = page.locator("section.outbox-group", has_text="Night-Shift")
    assert "3 parked" in group.locator("h2").inner_text()
    assert "plant-a (2)" in group.inner_text() and "plant-b (1)" in group.inner_text()
    page.screenshot(path=str(ARTIFACTS / "parked-by-cause.png"), full_page=True)

    group.locator("a.outbox-group-create-list").click()
    assert page.input_value("input[name=name]") == "Night-Shift"
    page.fill("input[name='email_recipients-0-email']", "night.lead@example.com")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist li.success")

    page.goto(f"{live_server.url}{reverse('admin:notifications_notification_parked')}")
    group = page.locator("section.outbox-group", has_text="Night-Shift")
    assert "exists now" in group.locator(".outbox-group-ready").inner_text()

    with SmtpServer() as smtp:
        SmtpConfiguration.objects.create(
            host=smtp.host, port=smtp.port, security="none", from_address="outbox@example.com", timeout_seconds=5
        )
        group.locator("button.outbox-group-retry").click()
        page.click("#confirm-retry")  # "Retry all" asks first
        page.wait_for_url(re.compile(r".*/redrive/\?at=.*"))
        assert page.locator("#redrive-waiting .outbox-tile-value").inner_text() == "3"
        assert "still waiting" in page.locator("#redrive-state").inner_text()
        page.evaluate("() => { window.outboxNotReloaded = true; }")

        # The dispatcher runs beside the open page, as the worker would.
        reports = []
        worker = threading.Thread(
            target=lambda: reports.append(dispatch_pass(worker_id="browser-redrive", time_budget=20))
        )
        worker.start()
        worker.join(30)
        smtp.wait_for(3)
        assert reports and reports[0].claimed == 3, reports

        page.wait_for_function(
            "() => document.querySelector('#redrive-state').textContent.includes('Done: all 3 delivered')",
            timeout=15_000,
        )
        assert page.evaluate("() => window.outboxNotReloaded") is True  # updated in place
        assert page.locator("#redrive-delivered .outbox-tile-value").inner_text() == "3"
        page.screenshot(path=str(ARTIFACTS / "redrive-done.png"), full_page=True)
    assert {row.status for row in Notification.objects.filter(pk__in=[r.pk for r in rows])} == {Status.DELIVERED}
    assert Notification.objects.filter(status=Status.PARKED).count() == 1


def test_time_presets_and_csv_export(viewport_page, live_server):
    recent = make_notification(age=timedelta(minutes=5), subject="Recent alarm")
    make_notification(age=timedelta(hours=3), subject="Older alarm")
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    page.click("a.outbox-preset:text-is('1 h')")
    page.wait_for_url(re.compile(r".*created_within=1h.*"))
    assert page.locator("#result_list tbody tr").count() == 1
    assert "Recent alarm" in page.locator("#result_list tbody").inner_text()

    with page.expect_download() as download_info:
        page.click("#export-csv-link")
    download = download_info.value
    assert download.suggested_filename.startswith("outbox-") and download.suggested_filename.endswith(".csv")
    rows = list(csv.reader(io.StringIO(Path(download.path()).read_text(encoding="utf-8-sig"))))
    assert [row[0] for row in rows[1:]] == [str(recent.pk)]


def test_auto_refresh_updates_the_table_and_tiles_without_reloading(viewport_page, live_server):
    make_notification(subject="First alarm")
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    page.evaluate("() => { window.outboxNotReloaded = true; }")
    page.locator("#outbox-autorefresh").evaluate("el => el.setAttribute('data-interval', '1')")
    page.check("#outbox-autorefresh")
    make_notification(status=Status.PARKED, subject="Second alarm")
    page.wait_for_function("() => document.querySelector('#result_list tbody').textContent.includes('Second alarm')")
    page.wait_for_function("() => document.querySelector('#kpi-parked .outbox-tile-value').textContent.trim() === '1'")
    assert page.evaluate("() => window.outboxNotReloaded") is True
    page.reload()
    assert page.is_checked("#outbox-autorefresh")  # remembered


def test_my_zone_button_switches_every_timestamp_to_the_browsers_zone(browser, live_server):  # noqa: F811
    from datetime import UTC, datetime

    row = make_notification(created_at=datetime(2026, 1, 15, 9, 30, 5, tzinfo=UTC))
    context = browser.new_context(viewport={"width": 1280, "height": 800}, timezone_id="Europe/Zurich")
    try:
        page = context.new_page()
        log_in(page, live_server, make_user("olivia", groups=["Operators"]))
        page.goto(f"{live_server.url}{OUTBOX}")
        assert "2026-01-15 09:30:05 UTC" in page.locator("#result_list tbody").inner_text()
        assert page.locator("#outbox-zone-local").inner_text() == "My zone (Europe/Zurich)"
        page.click("#outbox-zone-local")
        page.wait_for_selector("ul.messagelist li.success")
        assert "2026-01-15 10:30:05 CET" in page.locator("#result_list tbody").inner_text()
        page.goto(f"{live_server.url}{reverse('admin:notifications_notification_change', args=[row.pk])}")
        assert "2026-01-15 10:30:05 CET" in page.locator("#content").inner_text()
    finally:
        context.close()
