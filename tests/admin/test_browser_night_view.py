"""The night view in a real headless Chromium: with 500 mixed rows the outbox table is built
around the subject at 1280×800 and 1440×900 (first row above the fold, subject ≥ 30 % of the
table, no sideways scroll) and is a card per row on a 390×844 phone (subject, status, site and
age visible); the 3 a.m. scenario (one list's webhook receiver down while email flows) says
Degraded, names the webhook channel and one click lists the sites and lists it hits; "/"
focuses the search; the refresh note is a 24-hour clock.
"""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications.models import ChannelHealth, Notification, WorkerProcess
from tests.admin.conftest import make_notification, make_user
from tests.admin.test_browser import ARTIFACTS, browser, log_in  # noqa: F401 (the browser fixture)
from tests.admin.test_browser_outbox import LONG_ERROR, LONG_SUBJECT, viewport_page  # noqa: F401

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def worker_alive() -> None:
    now = timezone.now()
    WorkerProcess.objects.create(host="web-1", pid=4242, cluster="outbox", started_at=now, last_seen_at=now)


def five_hundred_mixed_rows() -> None:
    statuses = [Status.PENDING, Status.RETRYING, Status.DELIVERED, Status.PARKED, Status.DISCARDED]
    rows = []
    for n in range(500):
        status = statuses[n % len(statuses)]
        rows.append(
            make_notification(
                status=status,
                age=timedelta(minutes=n),
                subject=(LONG_SUBJECT if n % 2 else f"ポンプ {n} 停止 — pump {n} tripped"),
                last_error=LONG_ERROR if status in (Status.PARKED, Status.RETRYING) else "",
                list_name="Maintenance and reliability engineering on-call" if n % 3 == 0 else "Operators",
                source_site_id=f"plant-{n % 7:02d}-north-east",
                retry_count=n % 11,
            )
        )


def layout(page) -> dict:
    return page.evaluate(
        """() => {
            const table = document.querySelector('#result_list');
            const row = document.querySelector('#result_list tbody tr');
            const subject = row.querySelector('td.field-subject_column');
            return {
                scroll: document.documentElement.scrollWidth - document.documentElement.clientWidth,
                tableWidth: table.getBoundingClientRect().width,
                subjectWidth: subject.getBoundingClientRect().width,
                rowBottom: row.getBoundingClientRect().bottom,
                viewport: window.innerHeight,
            };
        }"""
    )


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (1440, 900)])
def test_the_table_is_built_around_the_subject_with_the_first_row_above_the_fold(
    viewport_page,  # noqa: F811
    live_server,
    width,
    height,
):
    ARTIFACTS.mkdir(exist_ok=True)
    worker_alive()
    five_hundred_mixed_rows()
    page = viewport_page(width, height)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    page.screenshot(path=str(ARTIFACTS / f"night-outbox-{width}.png"))
    assert page.locator("#outbox-status-line").is_visible()
    measured = layout(page)
    assert measured["scroll"] <= 0, measured
    assert measured["rowBottom"] <= measured["viewport"], measured  # the first row without scrolling
    assert measured["subjectWidth"] >= 0.3 * measured["tableWidth"], measured


def test_on_a_phone_each_row_is_a_card_with_subject_status_site_and_age(viewport_page, live_server):  # noqa: F811
    ARTIFACTS.mkdir(exist_ok=True)
    worker_alive()
    five_hundred_mixed_rows()
    page = viewport_page(390, 844)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    for url in (OUTBOX, reverse("admin:index")):
        page.goto(f"{live_server.url}{url}")
        page.screenshot(path=str(ARTIFACTS / f"night-390-{url.strip('/').replace('/', '-')}.png"), full_page=True)
        scroll = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert scroll <= 0, (url, scroll)
    page.goto(f"{live_server.url}{OUTBOX}")
    cells = page.evaluate(
        """() => [...document.querySelectorAll('#result_list tbody tr')].slice(0, 20).map(row => {
            const seen = name => { const cell = row.querySelector('.field-' + name);
                const box = cell && cell.getBoundingClientRect();
                return !!box && box.width > 20 && box.height > 8 && box.right <= window.innerWidth + 1
                    && cell.innerText.trim().length > 0; };
            return {subject: seen('subject_column'), status: seen('status_badge'),
                    site: seen('site_column'), age: seen('created_column')};
        })"""
    )
    assert cells and all(all(row.values()) for row in cells), cells
    page.screenshot(path=str(ARTIFACTS / "night-outbox-390.png"))


