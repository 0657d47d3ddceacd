"""The night view's server side: the status line's rules, an open channel's breakdown by site
and list, the waiting rows' words, counts beside the filters, tiles and a per-site table that
follow the filters, and incident notes (kept, with who and when, never an acknowledgement)."""

import html
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications import status_line
from notifications.health import channel_endpoints
from notifications.kpis import kpis_compute
from notifications.models import (
    ChannelHealth,
    IncidentNote,
    MaintenanceWindow,
    Notification,
    Silence,
    WorkerProcess,
)
from tests.admin.conftest import make_notification, make_user

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")
CHANNEL = reverse("admin:notifications_notification_channel")
NOTES = reverse("admin:notifications_notification_notes")
PARKED = reverse("admin:notifications_notification_parked")


@pytest.fixture
def worker(db):
    now = timezone.now()
    return WorkerProcess.objects.create(host="w", pid=1, cluster="c", started_at=now, last_seen_at=now)


def open_channel(name="webhook", minutes=14):
    return ChannelHealth.objects.create(
        channel=name,
        endpoint=channel_endpoints()[name] or "",
        state=ChannelHealth.State.OPEN,
        opened_at=timezone.now() - timedelta(minutes=minutes),
        last_failure_class="connection",
    )


def compute():
    return status_line.status_line_compute(kpis=kpis_compute())


def test_all_quiet_is_ok(worker):
    make_notification(status=Status.DELIVERED)
    line = compute()
    assert (line.state, line.word, line.findings) == ("ok", "OK", [])


def test_a_stopped_worker_is_down_and_says_to_start_one(db):
    seen = timezone.now() - timedelta(hours=1)
    WorkerProcess.objects.create(host="w", pid=1, cluster="c", started_at=seen, last_seen_at=seen)
    line = compute()
    assert line.state == "down" and line.since == seen and "qcluster" in line.next_step


def test_an_open_channel_while_others_deliver_is_degraded_and_names_the_channel(worker):
    health = open_channel()
    make_notification(type="webhook", status=Status.RETRYING)
    make_notification(status=Status.DELIVERED)
    line = compute()
    assert line.state == "degraded" and line.since == health.opened_at
    assert [finding.key for finding in line.findings] == ["channel:webhook"]
    assert line.findings[0].what == "webhook channel open, 1 waiting"
    assert line.link == f"{CHANNEL}?channel=webhook"


def test_unacknowledged_critical_silent_sites_and_failing_watchdogs_are_findings(worker):
    from sites.models import Site, SiteHeartbeat, Watchdog

    make_notification(priority=Notification.Priority.CRITICAL, asks_ack=True)
    make_notification(priority=Notification.Priority.CRITICAL, asks_ack=True, acknowledged_at=timezone.now())
    site = Site.objects.create(site_id="plant-s", name="S")
    SiteHeartbeat.objects.create(site=site, received_at=timezone.now() - timedelta(hours=2))
    Site.objects.create(site_id="plant-direct", name="D", last_seen_at=timezone.now() - timedelta(hours=2))
    Watchdog.objects.create(
        site=site,
        name="pump-loop",
        every_seconds=60,
        list_name="Operators",
        state=Watchdog.State.SILENT,
        last_ping_at=timezone.now() - timedelta(hours=1),
    )
    findings = {finding.key: finding.what for finding in compute().findings}
    assert findings["unacknowledged"] == "1 critical unacknowledged"
    # Only the site that heart-beated before is silent; the one that posts directly is not.
    assert findings["sites"] == "1 site silent (plant-s)"
    assert findings["watchdogs"] == "1 watchdog failing"


def test_the_status_line_is_a_list_of_checks_one_more_is_one_function(worker, monkeypatch):
    def check_silences(inputs):
        return [status_line.Finding(level="degraded", what="1 silence active", next_step="x", key="silences")]

    monkeypatch.setattr(status_line, "STATUS_CHECKS", [*status_line.STATUS_CHECKS, check_silences])
    assert [finding.key for finding in compute().findings] == ["silences"]


def test_an_open_channel_while_nothing_is_delivered_is_down(worker):
    open_channel()
    make_notification(type="webhook", status=Status.PENDING)
    assert compute().state == "down"


def test_counts_are_capped(db):
    assert status_line.capped(10_000) == "10,000" and status_line.capped(10_001) == "10,000+"


