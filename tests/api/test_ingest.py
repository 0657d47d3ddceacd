"""The ingest and status API, one test per outcome of the ingest contract (docs/api.md) and per bad input."""

import json
import uuid
from datetime import timedelta
from datetime import timezone as dt_timezone

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.models import Notification
from sites.models import SiteAPIKey
from sites.services import site_key_issue, site_key_revoke
from tests.support.payloads import make_payload

URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"


def post(client, data, url=URL, **extra):
    return client.post(url, json.dumps(data), content_type="application/json", **extra)


def test_new_notification_is_created_with_201_and_its_status_record(api, payload):
    response = post(api, payload)
    assert response.status_code == 201
    record = response.json()
    assert record["notification_id"] == payload["notification_id"]
    assert record["status"] == "Pending"
    assert record["retry_count"] == 0
    assert record["site_enqueued_at"] == "2026-11-21T10:00:00Z"
    assert set(record) == {
        "notification_id",
        "type",
        "list_name",
        "status",
        "priority",
        "retry_count",
        "last_error",
        "site_enqueued_at",
        "created_at",
        "last_attempt_at",
        "next_attempt_at",
        "delivered_at",
        "delivered_locally_at",
        "suppressed_by",
        "dedup_key",
        "occurrences",
        "last_occurrence_at",
        "held_for_digest",
        "delivery_summary",
        "target_counts",
        "targets",
        "asks_ack",
        "acknowledged_at",
        "acknowledged_by",
        "acknowledged_via",
        "acknowledged_note",
        "cleared_at",
        "cleared_note",
        "escalations",
    }
    assert record["targets"] == []  # resolved at delivery time
    row = Notification.objects.get(pk=payload["notification_id"])
    assert row.source_site_id == "plant-a"
    assert row.subject == payload["subject"]
    assert row.source_instance_id == "Pump3"


def test_site_is_stamped_from_the_key_not_the_body(api, payload):
    payload["source_site_id"] = "plant-a"
    assert post(api, payload).status_code == 201
    assert Notification.objects.get(pk=payload["notification_id"]).source_site_id == "plant-a"


def test_optional_fields_take_their_defaults(api):
    payload = {"notification_id": str(uuid.uuid4()), "list_name": "Operators", "subject": "s", "body": "b"}
    before = timezone.now()
    response = post(api, payload)
    assert response.status_code == 201
    row = Notification.objects.get(pk=payload["notification_id"])
    assert row.type == "email"
    assert row.type_data == {}
    assert row.source_instance_id == "" and row.source_script == ""
    assert row.site_enqueued_at >= before


def test_replay_with_same_content_returns_200_and_changes_nothing(api, payload):
    first = post(api, payload).json()
    response = post(api, payload)
    assert response.status_code == 200
    assert response.json() == first
    assert Notification.objects.count() == 1


def test_replay_without_site_enqueued_at_is_still_a_replay(api):
    payload = {"notification_id": str(uuid.uuid4()), "list_name": "Operators", "subject": "s", "body": "b"}
    assert post(api, payload).status_code == 201
    assert post(api, payload).status_code == 200


def test_same_id_with_different_content_is_an_idempotency_conflict(api, payload):
    post(api, payload)
    changed = dict(payload, subject="Pump 4 tripped")
    response = post(api, changed)
    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_conflict"
    assert Notification.objects.get(pk=payload["notification_id"]).subject == "Pump 3 tripped"


def test_same_id_from_another_site_is_an_idempotency_conflict(api, payload, other_site_key):
    post(api, payload)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    response = post(other, payload)
    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_conflict"
    assert Notification.objects.get(pk=payload["notification_id"]).source_site_id == "plant-a"