def test_at_3am_a_dead_webhook_receiver_degrades_the_line_and_one_click_shows_where_it_hits(
    viewport_page,  # noqa: F811
    live_server,
):
    worker_alive()
    opened = timezone.now() - timedelta(minutes=14)
    ChannelHealth.objects.create(
        channel="webhook",
        endpoint=_webhook_endpoint(),
        state=ChannelHealth.State.OPEN,
        opened_at=opened,
        consecutive_failures=12,
        last_failure_class="connection",
        last_error="[Errno 111] Connection refused",
    )
    for _ in range(6):
        make_notification(type="webhook", status=Status.RETRYING, list_name="Line-3", source_site_id="plant-a")
    for _ in range(3):
        make_notification(type="webhook", status=Status.PENDING, list_name="Line-3", source_site_id="plant-b")
    make_notification(type="webhook", status=Status.PENDING, list_name="Boilers", source_site_id="plant-b")
    for n in range(20):  # email flows
        make_notification(status=Status.DELIVERED, age=timedelta(minutes=n))
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{reverse('admin:index')}")
    line = page.locator("#outbox-status-line")
    assert line.get_attribute("data-state") == "degraded"
    assert "Degraded" in line.inner_text() and "webhook channel open, 10 waiting" in line.inner_text()
    page.click("#outbox-status-next")
    sites = page.locator("#breakdown-sites").inner_text()
    lists = page.locator("#breakdown-lists").inner_text()
    assert "plant-a\t6" in sites and "plant-b\t4" in sites, sites
    assert "Line-3\t9" in lists and "Boilers\t1" in lists, lists
    page.screenshot(path=str(ARTIFACTS / "night-channel-breakdown.png"), full_page=True)
    # The outbox rows waiting on it say so instead of a stale error.
    page.goto(f"{live_server.url}{OUTBOX}?type=webhook")
    assert "waiting for webhook (open since" in page.locator("#result_list").inner_text()
    assert "10 waiting)" in page.locator("#result_list").inner_text()


def test_one_click_on_a_site_beside_the_filters_makes_the_tiles_count_that_site(
    viewport_page,  # noqa: F811
    live_server,
):
    worker_alive()
    five_hundred_mixed_rows()
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    tile = page.locator("#kpi-queue-depth .outbox-tile-value")
    assert tile.inner_text() == "200"  # every site's Pending and Retrying rows
    page.locator("#outbox-matches-sites a", has_text="plant-03-north-east").click()
    page.wait_for_url("**site=plant-03-north-east**")
    # 500 rows over 7 sites: plant-03 holds n = 3, 10, 17 …; Pending and Retrying are n % 5 of 0 and 1.
    queued = sum(1 for n in range(500) if n % 7 == 3 and n % 5 in (0, 1))
    assert tile.inner_text() == str(queued)
    assert page.locator("#kpi-filtered-note").is_visible()
    page.locator("#kpi-per-site-filtered summary").click()
    rows = page.locator("#kpi-per-site-filtered tbody tr")
    assert rows.count() == 1 and rows.first.locator("th").inner_text() == "plant-03-north-east"
    assert page.locator("#outbox-matches-title").inner_text() == f"Matches: {sum(1 for n in range(500) if n % 7 == 3)}"
    # The tile's own link keeps the site and shows its rows.
    page.locator("#kpi-queue-depth").click()
    page.wait_for_url("**status=queued**")
    assert "site=plant-03-north-east" in page.url
    assert page.locator("#result_list tbody tr").count() == queued
    page.screenshot(path=str(ARTIFACTS / "night-outbox-filtered-1280.png"))


def test_slash_focuses_the_search(viewport_page, live_server):  # noqa: F811
    make_notification()
    page = viewport_page(1280, 800)
    log_in(page, live_server, make_user("olivia", groups=["Operators"]))
    page.goto(f"{live_server.url}{OUTBOX}")
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.id") == "searchbar"
    page.keyboard.type("pump")
    assert page.input_value("#searchbar") == "pump"  # the "/" itself is not typed


def _webhook_endpoint() -> str:
    from notifications.health import channel_endpoints

    return channel_endpoints().get("webhook") or ""
