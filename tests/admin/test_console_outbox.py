"""The outbox page's second version: timestamps with seconds and zone (and the zone toggle),
stuck age from the last retry, Parked rows grouped by cause with their bulk actions, the
redrive progress of a Retry, the time presets, the wider search, the list filter's unknown
names and the CSV export."""

import csv
import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from notifications import console
from notifications.admin import outbox_views
from notifications.admin.outbox_views import EXPORT_COLUMNS
from notifications.kpis import kpis_compute
from notifications.models import Notification, NotificationList
from tests.admin.conftest import make_notification, make_user

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")
PARKED = reverse("admin:notifications_notification_parked")
PARKED_RETRY = reverse("admin:notifications_notification_parked_retry")
PARKED_DISCARD = reverse("admin:notifications_notification_parked_discard")
REDRIVE = reverse("admin:notifications_notification_redrive")
EXPORT = reverse("admin:notifications_notification_export")
TIMEZONE = reverse("admin:notifications_notification_timezone")
UNKNOWN = "Permanent failure (configuration): Unknown notification list 'Night-Shift'."


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def shown(client, **params):
    return {row.pk for row in client.get(OUTBOX, params).context["cl"].result_list}


# --- timestamps and the zone -------------------------------------------------------------------


def test_times_show_seconds_and_zone_and_follow_the_chosen_zone(operator_client):
    row = make_notification(status=Status.PARKED, created_at=datetime(2026, 1, 15, 9, 30, 5, tzinfo=UTC))
    detail = reverse("admin:notifications_notification_change", args=[row.pk])
    assert "2026-01-15 09:30:05 UTC" in operator_client.get(OUTBOX).content.decode()
    assert "2026-01-15 09:30:05 UTC" in operator_client.get(detail).content.decode()

    response = operator_client.post(TIMEZONE, {"zone": "Europe/Zurich", "next": OUTBOX})
    assert response.status_code == 302 and response["Location"] == OUTBOX
    assert response.cookies["outbox_tz"].value == "Europe/Zurich"
    assert "2026-01-15 10:30:05 CET" in operator_client.get(OUTBOX).content.decode()
    assert "2026-01-15 10:30:05 CET" in operator_client.get(detail).content.decode()
    # The API keeps speaking UTC whatever the console cookie says.
    assert kpis_compute()["computed_at"].endswith("Z")


