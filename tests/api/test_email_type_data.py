"""type_data for email at ingest (docs/api.md, "type_data for email"): valid content is stored
exactly as sent; every malformed or oversize field is a 400 naming it, and nothing is stored."""

import base64
import json
import string

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from notifications.email_address import email_address_problem
from notifications.email_content import email_type_data_validate
from notifications.models import Notification
from tests.support.payloads import make_payload

URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"


def post(client, data, url=URL):
    return client.post(url, json.dumps(data), content_type="application/json")


def attachment(**fields):
    values = {"filename": "trend.png", "content_type": "image/png", "content_base64": base64.b64encode(b"PNG").decode()}
    values.update(fields)
    return values


def test_rich_email_type_data_is_accepted_and_stored_exactly_as_sent(api):
    type_data = {
        "html": "<p onclick='x()'>Pump <b>3</b> tripped</p><script>alert(1)</script>",
        "reply_to": "control-room@plant.example",
        "cc": ["chief@plant.example"],
        "priority": "high",
        "attachments": [attachment(content_base64="UE5H\nRw==\n")],
        "site_ticket": 4711,
    }
    payload = make_payload(type_data=type_data)
    response = post(api, payload)
    assert response.status_code == 201, response.json()
    # Sanitising happens when the message is composed; the audit row keeps what the site sent.
    assert Notification.objects.get(pk=payload["notification_id"]).type_data == type_data


@pytest.mark.parametrize(
    "type_data, field, message",
    [
        ({"html": 42}, "type_data.html", "Must be a string of HTML."),
        ({"reply_to": "not an address"}, "type_data.reply_to", "Is not a valid email address."),
        ({"reply_to": []}, "type_data.reply_to", "Must be an email address or a non-empty list of them."),
        ({"cc": ["a@example.com", "b@"]}, "type_data.cc[1]", "Is not a valid email address."),
        ({"cc": ["a@example.com", "A@example.com"]}, "type_data.cc[1]", "Is listed twice."),
        ({"cc": ["chef@exämple.com"]}, "type_data.cc[0]", "Must be an ASCII address"),
        ({"cc": [f"o{n}@example.com" for n in range(51)]}, "type_data.cc", "Must list at most 50 addresses (got 51)."),
        ({"cc": {"a": "b"}}, "type_data.cc", "Must be an email address or a non-empty list of them."),
        ({"priority": "urgent"}, "type_data.priority", "Must be one of high, normal, low."),
        ({"attachments": {"filename": "x"}}, "type_data.attachments", "Must be a list of attachments."),
        ({"attachments": [attachment()] * 11}, "type_data.attachments", "Must have at most 10 attachments (got 11)."),
        ({"attachments": ["trend.png"]}, "type_data.attachments[0]", "Must be an object with filename"),
        (
            {"attachments": [attachment(content_base64="not base64!")]},
            "type_data.attachments[0].content_base64",
            "Not valid base64.",
        ),
        (
            {"attachments": [attachment(content_base64="QQ==QUJD")]},
            "type_data.attachments[0].content_base64",
            "Not valid base64.",
        ),
        (
            {"attachments": [attachment(), attachment(content_type="application/x-msdownload")]},
            "type_data.attachments[1].content_type",
            "Content type 'application/x-msdownload' is not allowed; allowed: application/json",
        ),
        (
            {"attachments": [attachment(content_type="text/html")]},
            "type_data.attachments[0].content_type",
            "is not allowed",
        ),
        ({"attachments": [attachment(filename=None)]}, "type_data.attachments[0].filename", "This field is required."),
        ({"attachments": [attachment(filename="  ")]}, "type_data.attachments[0].filename", "Must not be blank."),
        (
            {"attachments": [attachment(filename="a\r\nContent-Type: text/html")]},
            "type_data.attachments[0].filename",
            "Must not contain line breaks or other control characters.",
        ),
        (
            {"attachments": [attachment(filename="x" * 256)]},
            "type_data.attachments[0].filename",
            "Must be at most 255 characters (got 256).",
        ),
        ({"attachments": [attachment(content_type=7)]}, "type_data.attachments[0].content_type", "Must be a string."),
        ({"attachments": [attachment(disposition="inline")]}, "type_data.attachments[0].disposition", "Unknown field."),
    ],
)
def test_malformed_email_type_data_is_a_400_naming_the_field(api, type_data, field, message):
    response = post(api, make_payload(type_data=type_data))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert field in body["errors"], body["errors"]
    assert body["errors"][field][0].startswith(message) or message in body["errors"][field][0]
    assert Notification.objects.count() == 0


def test_every_problem_is_named_at_once(api):
    type_data = {"priority": "soon", "attachments": [attachment(content_base64="%%%", content_type="app/x")]}
    errors = post(api, make_payload(type_data=type_data, subject="a\nb")).json()["errors"]
    assert set(errors) == {
        "subject",
        "type_data.priority",
        "type_data.attachments[0].content_type",
        "type_data.attachments[0].content_base64",
    }