def test_silences_and_maintenance_windows_in_force_are_shown_beside_the_line_and_ended_ones_are_not(client, worker):
    now = timezone.now()
    Silence.objects.create(site="plant-b", ends_at=now + timedelta(hours=2), reason="pump overhaul", created_by="alice")
    Silence.objects.create(
        site="plant-c", starts_at=now - timedelta(hours=3), ends_at=now - timedelta(hours=1), reason="done"
    )
    start = (now - timedelta(hours=1)).time().replace(microsecond=0)
    end = (now + timedelta(hours=1)).time().replace(microsecond=0)
    MaintenanceWindow.objects.create(site="plant-d", days=list(range(7)), starts=start, ends=end, reason="weekly test")

    line = compute()
    assert line.state == "ok"
    assert [(item.who, item.why) for item in line.quiet] == [("alice", "pump overhaul"), ("", "weekly test")]
    assert "plant-b" in line.quiet[0].what and "plant-d" in line.quiet[1].what
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(OUTBOX).content.decode()
    assert 'id="outbox-status-quiet"' in content and "pump overhaul" in content and "plant-c" not in content


def test_the_status_line_is_on_the_dashboard_and_the_outbox_page(client, worker):
    open_channel()
    make_notification(type="webhook", status=Status.PENDING)
    make_notification(status=Status.DELIVERED)  # email flows: degraded, not down
    client.force_login(make_user("olivia", groups=["Operators"]))
    for url in (reverse("admin:index"), OUTBOX):
        content = client.get(url).content.decode()
        assert 'id="outbox-status-line"' in content and 'data-state="degraded"' in content, url


def test_the_channel_breakdown_counts_waiting_rows_by_site_and_list(client, worker):
    open_channel()
    for site, list_name in [("plant-a", "Line-3")] * 3 + [("plant-b", "Line-3"), ("plant-b", "Boilers")]:
        make_notification(type="webhook", status=Status.RETRYING, source_site_id=site, list_name=list_name)
    make_notification(type="webhook", status=Status.DELIVERED, source_site_id="plant-c")
    make_notification(type="email", status=Status.PENDING, source_site_id="plant-d")
    client.force_login(make_user("olivia", groups=["Operators"]))
    response = client.get(CHANNEL, {"channel": "webhook"})
    breakdown = response.context["breakdown"]
    assert breakdown.sites == [("plant-a", 3), ("plant-b", 2)]
    assert breakdown.lists == [("Line-3", 4), ("Boilers", 1)]
    assert client.get(CHANNEL, {"channel": "pigeon"}).status_code == 400


def test_rows_waiting_on_an_open_channel_say_so(client, worker):
    open_channel()
    make_notification(type="webhook", status=Status.RETRYING, last_error="old news")
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(OUTBOX).content.decode()
    assert "waiting for webhook (open since " in content and ", 1 waiting)" in content
    assert "old news" not in content


def test_the_error_column_shows_the_specific_part(client, worker):
    make_notification(
        status=Status.PARKED,
        last_error="Permanent failure (recipient_rejected): 550 5.1.1 <p.dubois@example.com>: user unknown",
    )
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(OUTBOX).content.decode()
    assert "recipient_rejected: 550 5.1.1 &lt;p.dubois@example.com&gt;" in content


def test_notes_on_an_open_channel_and_a_parked_group_are_kept_with_who_and_when(client, worker):
    open_channel()
    waiting = make_notification(type="webhook", status=Status.RETRYING, asks_ack=True)
    parked = make_notification(status=Status.PARKED, asks_ack=True)
    client.force_login(make_user("olivia", groups=["Operators"]))
    back = f"{CHANNEL}?channel=webhook"
    client.post(NOTES, {"subject": "channel:webhook", "text": "relay team called, ETA 04:00", "next": back})
    client.post(NOTES, {"subject": "channel:webhook", "text": "ETA moved to 05:00", "next": back})
    page = client.get(back).content.decode()
    assert "olivia, " in page and "relay team called, ETA 04:00" in page and "ETA moved to 05:00" in page
    from notifications.console import cause_key

    subject = f"parked:{cause_key(parked.last_error)}"
    response = client.post(NOTES, {"subject": subject, "text": "mailbox full, asked IT", "next": PARKED})
    assert response.status_code == 302
    assert "mailbox full, asked IT" in client.get(PARKED).content.decode()
    assert IncidentNote.objects.count() == 3
    # A note is not an acknowledgement.
    for row in (waiting, parked):
        row.refresh_from_db()
        assert row.acknowledged_at is None and row.acknowledged_by == ""
    bad = client.post(NOTES, {"subject": "anything goes", "text": "x", "next": PARKED})
    assert bad.status_code == 302 and IncidentNote.objects.count() == 3


