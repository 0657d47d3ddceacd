"""The staff API of silences and the console's silence presets."""

import json
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.admin.silences import preset_end
from notifications.models import Notification, Silence
from notifications.suppression import suppression_rules_forget
from tests.admin.conftest import make_notification, make_user
from tests.support.payloads import make_payload
from tests.support.staff import staff_key_header

URL = "/api/v1/silences/"


@pytest.fixture(autouse=True)
def _rules_read_afresh():
    suppression_rules_forget()


@pytest.fixture
def operator_api(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("olivia", groups=["Operators"])))
    return client


def post(client, data):
    return client.post(URL, json.dumps(data), content_type="application/json")


def in_hours(hours):
    return (timezone.now() + timedelta(hours=hours)).isoformat()


def test_an_operator_sets_a_silence_that_suppresses_at_ingest_and_lists_it(operator_api, api, operators_list):
    response = post(operator_api, {"site": "plant-a", "ends_at": in_hours(2), "reason": "Plant A maintenance"})
    assert response.status_code == 201, response.content
    silence = response.json()
    assert silence["created_by"] == "olivia"
    assert silence["active"] is True
    assert silence["include_high"] is False and silence["include_critical"] is False

    ingested = api.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    assert ingested.json()["suppressed_by"] == f"silence:{silence['id']}"

    listed = operator_api.get(URL).json()
    assert [(item["id"], item["suppressed"]) for item in listed] == [(silence["id"], 1)]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"ends_at": "2099-01-01T00:00:00Z", "reason": "r"}, "non_field_errors"),  # silences nothing in particular
        ({"site": "plant-a", "ends_at": "2099-01-01T00:00:00Z", "reason": " "}, "reason"),
        ({"site": "plant-a", "reason": "r"}, "ends_at"),
        ({"site": "plant-a", "ends_at": "2020-01-01T00:00:00Z", "reason": "r"}, "ends_at"),
        ({"site": "plant-a", "ends_at": "not a time", "reason": "r"}, "ends_at"),
        ({"site": "plant-a", "ends_at": "2099-01-01T00:00:00Z", "reason": "r", "colour": "red"}, "colour"),
    ],
)
def test_a_bad_silence_is_refused_with_its_field(operator_api, body, field):
    response = post(operator_api, body)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert not Silence.objects.exists()


def test_a_silence_lasts_at_most_the_configured_days(operator_api, settings):
    settings.OUTBOX_SILENCE_MAX_DAYS = 7
    too_long = post(operator_api, {"site": "plant-a", "ends_at": in_hours(7 * 24 + 1), "reason": "r"})
    assert too_long.status_code == 400
    assert "at most 7 days" in too_long.json()["errors"]["ends_at"][0]
    assert post(operator_api, {"site": "plant-a", "ends_at": in_hours(7 * 24 - 1), "reason": "r"}).status_code == 201


def test_delete_ends_a_silence_and_keeps_its_record(operator_api):
    silence = post(operator_api, {"site": "plant-a", "ends_at": in_hours(2), "reason": "r"}).json()
    assert operator_api.delete(f"{URL}{silence['id']}/").status_code == 204
    ended = Silence.objects.get(pk=silence["id"])
    assert ended.ends_at <= timezone.now()
    assert operator_api.get(URL).json() == []
    assert [item["id"] for item in operator_api.get(f"{URL}?all=true").json()] == [silence["id"]]
    assert operator_api.delete(f"{URL}{silence['id']}/").status_code == 409
    assert operator_api.delete(f"{URL}999999/").status_code == 404


def test_silences_need_staff_and_the_permission(db, api):
    assert APIClient().get(URL).status_code == 401
    assert api.get(URL).status_code == 401  # a site key is not staff
    no_permission = APIClient()
    no_permission.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("vera")))
    assert no_permission.get(URL).status_code == 403
    assert post(no_permission, {"site": "x", "ends_at": in_hours(1), "reason": "r"}).status_code == 403