def test_attachments_over_the_configured_total_are_a_400_naming_attachments(api, settings):
    settings.OUTBOX_MAX_ATTACHMENT_BYTES = 1000
    halves = [attachment(content_base64=base64.b64encode(b"x" * 500).decode()) for _ in range(2)]
    assert post(api, make_payload(type_data={"attachments": halves})).status_code == 201

    over = [*halves, attachment(content_base64=base64.b64encode(b"x").decode())]
    response = post(api, make_payload(type_data={"attachments": over}))
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "type_data.attachments": ["Attachments total 1,001 bytes (decoded); at most 1,000 are allowed."]
    }
    assert Notification.objects.count() == 1


def test_attachment_contents_do_not_count_against_the_type_data_size_limit(api):
    """The 64 KiB limit is for everything else in type_data; a 300 KB chart has its own bound."""
    chart = attachment(content_base64=base64.b64encode(b"\x89PNG" * 75_000).decode())
    assert post(api, make_payload(type_data={"attachments": [chart]})).status_code == 201

    response = post(api, make_payload(type_data={"html": "<p>" + "x" * 65_536 + "</p>"}))
    assert response.status_code == 400 and "type_data" in response.json()["errors"]


def test_a_batch_item_with_bad_email_type_data_is_rejected_naming_the_field(api):
    good, bad = make_payload(), make_payload(type_data={"attachments": [attachment(content_base64="@@")]})
    results = post(api, {"notifications": [good, bad]}, url=BATCH_URL).json()["results"]
    assert [r["result"] for r in results] == ["created", "rejected"]
    assert results[1]["errors"] == {"type_data.attachments[0].content_base64": ["Not valid base64."]}


def test_other_types_do_not_read_email_fields(api):
    """Only email reads these keys; an unknown type is refused for its type, not its type_data."""
    response = post(api, make_payload(type="pigeon", type_data={"priority": "urgent"}))
    assert set(response.json()["errors"]) == {"type"}


def test_an_attachment_bound_no_request_could_carry_is_a_system_check_warning(settings):
    from notifications.checks import check_attachment_limit

    assert check_attachment_limit() == []
    settings.OUTBOX_MAX_ATTACHMENT_BYTES = 900_000  # 1,200,000 bytes as base64
    (warning,) = check_attachment_limit()
    assert warning.id == "outbox.W002" and "OUTBOX_MAX_BODY_BYTES" in warning.msg


# --- addresses: one rule at ingest and at delivery -------------------------------------------------

CONTROL_CHARACTERS = ["\x0c", "\x0b", "\t", "\r", "\n", "\x1b", "\x7f", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("field", ["reply_to", "cc"])
@pytest.mark.parametrize("character", CONTROL_CHARACTERS, ids=lambda c: f"U+{ord(c):04X}")
def test_an_address_with_a_control_character_is_a_400_naming_the_field(api, field, character):
    # In a quoted local part Django's syntax check alone lets VT and FF through; delivery would
    # then refuse the notification for good.
    address = f'"ops{character}team"@plant.example'
    response = post(api, make_payload(type_data={field: ["ok@plant.example", address]}))
    assert response.status_code == 400
    (problem,) = response.json()["errors"][f"type_data.{field}[1]"]
    assert problem.startswith("Must not contain") and f"(found U+{ord(character):04X})" in problem
    assert set(response.json()["errors"]) == {f"type_data.{field}[1]"}
    assert Notification.objects.count() == 0


def delivery_refusal(type_data):
    """Why delivery refuses the Cc and Reply-To of ``type_data``, as the email adapter checks them
    (the same reading of type_data, no control character in a header or an SMTP command) and
    composes them; None when the message can be sent."""
    from notifications.adapters.email_compose import email_compose
    from notifications.email_content import email_content_read
    from notifications.list_names import text_control_problem

    content, errors = email_content_read(type_data)
    if errors:
        return errors
    for address in (*content.cc, *content.reply_to):
        if text_control_problem(address):
            return text_control_problem(address)
    email_compose(
        from_address="outbox@example.com",
        to=[],
        subject="Pump 3 tripped",
        body="Overcurrent.",
        message_id="<id@example.com>",
        notification_id="id",
        date="Thu, 26 Nov 2026 10:00:00 +0000",
        content=content,
    )
    return None


_ATOM = string.ascii_letters + string.digits + "!#$%&'*+/=?^_`{|}~-"
_ODD = '"\\ ().,:;<>@[]' + "".join(CONTROL_CHARACTERS) + "\x00\x01é"
local_parts = st.one_of(
    st.lists(st.text(_ATOM, min_size=1, max_size=6), min_size=1, max_size=3).map(".".join),
    st.text(_ATOM + _ODD, max_size=10).map(lambda text: f'"{text}"'),
    st.text(_ATOM + _ODD, min_size=1, max_size=12),
)
domains = st.sampled_from(
    ["plant.example", "xn--bcher-kva.example", "bücher.example", "[127.0.0.1]", "localhost", "-x.example", "a..b"]
)
addresses = st.builds("{}@{}".format, local_parts, domains)


@given(address=addresses)
@example(address='"ops\x0cteam"@plant.example')
@example(address='"ops team"@plant.example')
@example(address="o'brien+alarms@plant.example")
@hypothesis_settings(max_examples=300, deadline=None)
def test_every_address_ingest_accepts_is_one_delivery_sends(address):
    type_data = {"cc": [address], "reply_to": address}
    if email_type_data_validate(type_data):
        return  # refused at ingest: the site hears about it at once
    assert delivery_refusal(type_data) is None
    assert email_address_problem(address) is None  # and the list editor would take it too