def test_counts_beside_the_filters_follow_the_filters_and_the_search(client, worker):
    for site in ("plant-a", "plant-a", "plant-b"):
        make_notification(status=Status.PARKED, source_site_id=site, list_name="Line-3", subject="Pump tripped")
    make_notification(status=Status.DELIVERED, source_site_id="plant-c", list_name="Boilers", subject="Pump ok")
    client.force_login(make_user("olivia", groups=["Operators"]))
    matches = client.get(OUTBOX, {"status": "Parked"}).context["matches"]
    assert (matches.total, matches.sites, matches.lists) == (3, [("plant-a", 2), ("plant-b", 1)], [("Line-3", 3)])
    response = client.get(OUTBOX, {"q": "ok"})
    assert response.context["matches"].lists == [("Boilers", 1)]
    assert "Matches: 1</h2>" in response.content.decode()


def test_matches_are_capped_and_count_the_newest(db, monkeypatch):
    from notifications import console

    monkeypatch.setattr(console, "MATCHES_COUNT_MAX", 2)
    make_notification(source_site_id="plant-b", list_name="Boilers", age=timedelta(minutes=5))
    for _ in range(2):
        make_notification()
    matches = console.matches_by_site_and_list(Notification.objects.order_by("-created_at"))
    assert (matches.total, matches.capped, matches.sites, matches.lists) == (
        2,
        True,
        [("plant-a", 2)],
        [("Operators", 2)],
    )
    monkeypatch.setattr(console, "MATCHES_COUNT_MAX", 3)
    matches = console.matches_by_site_and_list(Notification.objects.order_by("-created_at"))
    assert (matches.total, matches.capped, matches.sites) == (3, False, [("plant-a", 2), ("plant-b", 1)])
    # A count the budget cancels falls back to the rows the page shows.
    monkeypatch.setattr(console.db, "run_within", lambda read, milliseconds: None)
    shown = list(Notification.objects.order_by("created_at")[:2])  # the plant-b row and one of plant-a
    matches = console.matches_by_site_and_list(Notification.objects.order_by("-created_at"), shown=shown)
    assert (matches.total, matches.page_only, matches.sites) == (2, True, [("plant-a", 1), ("plant-b", 1)])


def test_matches_too_slow_to_count_are_those_of_the_page(client, worker, monkeypatch):
    from notifications import console

    for _ in range(3):
        make_notification(status=Status.PARKED, source_site_id="plant-b")
    monkeypatch.setattr(console.db, "run_within", lambda read, milliseconds: None)
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(OUTBOX, {"status": "Parked"}).content.decode()
    assert "Matches on this page: 3</h2>" in content and "Counting all the matches would take too long" in content


def test_where_the_page_count_was_cut_at_its_budget_the_matches_are_those_of_the_page_at_once(
    client, worker, monkeypatch
):
    # A count cut by PostgreSQL at its budget needs a table of millions (bench/bench_console.py
    # has one): here the paginator's count is made to be cut (a mock). The matches then do not
    # spend their own budget reading the same costly matches again.
    from notifications import console
    from notifications.admin import outbox

    for _ in range(3):
        make_notification(status=Status.PARKED, source_site_id="plant-b")
    monkeypatch.setattr(outbox.db, "plan_reads_every_match", lambda rows: False)  # a small table's plan does
    monkeypatch.setattr(outbox.db, "count_within", lambda rows, milliseconds: None)
    grouped = []
    grouped_counts = console.db.grouped_counts

    def counting(rows, *, columns, **kwargs):
        grouped.append(columns)
        return grouped_counts(rows, columns=columns, **kwargs)

    monkeypatch.setattr(console.db, "grouped_counts", counting)
    client.force_login(make_user("olivia", groups=["Operators"]))
    response = client.get(OUTBOX, {"status": "Parked"})
    assert response.context["cl"].paginator.count_cut
    assert "Matches on this page: 3</h2>" in response.content.decode()
    assert ["source_site_id", "list_name"] not in grouped  # the tiles count by site; the matches did not run