def test_an_unknown_zone_is_refused_in_words_and_an_outside_next_is_not_followed(operator_client):
    response = operator_client.post(TIMEZONE, {"zone": "Mars/Olympus", "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == OUTBOX
    assert "outbox_tz" not in response.cookies
    assert any("Unknown time zone 'Mars/Olympus'" in text for text in texts(response))
    assert operator_client.get(TIMEZONE).status_code == 405


def test_a_forged_zone_cookie_is_ignored(operator_client):
    make_notification()
    operator_client.cookies["outbox_tz"] = "../../etc/passwd"
    response = operator_client.get(OUTBOX)
    assert response.status_code == 200 and " UTC</time>" in response.content.decode()


# --- stuck age ------------------------------------------------------------------------------------


def test_stuck_counts_from_the_last_retry_not_from_creation(operator_client):
    old = timedelta(hours=2)
    retried = make_notification(age=old, requeued_at=timezone.now() - timedelta(seconds=5))
    waiting = make_notification(age=old)
    assert shown(operator_client, stuck="1") == {waiting.pk}
    assert kpis_compute()["global"]["stuck"] == 1
    content = operator_client.get(OUTBOX).content.decode()
    assert content.count('class="outbox-badge outbox-stuck"') == 1
    assert retried.pk in shown(operator_client)


# --- parked by cause --------------------------------------------------------------------------------


@pytest.fixture
def night_shift(db):
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
    other = make_notification(status=Status.PARKED)  # "Retries exhausted (10): 451 try again later"
    return rows, other


def test_parked_rows_are_grouped_by_cause_with_sites_lists_and_a_create_list_link(client, night_shift):
    assert len(night_shift[0]) == 3
    administrator = make_user("adam", groups=["Administrators"])
    client.force_login(administrator)
    content = client.get(PARKED).content.decode()
    assert "4 parked notifications in 2 groups" in content
    assert re.search(
        r"3 parked</span> — Permanent failure \(configuration\): Unknown notification list &#x27;Night-Shift&#x27;\.",
        content,
    )
    assert "plant-a (2)" in content and "plant-b (1)" in content and "Night-Shift (3)" in content
    add_list = reverse("admin:notifications_notificationlist_add") + "?name=Night-Shift"
    assert add_list in content
    assert "Retry all 3" in content and "Discard all" in content
    # The add form takes the name from the link.
    assert 'value="Night-Shift"' in client.get(add_list).content.decode()


def test_operators_see_groups_without_create_list_links_and_viewers_without_actions(client, night_shift):
    client.force_login(make_user("olivia", groups=["Operators"]))
    content = client.get(PARKED).content.decode()
    assert "Retry all 3" in content and "Create the list" not in content
    assert "an administrator can create it" in content
    client.force_login(make_user("victor", permissions=["view_notification"]))
    content = client.get(PARKED).content.decode()
    assert "Retry all" not in content and "Discard all" not in content
    assert client.post(PARKED_RETRY, {"cause": UNKNOWN}).status_code == 403
    assert client.post(PARKED_DISCARD, {"cause": UNKNOWN, "post": "yes", "reason": "x"}).status_code == 403


def test_a_group_offers_retry_once_its_list_exists_and_retry_all_leads_to_the_redrive_view(
    operator_client, night_shift
):
    rows, other = night_shift
    assert "exists now" not in operator_client.get(PARKED).content.decode()
    NotificationList.objects.create(name="night-shift")  # names match ignoring case
    content = operator_client.get(PARKED).content.decode()
    assert "The list “Night-Shift” exists now" in content

    response = operator_client.post(PARKED_RETRY, {"cause": UNKNOWN})
    assert response.status_code == 302 and response["Location"].startswith(REDRIVE + "?at=")
    assert "Retried 3 notifications." in texts(response)
    statuses = {row.status for row in Notification.objects.filter(pk__in=[r.pk for r in rows])}
    assert statuses == {Status.PENDING}
    other.refresh_from_db()
    assert other.status == Status.PARKED
    at = Notification.objects.get(pk=rows[0].pk).requeued_at
    assert Notification.objects.filter(requeued_at=at).count() == 3

    page = operator_client.get(response["Location"]).content.decode()
    assert re.search(r'id="redrive-waiting"><span class="outbox-tile-value">3<', page)
    assert "3 of 3 still waiting" in page and 'data-done="0"' in page
    Notification.objects.filter(pk__in=[rows[0].pk, rows[1].pk]).update(status=Status.DELIVERED)
    Notification.objects.filter(pk=rows[2].pk).update(status=Status.PARKED)
    fragment = operator_client.get(response["Location"] + "&fragment=1").content.decode()
    assert fragment.lstrip().startswith('<div id="outbox-redrive-counts" data-done="1"')
    assert "Done: 2 of 3 delivered, 1 parked again." in fragment
    # "Show these rows" lists exactly the retried rows.
    found = re.search(r'href="([^"]+)" id="redrive-rows-link"', page)
    assert found is not None
    rows_link = found[1].replace("&amp;", "&")
    assert {row.pk for row in operator_client.get(rows_link).context["cl"].result_list} == {r.pk for r in rows}


def test_long_errors_group_by_their_first_200_characters_and_retry_together(operator_client, night_shift):
    # Longer than the cause (200 characters), and than what the cause index holds (2,000 bytes).
    common = "550 5.7.1 " + "é" * 300
    long_rows = [make_notification(status=Status.PARKED, last_error=common + tail) for tail in ("x" * 1500, "y" * 10)]
    groups, partial = console.parked_groups()
    assert not partial
    assert [(group.count, group.cause[:10]) for group in groups] == [
        (3, "Permanent "),
        (2, "550 5.7.1 "),
        (1, "Retries ex"),
    ]
    assert len(groups[1].cause) == 200
    response = operator_client.post(PARKED_RETRY, {"cause": groups[1].cause})
    assert "Retried 2 notifications." in texts(response)
    assert {row.status for row in Notification.objects.filter(pk__in=[r.pk for r in long_rows])} == {Status.PENDING}


def test_the_group_link_lists_exactly_that_causes_rows(operator_client, night_shift):
    rows, _ = night_shift
    assert shown(operator_client, cause=UNKNOWN) == {row.pk for row in rows}


def test_discard_all_of_a_group_needs_a_reason_and_records_it(operator_client, night_shift):
    rows, other = night_shift
    confirm = operator_client.post(PARKED_DISCARD, {"cause": UNKNOWN})
    assert confirm.status_code == 200 and "Discard 3 parked notifications" in confirm.content.decode()
    blank = operator_client.post(PARKED_DISCARD, {"cause": UNKNOWN, "post": "yes", "reason": "  "})
    assert "This field is required." in blank.content.decode()
    assert Notification.objects.filter(status=Status.DISCARDED).count() == 0
    done = operator_client.post(PARKED_DISCARD, {"cause": UNKNOWN, "post": "yes", "reason": "Night shift list retired"})
    assert done.status_code == 302 and "Discarded 3 notifications." in texts(done)
    discarded = Notification.objects.filter(status=Status.DISCARDED)
    assert {row.pk for row in discarded} == {row.pk for row in rows}
    assert {row.discard_reason for row in discarded} == {"Night shift list retired"}
    other.refresh_from_db()
    assert other.status == Status.PARKED


def test_retrying_a_cause_nobody_has_any_more_says_so(operator_client, db):
    response = operator_client.post(PARKED_RETRY, {"cause": "no such cause"})
    assert response.status_code == 302 and response["Location"] == PARKED
    assert "No Parked notification has that cause any more." in texts(response)
    assert operator_client.post(PARKED_RETRY, {}).status_code == 400
    assert operator_client.get(PARKED_RETRY).status_code == 405


def test_retry_selected_links_to_its_redrive_view(operator_client):
    row = make_notification(status=Status.PARKED)
    response = operator_client.post(
        OUTBOX, {"action": "retry_selected", "_selected_action": [str(row.pk)], "index": "0"}, follow=True
    )
    content = response.content.decode()
    assert "Retried 1 notification." in content
    found = re.search(r'<a href="([^"]+)" class="outbox-redrive-link">Follow their progress</a>', content)
    assert found is not None
    page = operator_client.get(found[1].replace("&amp;", "&")).content.decode()
    assert re.search(r'id="redrive-waiting"><span class="outbox-tile-value">1<', page)


@pytest.mark.parametrize("at", ["", "yesterday", "2026-11-23T10:00:00"])
def test_the_redrive_view_refuses_an_unreadable_instant(operator_client, at):
    response = operator_client.get(REDRIVE, {"at": at})
    assert response.status_code == 400 and b"ISO 8601" in response.content


# --- find -----------------------------------------------------------------------------------------


def test_time_presets_filter_relative_to_now_and_an_unknown_preset_is_named(operator_client):
    recent = make_notification(age=timedelta(minutes=5))
    hour = make_notification(age=timedelta(minutes=50))
    day = make_notification(age=timedelta(hours=20))
    week = make_notification(age=timedelta(days=6))
    make_notification(age=timedelta(days=30))
    assert shown(operator_client, created_within="15m") == {recent.pk}
    assert shown(operator_client, created_within="1h") == {recent.pk, hour.pk}
    assert shown(operator_client, created_within="24h") == {recent.pk, hour.pk, day.pk}
    assert shown(operator_client, created_within="7d") == {recent.pk, hour.pk, day.pk, week.pk}
    response = operator_client.get(OUTBOX, {"created_within": "2w"})
    assert response.status_code == 200 and any("created-within preset '2w'" in t for t in texts(response))
    content = operator_client.get(OUTBOX, {"created_within": "1h"}).content.decode()
    assert 'aria-current="true">1 h</a>' in content and 'type="datetime-local"' in content


def test_a_datetime_local_bound_is_read_in_the_consoles_zone(operator_client):
    at = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    before = make_notification(created_at=at - timedelta(minutes=1))
    after = make_notification(created_at=at + timedelta(minutes=1))
    assert shown(operator_client, created_from="2026-01-15T09:30") == {after.pk}
    operator_client.cookies["outbox_tz"] = "Europe/Zurich"  # 09:30 UTC is 10:30 there
    assert shown(operator_client, created_from="2026-01-15T10:30") == {after.pk}
    assert shown(operator_client, created_to="2026-01-15T10:30") == {before.pk}


def test_search_finds_by_id_prefix_list_error_instance_and_script(operator_client):
    target = make_notification(
        list_name="Night-Shift",
        last_error="550 5.1.1 mailbox unavailable",
        source_instance_id="Boiler7",
        source_script="OnTrip",
        subject="Pressure high",
    )
    other = make_notification(subject="Valve stuck", source_script="OnAlarm")
    assert shown(operator_client, q=str(target.pk)[:8]) == {target.pk}
    assert shown(operator_client, q=str(target.pk)[:13]) == {target.pk}
    assert shown(operator_client, q="night-shift") == {target.pk}
    assert shown(operator_client, q="MAILBOX unavailable") == {target.pk}
    assert shown(operator_client, q="boiler7") == {target.pk}
    assert shown(operator_client, q="ontrip") == {target.pk}
    assert shown(operator_client, q="onalarm") == {other.pk}
    assert shown(operator_client, q="pressure onalarm") == set()  # every word must match
    assert shown(operator_client, q='"100%_"') == set()  # LIKE wildcards are literal


def test_the_list_filter_offers_names_parked_rows_use_that_no_list_has(operator_client, operators_list):
    make_notification(status=Status.PARKED, list_name="Night-Shift", last_error=UNKNOWN)
    make_notification(status=Status.PARKED, list_name="OPERATORS")  # a configured list, other case
    content = operator_client.get(OUTBOX).content.decode()
    assert "Night-Shift (no such list)" in content
    assert "OPERATORS (no such list)" not in content
    assert len(shown(operator_client, list="Night-Shift")) == 1


# --- CSV export -----------------------------------------------------------------------------------


def _csv(response):
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))