@pytest.mark.parametrize(
    "field, value",
    [
        ("notification_id", "not-a-uuid"),
        ("notification_id", 12345),
        ("type", "pigeon"),
        ("list_name", ""),
        ("list_name", "   "),
        ("list_name", "x" * 201),
        ("subject", "Pump 3\r\nBcc: victim@example.com"),
        ("subject", "line\nbreak"),
        ("subject", "x" * 256),
        ("subject", 42),
        ("body", "nul \x00 byte"),
        ("list_name", "nul\x00"),
        ("list_name", "Operators\r"),
        ("list_name", "\x0cOperators"),
        ("source_script", "a\x00b"),
        ("source_instance_id", "x" * 201),
        ("type_data", ["not", "an", "object"]),
        ("type_data", "string"),
        ("type_data", {"key": "nul\x00"}),
        ("site_enqueued_at", "2026-11-21T10:00:00"),
        ("site_enqueued_at", "yesterday"),
        ("site_enqueued_at", 1700000000),
        ("source_site_id", "x" * 65),
    ],
)
def test_invalid_field_is_rejected_with_400_naming_the_field_and_stores_nothing(api, field, value):
    response = post(api, make_payload(**{field: value}))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert field in body["errors"]
    assert Notification.objects.count() == 0


@pytest.mark.parametrize("field", ["notification_id", "list_name", "subject", "body"])
def test_missing_required_field_is_rejected_with_400(api, field):
    payload = make_payload()
    del payload[field]
    response = post(api, payload)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert Notification.objects.count() == 0


def test_unknown_field_is_rejected_with_400(api):
    response = post(api, make_payload(listname="Operators"))
    assert response.status_code == 400
    assert "listname" in response.json()["errors"]


def test_unpaired_surrogate_is_rejected_not_a_500(api):
    raw = json.dumps(make_payload()).replace("Pump 3 tripped", "\\ud800", 1)
    response = api.post(URL, raw, content_type="application/json")
    assert response.status_code == 400
    assert "subject" in response.json()["errors"]