def test_the_matches_count_within_what_the_tiles_left_of_the_page_budget(client, worker, monkeypatch):
    from notifications.admin import tiles as tile_figures

    for _ in range(3):
        make_notification(status=Status.PARKED, source_site_id="plant-b")
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert "Matches: 3</h2>" in client.get(OUTBOX, {"status": "Parked"}).content.decode()
    # The tiles' budget, which the matches share, is spent: the matches are the page's.
    monkeypatch.setattr(tile_figures, "FILTERED_BUDGET_MS", 0)
    assert "Matches on this page: 3</h2>" in client.get(OUTBOX, {"status": "Parked"}).content.decode()


def tiles(content: str) -> dict[str, tuple[str, str]]:
    """Each tile of the outbox page: ``{tile id: (link, value)}``."""
    found = re.findall(r'id="kpi-([a-z-]+)" href="([^"]*)"><span class="outbox-tile-value">([^<]*)</span>', content)
    return {name: (html.unescape(link), value) for name, link, value in found}


@pytest.fixture
def spread(worker):
    """Rows of two sites, three lists, two channels and every tile's kind."""
    make_notification(source_site_id="plant-a", list_name="Line-3")
    make_notification(source_site_id="plant-a", list_name="Line-3", age=timedelta(minutes=30))  # stuck
    make_notification(status=Status.PARKED, source_site_id="plant-a", list_name="Line-3")
    make_notification(status=Status.DELIVERED, source_site_id="plant-a", list_name="Line-3", targets_refused=1)
    make_notification(status=Status.DELIVERED, source_site_id="plant-a", list_name="Boilers", asks_ack=True)
    for _ in range(3):
        make_notification(source_site_id="plant-b", list_name="Boilers")
    make_notification(status=Status.PARKED, source_site_id="plant-b", list_name="Boilers", expired_at=timezone.now())
    make_notification(source_site_id="plant-b", list_name="Pumps", type="webhook", priority=Notification.Priority.HIGH)
    make_notification(source_site_id="plant-b", list_name="Pumps", age=timedelta(days=3))
    make_notification(status=Status.SUPPRESSED, source_site_id="plant-a", list_name="Line-3", suppressed_by="silence:1")
    # Suppressed before the KPI interval: not in its tile.
    make_notification(status=Status.SUPPRESSED, source_site_id="plant-b", list_name="Boilers", age=timedelta(days=2))


@pytest.mark.parametrize(
    "query, expected",
    [
        # (filters, {tile: value}) — every other tile of the nine is checked too, via the kpis.
        (
            {"site": "plant-a"},
            {"queue-depth": "2", "stuck": "1", "parked": "1", "delivered": "2", "partial": "1", "suppressed": "1"},
        ),
        (
            {"list": "Boilers"},
            {"queue-depth": "3", "parked": "1", "expired": "1", "delivered": "1", "stuck": "0", "suppressed": "0"},
        ),
        ({"type": "webhook"}, {"queue-depth": "1", "parked": "0", "delivered": "0"}),
        ({"status": "Parked"}, {"queue-depth": "0", "parked": "2", "expired": "1"}),
        ({"priority": "high"}, {"queue-depth": "1", "stuck": "0", "parked": "0"}),
        ({"created_within": "1h"}, {"queue-depth": "6", "stuck": "1", "parked": "2"}),
        ({"site": "plant-b", "q": "Pump"}, {"queue-depth": "5", "expired": "1", "unacknowledged": "0"}),
    ],
)
def test_the_tiles_follow_the_filters(client, spread, query, expected):
    client.force_login(make_user("olivia", groups=["Operators"]))
    everything = tiles(client.get(OUTBOX).content.decode())
    assert everything["queue-depth"][1] == "7" and everything["queue-depth"][0].endswith("?status=queued")
    assert 'id="kpi-by-priority"' in client.get(OUTBOX).content.decode()
    content = client.get(OUTBOX, query).content.decode()
    shown = tiles(content)
    assert {name: shown[name][1] for name in expected} == expected
    # Each tile's link keeps the filters and adds its own.
    for name, value in query.items():
        if name != "status":
            assert f"{name}={value}" in shown["queue-depth"][0]
    assert "status=queued" in shown["queue-depth"][0] and "status=Parked" in shown["parked"][0]
    assert "status=Suppressed" in shown["suppressed"][0]
    assert 'id="kpi-filtered-note"' in content and 'id="kpi-per-site-filtered"' in content
    # The queue by priority counts every notification: not beside tiles that count the matches.
    assert 'id="kpi-by-priority"' not in content


