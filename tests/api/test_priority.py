"""Priority at ingest: critical|high|normal|low (default normal), stored, in the status record,
filterable; an unknown one is a 400 naming the field; it joins the idempotency fingerprint only
when it is not normal, so what old agents sent (no priority) and rows stored before priorities
existed replay as before."""

import hashlib
import json

import pytest

from notifications.ingest import notification_validate
from notifications.models import Notification
from tests.support.payloads import make_payload

URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"
Priority = Notification.Priority


def post(client, data, url=URL):
    return client.post(url, json.dumps(data), content_type="application/json")


@pytest.mark.parametrize("name", ["critical", "high", "normal", "low"])
def test_each_priority_is_stored_and_returned_in_the_status_record(api, name):
    payload = make_payload(priority=name)
    response = post(api, payload)
    assert response.status_code == 201
    assert response.json()["priority"] == name
    assert Notification.objects.get(pk=payload["notification_id"]).priority == Priority.named(name)
    assert api.get(f"{URL}{payload['notification_id']}/").json()["priority"] == name


@pytest.mark.parametrize("given", [None, "absent"])
def test_a_notification_without_a_priority_is_normal(api, given):
    payload = make_payload() if given == "absent" else make_payload(priority=given)
    assert post(api, payload).json()["priority"] == "normal"
    assert Notification.objects.get(pk=payload["notification_id"]).priority == Priority.NORMAL


@pytest.mark.parametrize("value", ["urgent", "Critical", "", " high", 3, True, ["critical"], {"level": "high"}])
def test_an_unknown_priority_is_refused_with_400_naming_the_field_and_nothing_is_stored(api, value):
    response = post(api, make_payload(priority=value))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert list(body["errors"]) == ["priority"]
    assert "critical, high, normal, low" in body["errors"]["priority"][0]
    assert Notification.objects.count() == 0


def test_a_batch_item_with_an_unknown_priority_is_rejected_alone_and_the_others_keep_theirs(api):
    good = [make_payload(priority="critical"), make_payload()]
    bad = make_payload(priority="emergency")
    response = post(api, {"notifications": [good[0], bad, good[1]]}, BATCH_URL)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["result"] for r in results] == ["created", "rejected", "created"]
    assert list(results[1]["errors"]) == ["priority"]
    assert [r["status"]["priority"] for r in (results[0], results[2])] == ["critical", "normal"]


def test_a_replay_with_the_same_priority_is_200_and_a_changed_priority_is_a_conflict(api):
    payload = make_payload(priority="high")
    assert post(api, payload).status_code == 201
    assert post(api, payload).status_code == 200
    conflict = post(api, {**payload, "priority": "critical"})
    assert conflict.status_code == 422
    assert conflict.json()["error"] == "idempotency_conflict"
    assert Notification.objects.get(pk=payload["notification_id"]).priority == Priority.HIGH


def test_normal_sent_or_left_out_is_the_same_notification(api):
    # An agent sends priority only when it is not normal; a client that spells it out must
    # replay the same row, not conflict with it.
    payload = make_payload()
    assert post(api, payload).status_code == 201
    assert post(api, {**payload, "priority": "normal"}).status_code == 200
    assert post(api, {**payload, "priority": None}).status_code == 200


def test_a_row_stored_before_priorities_existed_still_replays(api, site):
    # Its fingerprint was computed without a priority: the same content sent again by an old
    # agent (no priority field) must be a replay, not a conflict.
    payload = make_payload()
    item, _ = notification_validate(payload, site_id=site.site_id)
    parts = (
        "email",
        "Operators",
        payload["subject"],
        payload["body"],
        "{}",
        payload["source_instance_id"],
        payload["source_script"],
        "2026-11-21T10:00:00+00:00",
    )
    fingerprint_before = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    assert item is not None and item.fingerprint == fingerprint_before
    assert post(api, payload).status_code == 201
    assert post(api, payload).status_code == 200


def test_the_list_is_filtered_by_priority(api):
    critical = make_payload(priority="critical")
    for payload in (critical, make_payload(), make_payload(priority="low")):
        assert post(api, payload).status_code == 201
    answer = api.get(URL, {"priority": "critical"})
    assert [r["notification_id"] for r in answer.json()["results"]] == [critical["notification_id"]]
    assert len(api.get(URL, {"priority": "normal"}).json()["results"]) == 1


def test_an_unknown_priority_filter_is_a_400(api):
    response = api.get(URL, {"priority": "urgent"})
    assert response.status_code == 400
    assert "priority" in response.json()["errors"]


def test_the_openapi_schema_describes_the_priority(client):
    schemas = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["components"]["schemas"]
    field = schemas["NotificationInRequest"]["properties"]["priority"]
    assert field["default"] == "normal"
    assert {"$ref": "#/components/schemas/PriorityEnum"} in field["oneOf"]
    assert schemas["StatusRecord"]["properties"]["priority"] == {"$ref": "#/components/schemas/PriorityEnum"}
    assert schemas["PriorityEnum"]["enum"] == ["critical", "high", "normal", "low"]