def test_export_streams_the_filtered_rows_as_csv_with_formula_cells_defused(operator_client):
    parked = make_notification(status=Status.PARKED, subject='=HYPERLINK("http://x")')
    make_notification(status=Status.DELIVERED)
    rows = _csv(operator_client.get(EXPORT, {"status": "Parked"}))
    assert rows[0][:3] == ["notification_id", "status", "type"]
    assert len(rows) == 2 and rows[1][0] == str(parked.pk) and rows[1][1] == "Parked"
    assert rows[1][4] == '\'=HYPERLINK("http://x")'
    assert rows[1][8].endswith("Z")
    page = operator_client.get(OUTBOX, {"status": "Parked"}).content.decode()
    assert f'href="{EXPORT}?status=Parked" id="export-csv-link"' in page


FORMULA_SUBJECTS = ["=1+1", "+1+1", "-1+1", "@SUM(A1)", "\t=1+1", "\r=1+1", " =1+1", "  @SUM(A1)", " \t-1"]
FULL_WIDTH_SUBJECTS = ["\uff1d1+1", "\uff0b1+1", "\uff0d1+1", "\uff20SUM(A1)", " \uff1d1+1"]


@pytest.mark.parametrize("subject", FORMULA_SUBJECTS + FULL_WIDTH_SUBJECTS, ids=ascii)
def test_export_quotes_every_cell_a_spreadsheet_would_read_as_a_formula(operator_client, subject):
    make_notification(subject=subject, last_error=subject)
    (_, row) = _csv(operator_client.get(EXPORT))
    assert row[4] == "'" + subject
    assert row[EXPORT_COLUMNS.index("last_error")] == "'" + subject