def test_the_per_site_table_follows_the_filters(client, spread):
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(OUTBOX, {"list": "Line-3"}).content.decode()
    table = re.search(r'id="kpi-per-site-filtered">.*?<tbody>(.*?)</tbody>', content, re.S)
    assert table
    rows = re.findall(r"<tr>\s*<th>([^<]+)</th>(.*?)</tr>", table[1], re.S)
    assert [site for site, _ in rows] == ["plant-a"]  # plant-b has no row on Line-3
    cells = re.findall(r"<td>([^<]*)</td>", rows[0][1])
    # queue depth, stuck, parked, expired, delivered, of which partially, oldest pending, unacknowledged
    assert cells[:6] == ["2", "1", "1", "0", "1", "1"] and cells[6].startswith("30 min") and cells[7] == "0"
    unfiltered = client.get(OUTBOX).content.decode()
    assert 'id="kpi-per-site-filtered"' not in unfiltered and 'id="kpi-filtered-note"' not in unfiltered


def test_a_tile_over_the_cap_says_so_and_one_not_counted_in_time_says_that(client, spread, monkeypatch):
    from notifications.admin import tiles as tile_figures

    client.force_login(make_user("olivia", groups=["Operators"]))
    monkeypatch.setattr(tile_figures, "FILTERED_COUNT_MAX", 2)
    content = client.get(OUTBOX, {"site": "plant-b"}).content.decode()
    assert tiles(content)["queue-depth"][1] == "2+" and tiles(content)["parked"][1] == "1"
    assert "(“10,000+”: more than that)" in content
    monkeypatch.setattr(tile_figures.db, "run_within", lambda read, milliseconds: None)
    content = client.get(OUTBOX, {"site": "plant-b"}).content.decode()
    assert tiles(content)["queue-depth"][1] == "—" and tiles(content)["oldest"][1] == "—"
    assert "not counted within the page's time budget" in content


def test_the_trends_follow_the_chosen_time_zone(client, worker):
    make_notification(status=Status.DELIVERED)
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert "(per hour, UTC)" in client.get(reverse("admin:index")).content.decode()
    client.cookies["outbox_tz"] = "Asia/Tokyo"
    page = client.get(reverse("admin:index")).content.decode()
    assert "(per hour, Asia/Tokyo)" in page and " JST: " in page


def test_parked_groups_tell_partial_deliveries_apart_from_outages(client, worker):
    cause = "Retries exhausted (5 failed attempts): 452 4.2.2 mailbox full"
    partial_targets = [
        {"target": "a@example.com", "outcome": "delivered"},
        {"target": "b@example.com", "outcome": "deferred", "smtp_code": 452},
    ]
    make_notification(status=Status.PARKED, last_error=cause, resolved_targets=partial_targets)
    make_notification(status=Status.PARKED, last_error=cause, resolved_targets=partial_targets)
    make_notification(status=Status.PARKED, last_error=cause)
    client.force_login(make_user("olivia", groups=["Operators"]))
    response = client.get(PARKED)
    group = next(row["group"] for row in response.context["rows"] if row["group"].cause == cause)
    assert (group.count, group.partially_delivered) == (3, 2)
    assert "2 of these reached some of their recipients already" in response.content.decode()


def test_search_by_recipient_finds_everything_sent_to_an_address(client, worker):
    to_pierre = make_notification(
        status=Status.DELIVERED,
        resolved_targets=[{"target": "p.dubois@example.com", "outcome": "delivered"}],
    )
    make_notification(
        status=Status.DELIVERED, resolved_targets=[{"target": "a.ito@example.com", "outcome": "delivered"}]
    )
    client.force_login(make_user("olivia", groups=["Operators"]))
    shown = {row.pk for row in client.get(OUTBOX, {"q": "to:P.Dubois@example.com"}).context["cl"].result_list}
    assert shown == {to_pierre.pk}


@pytest.mark.django_db
def test_search_by_recipient_uses_the_targets_index(postgres_only):
    from django.db import connection

    from notifications.admin.filters import recipient_q

    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        query = Notification.objects.filter(recipient_q("p.dubois@example.com")).order_by()
        sql, params = query.query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert "notif_targets_gin_idx" in plan, plan
