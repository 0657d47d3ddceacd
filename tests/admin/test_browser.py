"""The console in a real headless Chromium (Debian's package, driven by Playwright's Python
package): an operator retries a parked notification and watches it get delivered; an
administrator adds a recipient. Screenshots go to test-artifacts/.

Skipped, with the reason printed, where /usr/bin/chromium or the playwright package is absent
(.ci/run installs both).
"""

import os
import re
from pathlib import Path

import pytest
from django.urls import reverse

from notifications.dispatch.runner import dispatch_pass
from notifications.models import EmailRecipient, Notification, SmtpConfiguration
from tests.admin.conftest import PASSWORD, make_notification, make_user
from tests.support.smtp import SmtpServer

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
Status = Notification.Status

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _skip_reason():
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt-get install chromium); browser tests skipped"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -r requirements-dev.txt); browser tests skipped"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _skip_reason()
    if reason:
        print(f"\nSKIP browser tests: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the ORM calls made between
    # browser steps (fixtures, assertions) are still plain synchronous calls.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def deliver_pending(operators_list):
    """Runs one dispatcher pass against a real SMTP server on loopback."""
    with SmtpServer() as smtp:
        SmtpConfiguration.objects.create(
            host=smtp.host, port=smtp.port, security="none", from_address="outbox@example.com", timeout_seconds=5
        )

        def deliver():
            report = dispatch_pass(worker_id="browser-test", time_budget=20)
            assert report.claimed == 1, report
            smtp.wait_for(1)

        yield deliver


def log_in(page, live_server, user):
    page.goto(f"{live_server.url}{reverse('admin:login')}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}{reverse('admin:index')}")


def row_status(page, notification):
    row = page.locator("#result_list tbody tr", has_text=str(notification.pk)[:8])
    return row.locator("td.field-status_badge").inner_text()


def test_operator_filters_to_parked_retries_one_and_sees_it_pending_then_delivered(page, live_server, deliver_pending):
    ARTIFACTS.mkdir(exist_ok=True)
    operator = make_user("olivia", groups=["Operators"])
    parked = make_notification(status=Status.PARKED, subject="Chiller 2 high pressure")
    make_notification(status=Status.PARKED, subject="Feeder 9 offline")
    make_notification(status=Status.DELIVERED, subject="Pump 3 tripped")

    log_in(page, live_server, operator)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert page.locator("#kpi-parked .outbox-tile-value").inner_text() == "2"

    page.click("#kpi-parked")  # the tile links to the outbox filtered to Parked
    page.wait_for_url(re.compile(r".*status=Parked.*"))
    assert page.locator("#result_list tbody tr").count() == 2
    page.screenshot(path=str(ARTIFACTS / "outbox.png"), full_page=True)

    page.locator("#result_list tbody tr", has_text="Chiller 2").locator("input.action-select").check()
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Retried 1 notification." in page.locator("ul.messagelist").inner_text()

    page.goto(f"{live_server.url}{reverse('admin:notifications_notification_changelist')}")
    assert row_status(page, parked) == "Pending"

    deliver_pending()
    page.reload()
    assert row_status(page, parked) == "Delivered"
    page.screenshot(path=str(ARTIFACTS / "outbox-after-retry.png"), full_page=True)


def test_administrator_adds_a_recipient_to_a_list(page, live_server, operators_list):
    administrator = make_user("adam", groups=["Administrators"])
    log_in(page, live_server, administrator)
    page.goto(f"{live_server.url}{reverse('admin:notifications_notificationlist_change', args=[operators_list.pk])}")
    page.fill("input[name='email_recipients-2-email']", "shift.lead@example.com")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist li.success")
    assert EmailRecipient.objects.filter(notification_list=operators_list, email="shift.lead@example.com").exists()
    assert operators_list.email_recipients.count() == 3


def test_operator_sees_the_html_preview_rendered_and_nothing_in_it_runs(page, live_server, operators_list):
    ARTIFACTS.mkdir(exist_ok=True)
    operator = make_user("olivia", groups=["Operators"])
    notification = make_notification(
        type_data={
            "html": "<h2>Pump 3 tripped</h2><table><tr><td style='color:red'>41.5 A</td></tr></table>"
            "<script>alert('script')</script><img src=x onerror=\"alert('handler')\">"
            "<a href=\"javascript:alert('link')\">acknowledge</a>"
        }
    )
    dialogs: list[str] = []

    def record(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", record)
    log_in(page, live_server, operator)
    page.goto(f"{live_server.url}{reverse('admin:notifications_notification_change', args=[notification.pk])}")
    frame = page.frame_locator("iframe.outbox-html-preview")
    assert frame.locator("h2").inner_text() == "Pump 3 tripped"
    assert frame.locator("td").inner_text() == "41.5 A"
    frame.locator("a").click()  # the javascript: URL was removed; nothing happens
    page.screenshot(path=str(ARTIFACTS / "html-preview.png"), full_page=True)
    assert dialogs == []
    assert page.locator("iframe.outbox-html-preview").get_attribute("sandbox") == ""
