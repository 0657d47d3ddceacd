"""Poison inputs to the API: every one gets a 4xx with the API's error shape (never a 500), and
nothing is stored for it. Header hygiene and list-name rules are checked where ingest applies
them."""

import base64
import json
import unicodedata
from urllib.parse import urlencode

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from notifications.models import Notification
from tests.support.payloads import make_payload

URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def post_raw(api: APIClient, url: str, body: str):
    return api.post(url, body, content_type="application/json")


# --- deep nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [21, 500, 5000])
def test_type_data_nested_too_deeply_is_a_400_at_any_depth(api, depth):
    # Built as text: json.dumps itself would hit the recursion limit.
    body = json.dumps(make_payload(type_data={})).replace(
        '"type_data": {}', '"type_data": ' + '{"k": ' * depth + "1" + "}" * depth
    )
    response = post_raw(api, URL, body)
    assert response.status_code == 400
    assert response.json()["error"] in ("invalid", "parse_error")
    assert not Notification.objects.exists()


def test_a_batch_with_one_over_deep_item_is_refused_whole_as_unparseable(api):
    items = [json.dumps(make_payload()) for _ in range(3)]
    items.insert(1, '{"type_data": ' + "[" * 5000 + "]" * 5000 + "}")
    response = post_raw(api, BATCH_URL, '{"notifications": [' + ",".join(items) + "]}")
    assert response.status_code == 400
    assert response.json() == {
        "error": "parse_error",
        "detail": "JSON parse error - the document is nested too deeply.",
    }
    assert not Notification.objects.exists()


def test_a_batch_item_nested_beyond_the_type_data_depth_is_rejected_alone(api):
    good = make_payload()
    deep = make_payload(type_data=nested(25))
    response = api.post(BATCH_URL, {"notifications": [good, deep]}, format="json")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["result"] for r in results] == ["created", "rejected"]
    assert results[1]["errors"] == {"type_data": ["Is nested too deeply."]}


# --- header hygiene ----------------------------------------------------------------------------


@pytest.mark.parametrize("character", ["\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\x01"])
@pytest.mark.parametrize("field", ["subject", "list_name", "source_script"])
def test_control_characters_other_than_tab_are_refused_in_one_line_fields(api, field, character):
    response = api.post(URL, make_payload(**{field: f"Alarm{character}Bcc: attacker@evil.example"}), format="json")
    assert response.status_code == 400
    assert list(response.json()["errors"]) == [field]
    assert not Notification.objects.exists()


def test_a_tab_in_the_subject_and_line_breaks_and_tabs_in_the_body_are_kept(api):
    payload = make_payload(subject="Pump 3\ttripped", body="Line one\r\nLine two\n\tindented")
    assert api.post(URL, payload, format="json").status_code == 201
    row = Notification.objects.get()
    assert (row.subject, row.body) == ("Pump 3\ttripped", "Line one\r\nLine two\n\tindented")


# --- list names --------------------------------------------------------------------------------


def test_a_list_name_is_stored_trimmed_and_in_nfc_and_a_replay_of_the_raw_form_is_a_replay(api):
    decomposed = unicodedata.normalize("NFD", "Opérateurs")
    payload = make_payload(list_name=f"  {decomposed} ")
    assert api.post(URL, payload, format="json").status_code == 201
    assert Notification.objects.get().list_name == "Opérateurs"
    assert api.post(URL, payload, format="json").status_code == 200


@pytest.mark.parametrize(
    "name, reason",
    [
        ("\u041eperators", "Mixes Cyrillic and Latin letters"),  # Cyrillic capital O
        ("Oper\u200bators", "invisible formatting"),  # zero-width space
        ("Oper\u2028ators", "line or paragraph separators"),
        ("\u202eSrotarepo", "invisible formatting"),  # right-to-left override
    ],
)
def test_look_alike_and_invisible_list_names_are_refused_with_the_reason(api, name, reason):
    response = api.post(URL, make_payload(list_name=name), format="json")
    assert response.status_code == 400
    assert reason in response.json()["errors"]["list_name"][0]


@pytest.mark.parametrize("name", ["ΟΔΟΣ", "İzmir", "東京", "Оператори"])
def test_list_names_in_one_script_are_accepted(api, name):
    assert api.post(URL, make_payload(list_name=name), format="json").status_code == 201


# --- query strings and cursors -----------------------------------------------------------------


def test_a_nul_in_any_query_parameter_is_a_400_with_the_api_error_shape(api):
    response = api.get(URL + "?list_name=%00")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"


def _cursor(query: dict[str, str]) -> str:
    return base64.b64encode(urlencode(query).encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        _cursor({"p": "\x00"}),
        _cursor({"p": "not a time"}),
        _cursor({"p": "2026-01-01T00:00:00"}),  # no timezone
        _cursor({"p": "1232-06-17T02:30:48+16:50", "r": "1"}),
        _cursor({"o": "99999999999999999999999"}),
        "!!!not-base64",
        _cursor({"p": "9999-12-31T23:59:59-23:59"}),  # no UTC instant
    ],
)
def test_a_tampered_cursor_is_404_invalid_cursor_never_a_500(api, cursor):
    api.post(URL, make_payload(), format="json")
    response = api.get(URL, {"cursor": cursor})
    assert response.status_code in (200, 404)
    if response.status_code == 404:
        assert response.json() == {"error": "not_found", "detail": "Invalid cursor"}


def test_a_creation_filter_with_a_far_offset_and_an_old_year_is_answered(api):
    response = api.get(URL, {"created_after": "1232-06-17T02:30:48+16:50"})
    assert response.status_code == 200


# --- bodies and hosts --------------------------------------------------------------------------


def test_a_chunked_body_is_411_length_required_not_read_as_empty(api):
    response = api.generic("POST", URL, data=b"", content_type="application/json", HTTP_TRANSFER_ENCODING="chunked")
    assert response.status_code == 411
    assert response.json()["error"] == "length_required"


@override_settings(ALLOWED_HOSTS=["outbox.example.com"])
def test_a_host_not_served_here_gets_the_json_error_shape_on_api_paths(api):
    response = api.get(URL, HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == "bad_request"