def test_malformed_json_is_rejected_with_400(api):
    response = api.post(URL, '{"notification_id": ', content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "parse_error"


def test_body_that_is_not_an_object_is_rejected_with_400(api):
    response = post(api, ["a", "list"])
    assert response.status_code == 400


def test_wrong_content_type_is_rejected_with_415(api, payload):
    response = api.post(URL, json.dumps(payload), content_type="text/plain")
    assert response.status_code == 415
    assert Notification.objects.count() == 0


@override_settings(OUTBOX_MAX_BODY_BYTES=1000)
def test_body_over_the_limit_is_rejected_with_413(api):
    response = post(api, make_payload(body="x" * 2000))
    assert response.status_code == 413
    assert response.json()["error"] == "request_too_large"
    assert Notification.objects.count() == 0


def test_missing_key_is_401(payload, site):
    response = post(APIClient(), payload)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Api-Key"


@pytest.mark.parametrize(
    "header", ["Api-Key", "Api-Key nodot", "Api-Key abc.def", "Bearer xyz", "Api-Key " + "a." * 200]
)
def test_malformed_or_unknown_key_is_401(payload, site_key, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert post(client, payload).status_code == 401


def test_key_with_right_prefix_but_wrong_secret_is_401(payload, site_key):
    prefix = site_key.partition(".")[0]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {prefix}.wrongsecretwrongsecretwrongsecre")
    assert post(client, payload).status_code == 401


def test_revoked_key_is_401(api, payload, site_key):
    site_key_revoke(prefix=site_key.partition(".")[0])
    assert post(api, payload).status_code == 401
    assert Notification.objects.count() == 0


def test_expired_key_is_401(payload, site):
    _, key = site_key_issue(site=site, expiry_date=timezone.now() - timedelta(seconds=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    response = post(client, payload)
    assert response.status_code == 401
    assert response.json()["error"] == "expired_key"


def test_two_live_keys_both_work_during_rotation(payload, site, site_key):
    _, second = site_key_issue(site=site, name="rotation")
    for key in (site_key, second):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
        assert post(client, make_payload()).status_code == 201
    assert SiteAPIKey.objects.filter(site=site, revoked=False).count() == 2


def test_deactivated_site_is_403(api, payload, site):
    site.active = False
    site.save()
    response = post(api, payload)
    assert response.status_code == 403
    assert response.json()["error"] == "site_inactive"
    assert Notification.objects.count() == 0


def test_source_site_id_mismatch_is_403_with_the_field_named(api, payload):
    response = post(api, dict(payload, source_site_id="plant-b"))
    assert response.status_code == 403
    assert response.json() == {
        "error": "site_mismatch",
        "detail": "source_site_id does not match the site of the API key.",
        "errors": {"source_site_id": ["Does not match the site of the API key."]},
    }
    assert Notification.objects.count() == 0


def test_an_invalid_notification_naming_another_site_is_reported_invalid_first(api, payload):
    response = post(api, dict(payload, source_site_id="plant-b", subject="two\nlines"))
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"subject"}


def test_authenticating_records_the_site_last_seen_time(api, payload, site):
    assert site.last_seen_at is None
    post(api, payload)
    site.refresh_from_db()
    assert site.last_seen_at is not None


# --- batch -----------------------------------------------------------------------------------


def test_batch_answers_one_result_per_item_in_order_and_commits_the_valid_ones(api):
    existing = make_payload()
    post(api, existing)
    conflicting = make_payload()
    post(api, conflicting)
    fresh = make_payload()
    items = [fresh, existing, make_payload(subject="bad\nsubject"), dict(conflicting, body="changed"), 7]
    response = post(api, {"notifications": items}, url=BATCH_URL)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["result"] for r in results] == ["created", "replayed", "rejected", "rejected", "rejected"]
    assert results[0]["status"]["status"] == "Pending"
    assert "subject" in results[2]["errors"]
    assert results[3]["error"] == "idempotency_conflict"
    assert results[4]["notification_id"] is None
    assert Notification.objects.count() == 3
    assert Notification.objects.get(pk=conflicting["notification_id"]).body == conflicting["body"]


def test_batch_with_the_same_id_twice_creates_one_row_and_replays_the_second(api):
    item = make_payload()
    results = post(api, {"notifications": [item, item]}, url=BATCH_URL).json()["results"]
    assert [r["result"] for r in results] == ["created", "replayed"]
    assert Notification.objects.count() == 1


def test_batch_item_with_another_site_id_is_rejected_as_the_single_post_is(api):
    item = make_payload(source_site_id="plant-b")
    (result,) = post(api, {"notifications": [item]}, url=BATCH_URL).json()["results"]
    single = post(api, item).json()
    assert result["result"] == "rejected"
    assert (
        (result["error"], result["errors"])
        == (single["error"], single["errors"])
        == (
            "site_mismatch",
            {"source_site_id": ["Does not match the site of the API key."]},
        )
    )


@override_settings(OUTBOX_BATCH_MAX_ITEMS=3)
def test_batch_over_the_configured_maximum_is_rejected_whole(api):
    response = post(api, {"notifications": [make_payload() for _ in range(4)]}, url=BATCH_URL)
    assert response.status_code == 400
    assert "notifications" in response.json()["errors"]
    assert Notification.objects.count() == 0


@pytest.mark.parametrize("body", [{}, {"notifications": "x"}, [], {"notifications": [], "extra": 1}])
def test_batch_with_a_malformed_envelope_is_rejected_with_400(api, body):
    assert post(api, body, url=BATCH_URL).status_code == 400


def test_batch_needs_a_key(site):
    assert post(APIClient(), {"notifications": []}, url=BATCH_URL).status_code == 401


# --- status and listing ----------------------------------------------------------------------


def test_status_of_own_notification_is_returned(api, payload):
    post(api, payload)
    response = api.get(f"{URL}{payload['notification_id']}/")
    assert response.status_code == 200
    assert response.json()["status"] == "Pending"


def test_status_of_another_sites_notification_is_404(api, payload, other_site_key):
    post(api, payload)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    assert other.get(f"{URL}{payload['notification_id']}/").status_code == 404


def test_status_of_unknown_or_malformed_id_is_404(api):
    assert api.get(f"{URL}{uuid.uuid4()}/").status_code == 404
    assert api.get(f"{URL}not-a-uuid/").status_code == 404


def test_list_shows_only_own_notifications_filtered_and_cursor_paginated(api, other_site_key):
    ids = [
        post(api, make_payload(list_name="Operators" if i % 2 else "Managers")).json()["notification_id"]
        for i in range(5)
    ]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    post(other, make_payload())
    Notification.objects.filter(pk=ids[0]).update(status="Delivered")

    everything = api.get(URL).json()
    assert {r["notification_id"] for r in everything["results"]} == set(ids)

    pending = api.get(URL, {"status": "Pending"}).json()["results"]
    assert len(pending) == 4
    managers = api.get(URL, {"list_name": "Managers"}).json()["results"]
    assert len(managers) == 3
    assert api.get(URL, {"type": "email"}).json()["results"]

    page = api.get(URL, {"page_size": 2}).json()
    assert len(page["results"]) == 2 and page["next"]
    second = api.get(page["next"]).json()
    assert len(second["results"]) == 2
    assert not {r["notification_id"] for r in page["results"]} & {r["notification_id"] for r in second["results"]}


def test_list_filters_by_created_time_range(api):
    post(api, make_payload())
    now = timezone.now()
    after = (now - timedelta(minutes=1)).isoformat()
    before = (now + timedelta(minutes=1)).isoformat()
    assert len(api.get(URL, {"created_after": after, "created_before": before}).json()["results"]) == 1
    assert api.get(URL, {"created_after": before}).json()["results"] == []


def test_a_created_filter_is_taken_as_its_utc_instant_whatever_its_offset(api):
    post(api, make_payload())
    now = timezone.now()
    # ±23:59 is valid ISO-8601, beyond what PostgreSQL accepts as an offset (found by the
    # schema fuzz test on PostgreSQL).
    far_east = (now - timedelta(minutes=1)).astimezone(dt_timezone(timedelta(hours=23, minutes=17))).isoformat()
    far_west = (now + timedelta(minutes=1)).astimezone(dt_timezone(-timedelta(hours=23, minutes=17))).isoformat()
    response = api.get(URL, {"created_after": far_east, "created_before": far_west})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1
    assert api.get(URL, {"created_after": far_west}).json()["results"] == []


@pytest.mark.parametrize(
    "query",
    [
        {"status": "Lost"},
        {"created_after": "not-a-date"},
        {"type": "pigeon"},
        # Valid ISO-8601, but before year 1 once converted to UTC (found by the schema fuzz test).
        {"created_before": "0001-01-01T00:02:00.0+00:07"},
    ],
)
def test_list_with_an_invalid_filter_is_400(api, query):
    assert api.get(URL, query).status_code == 400


# --- health and schema -----------------------------------------------------------------------


def test_healthz_answers_200_when_the_database_answers(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["database"] == "up"


def test_schema_is_served_without_a_key(client, db):
    response = client.get("/api/v1/schema/")
    assert response.status_code == 200
    assert b"/api/v1/notifications/batch/" in response.content


def test_a_key_revoked_after_use_is_refused_at_once_despite_the_verified_key_cache(api, site_key):
    assert post(api, make_payload()).status_code == 201
    site_key_revoke(prefix=site_key.partition(".")[0])
    assert post(api, make_payload()).status_code == 401


def test_a_site_deactivated_after_use_is_refused_at_once(api, site):
    assert post(api, make_payload()).status_code == 201
    site.active = False
    site.save()
    assert post(api, make_payload()).status_code == 403


@override_settings(OUTBOX_SITE_RATE_LIMIT=1.0, OUTBOX_SITE_RATE_BURST=3, OUTBOX_BATCH_MAX_ITEMS=3)
def test_a_site_over_its_rate_limit_gets_429_with_retry_after_and_others_are_unaffected(api, other_site_key):
    answers = [post(api, make_payload()).status_code for _ in range(4)]
    assert answers == [201, 201, 201, 429]
    limited = post(api, make_payload())
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) >= 1
    assert limited.json()["error"] == "throttled"
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    assert post(other, make_payload()).status_code == 201
    assert Notification.objects.count() == 4
