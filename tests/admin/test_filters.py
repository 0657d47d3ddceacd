"""Every outbox filter and the subject search select exactly the rows an operator expects."""

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from notifications.models import Notification, NotificationList
from sites.models import Site
from tests.admin.conftest import make_notification

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


def shown(client, **params):
    response = client.get(OUTBOX, params)
    assert response.status_code == 200
    return {n.pk for n in response.context["cl"].result_list}


@pytest.fixture
def rows(db):
    Site.objects.create(site_id="plant-a", name="Plant A")
    Site.objects.create(site_id="plant-b", name="Plant B")
    NotificationList.objects.create(name="Operators")
    NotificationList.objects.create(name="Maintenance")
    return {
        "pending": make_notification(status=Status.PENDING, subject="Pump 3 tripped"),
        "retrying": make_notification(status=Status.RETRYING, subject="Valve 7 stuck open"),
        "stuck": make_notification(status=Status.PENDING, subject="Old pending", age=timedelta(hours=2)),
        "old_delivered": make_notification(status=Status.DELIVERED, subject="Old delivered", age=timedelta(hours=2)),
        "parked": make_notification(status=Status.PARKED, subject="100% tank level", source_site_id="plant-b"),
        "discarded": make_notification(status=Status.DISCARDED, subject="Pump_1 restart", list_name="Maintenance"),
        "gone_site": make_notification(
            status=Status.DELIVERED, subject="From a removed site", source_site_id="plant-z"
        ),
    }


def pks(rows, *names):
    return {rows[name].pk for name in names}


def test_without_filters_every_row_is_listed(operator_client, rows):
    assert shown(operator_client) == pks(rows, *rows)


@pytest.mark.parametrize("status", ["Pending", "Retrying", "Delivered", "Parked", "Discarded"])
def test_status_filter_shows_only_that_status(operator_client, rows, status):
    assert shown(operator_client, status=status) == {n.pk for n in rows.values() if n.status == status}


def test_queued_status_filter_shows_pending_and_retrying(operator_client, rows):
    assert shown(operator_client, status="queued") == pks(rows, "pending", "retrying", "stuck")


def test_stuck_only_toggle_shows_queued_rows_older_than_the_threshold(operator_client, rows):
    assert shown(operator_client, stuck="1") == pks(rows, "stuck")


def test_type_filter(operator_client, rows):
    assert shown(operator_client, type="email") == pks(rows, *rows)


def test_source_site_filter(operator_client, rows):
    assert shown(operator_client, site="plant-b") == pks(rows, "parked")


def test_source_site_filter_still_works_for_a_site_no_longer_registered(operator_client, rows):
    response = operator_client.get(OUTBOX, {"site": "plant-z"})
    assert {n.pk for n in response.context["cl"].result_list} == pks(rows, "gone_site")
    assert b"plant-z" in response.content


def test_list_filter(operator_client, rows):
    assert shown(operator_client, list="Maintenance") == pks(rows, "discarded")


def test_created_range_filter_from_and_to(operator_client, rows):
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    recent = {name for name in rows if name not in ("stuck", "old_delivered")}
    assert shown(operator_client, created_from=an_hour_ago) == pks(rows, *recent)
    assert shown(operator_client, created_to=an_hour_ago) == pks(rows, "stuck", "old_delivered")


def test_created_range_filter_with_dates_includes_the_whole_to_day(operator_client, rows):
    today = datetime.now(UTC).date()
    assert shown(operator_client, created_from=today.isoformat(), created_to=today.isoformat()) == {
        n.pk for n in rows.values() if n.created_at.date() == today
    }
    assert shown(operator_client, created_to=(today - timedelta(days=1)).isoformat()) == {
        n.pk for n in rows.values() if n.created_at.date() < today
    }


def test_a_created_bound_with_a_far_utc_offset_is_taken_as_its_utc_instant(operator_client, rows):
    # ±23:59 is valid ISO-8601, beyond what PostgreSQL accepts as an offset.
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).astimezone(timezone(timedelta(hours=23, minutes=17)))
    recent = {name for name in rows if name not in ("stuck", "old_delivered")}
    assert shown(operator_client, created_from=an_hour_ago.strftime("%Y-%m-%dT%H:%M:%S%z")) == pks(rows, *recent)


def test_an_unreadable_created_bound_is_ignored_with_a_warning(operator_client, rows):
    response = operator_client.get(OUTBOX, {"created_from": "yesterday"})
    assert {n.pk for n in response.context["cl"].result_list} == pks(rows, *rows)
    assert any("yesterday" in str(m) for m in get_messages(response.wsgi_request))


def test_filters_combine(operator_client, rows):
    assert shown(operator_client, status="Pending", stuck="1", site="plant-a") == pks(rows, "stuck")
    assert shown(operator_client, status="Parked", site="plant-a") == set()


def test_range_filter_form_keeps_the_other_filters(operator_client, rows):
    content = operator_client.get(OUTBOX, {"status": "Parked"}).content.decode()
    assert '<input type="hidden" name="status" value="Parked">' in content


def test_search_matches_words_in_the_subject_case_insensitively(operator_client, rows):
    assert shown(operator_client, q="pump") == pks(rows, "pending", "discarded")
    assert shown(operator_client, q="PUMP tripped") == pks(rows, "pending")


def test_search_treats_like_wildcards_literally(operator_client, rows):
    assert shown(operator_client, q="100%") == pks(rows, "parked")
    assert shown(operator_client, q="pump_") == pks(rows, "discarded")
    assert shown(operator_client, q="%") == pks(rows, "parked")


def test_search_with_a_quoted_phrase(operator_client, rows):
    assert shown(operator_client, q='"stuck open"') == pks(rows, "retrying")


def test_search_for_a_notification_id_finds_that_notification(operator_client, rows):
    assert shown(operator_client, q=str(rows["parked"].pk)) == pks(rows, "parked")
    assert shown(operator_client, q=str(uuid.uuid4())) == set()


def test_search_combines_with_filters(operator_client, rows):
    assert shown(operator_client, q="pump", status="Discarded") == pks(rows, "discarded")


@pytest.mark.parametrize("parameter", ["site", "list", "type", "q", "status", "created_from", "o"])
def test_a_nul_in_any_filter_or_the_search_is_a_plain_400_not_a_500(operator_client, rows, parameter):
    response = operator_client.get(f"{OUTBOX}?{parameter}=a%00b")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert "NUL" in response.content.decode()
