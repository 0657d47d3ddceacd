"""Property tests of ingest: no input produces a 5xx, and any accepted input round-trips
exactly (what the site sent is what central stored and answers)."""

import contextlib
import json
import os
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from notifications.list_names import list_name_normalize
from notifications.models import Notification

EXAMPLES = int(os.environ.get("OUTBOX_FUZZ_EXAMPLES", "30")) * 2
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any Unicode, including CR/LF, NUL and unpaired surrogates, which must be rejected cleanly.
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=12,
)
timestamps = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)).map(
    lambda moment: moment.isoformat().replace("+00:00", "Z")
)
payloads = st.fixed_dictionaries(
    {
        # Fresh ids: the database is not rolled back between examples of one test.
        "notification_id": st.builds(lambda: str(uuid.uuid4())) | any_text,
        "list_name": any_text,
        "subject": any_text,
        "body": any_text,
    },
    optional={
        "type": st.sampled_from(["email", "teams", "", None]) | any_text,
        "type_data": json_values,
        "source_instance_id": any_text | st.none(),
        "source_script": any_text | st.none(),
        "site_enqueued_at": timestamps | any_text | st.none(),
        "source_site_id": st.sampled_from(["plant-a", "plant-b", None]),
    },
)


@pytest.fixture
def unthrottled(settings):
    """No per-site rate limit: it has its own tests, and here it would only cut a long run
    (OUTBOX_FUZZ_EXAMPLES in the hundreds) short with 429s."""
    settings.OUTBOX_SITE_RATE_LIMIT = 0


def as_json_numbers(value):
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


def _post(client, payload):
    body = json.dumps(payload)  # surrogates become \\ud800 escapes, as a real client sends them
    return client.post("/api/v1/notifications/", body, content_type="application/json")


@pytest.mark.usefixtures("unthrottled")
@SETTINGS
@given(payload=payloads)
def test_no_input_produces_a_5xx_and_accepted_input_round_trips_exactly(api, payload):
    response = _post(api, payload)
    assert response.status_code in (201, 400, 403), response.content
    if response.status_code != 201:
        if "notification_id" in payload and isinstance(payload["notification_id"], str):
            with contextlib.suppress(ValueError):
                assert not Notification.objects.filter(pk=uuid.UUID(payload["notification_id"])).exists()
        return
    row = Notification.objects.get(pk=payload["notification_id"])
    # List names are stored trimmed and in NFC (a control character at either end is refused).
    assert row.list_name == list_name_normalize(payload["list_name"])
    assert row.subject == payload["subject"]
    assert row.body == payload["body"]
    assert row.type == (payload.get("type") or "email")
    # JSON numbers are decimals: PostgreSQL's jsonb keeps 4.739692884733818e+16 as the number
    # 47396928847338180, which is the same JSON number but not the same Python float.
    assert as_json_numbers(row.type_data) == as_json_numbers(payload.get("type_data") or {})
    assert row.source_instance_id == (payload.get("source_instance_id") or "")
    assert row.source_script == (payload.get("source_script") or "")
    if payload.get("site_enqueued_at"):
        sent = datetime.fromisoformat(payload["site_enqueued_at"])
        assert row.site_enqueued_at == sent
        assert response.json()["site_enqueued_at"] == sent.astimezone(UTC).isoformat().replace("+00:00", "Z")
    # A replay of exactly the same payload is acknowledged and changes nothing.
    assert _post(api, payload).status_code == 200


@pytest.mark.usefixtures("unthrottled")
@SETTINGS
@given(items=st.lists(payloads | json_values, max_size=8))
def test_no_batch_produces_a_5xx_and_results_match_items_one_to_one(api, items):
    response = api.post(
        "/api/v1/notifications/batch/", json.dumps({"notifications": items}), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert len(results) == len(items)
    for result in results:
        assert result["result"] in ("created", "replayed", "rejected")
        if result["result"] != "rejected":
            assert Notification.objects.filter(pk=result["notification_id"]).exists()


def test_property_tests_use_a_client_that_is_really_authenticated(api):
    assert isinstance(api, APIClient)
    assert api.get("/api/v1/notifications/").status_code == 200