@pytest.mark.parametrize("subject", ["Pump 3 tripped", " Pump 3", "3-phase fault", "a=b", "", "\uff21 full-width A"])
def test_export_leaves_other_cells_as_they_are(operator_client, subject):
    make_notification(subject=subject)
    (_, row) = _csv(operator_client.get(EXPORT))
    assert row[4] == subject


def test_export_is_bounded_and_says_where_it_stopped(operator_client, monkeypatch):
    monkeypatch.setattr(outbox_views, "EXPORT_MAX_ROWS", 3)
    for _ in range(5):
        make_notification()
    rows = _csv(operator_client.get(EXPORT))
    assert len(rows) == 1 + 3 + 1 and rows[-1][0].startswith("# stopped at 3 rows")


def test_export_needs_the_view_permission(client, db):
    client.force_login(make_user("nobody"))
    assert client.get(EXPORT).status_code == 403


# --- PostgreSQL plans ----------------------------------------------------------------------------


def _plan(queryset):
    """The plan with sequential scans discouraged: on a tiny test table the planner would
    otherwise read the table; this shows the index is usable for the query as written."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL indexes")
def test_grouping_and_search_are_answered_from_their_indexes(db):
    from django.db import transaction

    from notifications.admin.filters import outbox_search

    make_notification(status=Status.PARKED, list_name="Night-Shift", last_error=UNKNOWN)
    with transaction.atomic():
        grouped = (
            Notification.objects.filter(status=Status.PARKED)
            .filter(console._indexed(short=True))
            .annotate(cause=console.db.ParkedCause())
            .values("cause", "list_name", "source_site_id")
            .order_by()
        )
        assert "Index Only Scan using notif_parked_cause_idx" in _plan(grouped)
        assert "notif_parked_cause_idx" in _plan(console.parked_cause_rows(UNKNOWN).order_by())
        assert "notif_search_day_trgm_idx" in _plan(outbox_search(Notification.objects.order_by(), "night"))
        # The days since a date are a condition of the same index scan: only their matches are read.
        recent = outbox_search(Notification.objects.order_by(), "night").alias(created_day=console.db.CreatedDay())
        plan = _plan(recent.filter(created_day__gte=timezone.now().date()))
        index_condition = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "notif_search_day_trgm_idx" in plan and "AT TIME ZONE 'UTC'" in index_condition
        assert "notif_requeued_idx" in _plan(Notification.objects.filter(requeued_at=timezone.now()).order_by())


def test_the_outbox_page_offers_to_retry_rows_whose_list_exists_now(client, night_shift):
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert 'id="outbox-lists-ready"' not in client.get(OUTBOX).content.decode()
    NotificationList.objects.create(name="Night-Shift")
    content = client.get(OUTBOX).content.decode()
    assert "3 parked notifications failed because the list “Night-Shift” did not exist; it exists now." in content
    assert "Retry 3</button>" in content
    response = client.post(PARKED_RETRY, {"cause": UNKNOWN})
    assert "Retried 3 notifications." in texts(response)
    assert 'id="outbox-lists-ready"' not in client.get(OUTBOX).content.decode()
    client.force_login(make_user("victor", permissions=["view_notification"]))
    NotificationList.objects.create(name="Day-Shift")
    make_notification(
        status=Status.PARKED,
        list_name="Day-Shift",
        last_error="Permanent failure (configuration): Unknown notification list 'Day-Shift'.",
        failure_code="unknown_list",
    )
    content = client.get(OUTBOX).content.decode()
    assert "the list “Day-Shift” did not exist" in content and "Retry 1</button>" not in content