def test_the_presets_end_in_30_minutes_2_hours_or_at_6_tomorrow_in_the_consoles_zone(settings):
    now = datetime(2026, 11, 27, 22, 30, tzinfo=ZoneInfo("UTC"))
    assert preset_end("30m", now=now) == now + timedelta(minutes=30)
    assert preset_end("2h", now=now) == now + timedelta(hours=2)
    with timezone.override(ZoneInfo("Europe/Berlin")):
        morning = preset_end("morning", now=now)  # 23:30 in Berlin: 06:00 the next day there
    assert morning == datetime(2026, 11, 28, 6, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert preset_end("forever", now=now) is None


def test_a_notifications_page_offers_to_silence_its_source_site_and_list(db):
    client = Client()
    client.force_login(make_user("olivia", groups=["Operators"]))
    notification = make_notification()
    page = client.get(f"/admin/notifications/notification/{notification.pk}/change/").content.decode()
    assert "Silence this site for 2 h" in page
    assert "Silence this list until 06:00" in page
    form = client.get("/admin/notifications/silence/add/?site=plant-a&preset=2h&reason=x")
    assert form.status_code == 200
    assert 'value="plant-a"' in form.content.decode()


def test_an_ended_silence_offers_to_deliver_what_it_suppressed(db, api, operators_list):
    client = Client()
    client.force_login(make_user("olivia", groups=["Operators"]))
    silence = Silence.objects.create(site="plant-a", ends_at=timezone.now() + timedelta(hours=1), reason="r")
    api.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    Silence.objects.filter(pk=silence.pk).update(ends_at=timezone.now())
    page = client.get("/admin/notifications/silence/").content.decode()
    assert "deliver anyway?" in page
    response = client.post(
        "/admin/notifications/silence/",
        {"action": "release_suppressed", "_selected_action": [silence.pk]},
    )
    assert response.status_code == 302
    assert Notification.objects.get().status == Notification.Status.PENDING


# --- the flood report -----------------------------------------------------------------------------


def _clear_of_an_interval_edge(seconds=15):
    """Wait, if need be, until ``seconds`` into a 10-minute interval with ``seconds`` left, so
    that rows made now (5 seconds old) and the report read next fall in one interval."""
    into = timezone.now().timestamp() % 600
    if into > 600 - seconds:
        time.sleep(600 - into + seconds)
    elif into < seconds:
        time.sleep(seconds - into)


def test_the_flood_report_counts_alarms_per_list_per_10_minutes_and_the_top_sources(operator_api, db):
    _clear_of_an_interval_edge()
    for _ in range(12):
        make_notification(list_name="Operators", source_instance_id="LevelSwitch7")
    for _ in range(3):
        make_notification(list_name="Shift-Leads", source_instance_id="Pump3")
    make_notification(list_name="Operators", source_instance_id="Old", age=timedelta(days=3))

    flood = operator_api.get("/api/v1/kpis/").json()["flood"]
    assert flood["benchmark_per_10_min"] == 10
    by_list = {entry["list_name"]: entry for entry in flood["lists_24h"]}
    assert by_list["Operators"]["max_per_10_min"] == 12
    assert by_list["Operators"]["floods"] == 1
    assert by_list["Operators"]["last_10_min"] == 12
    assert by_list["Shift-Leads"]["floods"] == 0
    assert [(e["source_instance_id"], e["count"]) for e in flood["top_sources_24h"]] == [
        ("LevelSwitch7", 12),
        ("Pump3", 3),
    ]
    assert ("Old", 1) in [(e["source_instance_id"], e["count"]) for e in flood["top_sources_7d"]]


def test_the_flood_report_counts_whole_10_minute_intervals_from_24_hours_and_7_days_ago(db):
    from notifications.suppression import flood_report

    interval = timedelta(minutes=10)
    now = datetime.fromtimestamp(timezone.now().timestamp() // 600 * 600, tz=UTC) + timedelta(minutes=4)
    day_start, week_start = now - timedelta(days=1, minutes=4), now - timedelta(days=7, minutes=4)
    at = {
        "DayEdge": day_start,  # 24 h 4 min ago, in the interval 24 hours ago: in the day
        "BeforeDay": day_start - timedelta(seconds=1),
        "WeekEdge": week_start,
        "BeforeWeek": week_start - timedelta(seconds=1),
        "Now": now - timedelta(minutes=1),
    }
    for source, created in at.items():
        make_notification(list_name=f"List {source}", source_instance_id=source, created_at=created)

    flood = flood_report(now=now)
    assert {e["source_instance_id"] for e in flood["top_sources_24h"]} == {"DayEdge", "Now"}
    assert {e["source_instance_id"] for e in flood["top_sources_7d"]} == {"DayEdge", "BeforeDay", "WeekEdge", "Now"}
    by_list = {e["list_name"]: e for e in flood["lists_24h"]}
    assert set(by_list) == {"List DayEdge", "List Now"}
    assert by_list["List Now"]["last_10_min"] == 1 and by_list["List DayEdge"]["last_10_min"] == 0
    # The next interval leaves the day's first one behind.
    later = flood_report(now=now + interval)
    assert {e["source_instance_id"] for e in later["top_sources_24h"]} == {"Now"}
    assert by_list["List DayEdge"]["max_per_10_min"] == 1


def test_the_flood_report_page_offers_a_one_click_silence_of_a_top_source(db):
    client = Client()
    client.force_login(make_user("olivia", groups=["Operators"]))
    for _ in range(11):
        make_notification(source_instance_id="LevelSwitch7")
    page = client.get("/admin/notifications/notification/flood/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "LevelSwitch7" in html
    assert "source_instance_id=LevelSwitch7" in html and "preset=2h" in html
