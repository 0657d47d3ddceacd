"""``send()`` refuses, with an error naming the field, what central's ingest contract would
refuse — nothing is buffered for central to park later. At the limit is accepted."""

import json

import pytest

from sites.agent import InvalidNotification
from sites.agent.contract import MAX_BODY_BYTES, MAX_LENGTHS


def buffered(outbox):
    return outbox.stats()["buffered"]


@pytest.mark.parametrize(
    "field, limit",
    [(field, MAX_LENGTHS[field]) for field in ("subject", "body", "source_instance_id", "source_script")],
)
def test_a_text_field_at_its_limit_is_accepted_and_one_over_is_refused(outbox, field, limit):
    arguments = {"subject": "s", "body": "b"}
    arguments[field] = "x" * limit
    outbox.notify("Operators").send(**arguments)

    arguments[field] = "x" * (limit + 1)
    with pytest.raises(InvalidNotification) as raised:
        outbox.notify("Operators").send(**arguments)

    assert raised.value.field == field
    assert str(raised.value) == f"{field}: must be at most {limit:,} characters (got {limit + 1:,})"
    assert buffered(outbox) == 1


def test_a_list_name_over_200_characters_is_refused_at_notify(outbox):
    outbox.notify("L" * 200)
    with pytest.raises(InvalidNotification, match="list_name: must be at most 200"):
        outbox.notify("L" * 201)


def test_lengths_count_characters_not_bytes(outbox):
    outbox.notify("Operators").send("é" * 255, "")  # 510 bytes of UTF-8, 255 characters
    assert buffered(outbox) == 1


@pytest.mark.parametrize(
    "field", ["source_instance_id", "source_script", "subject"], ids=lambda field: f"{field}-single-line"
)
def test_single_line_fields_refuse_line_breaks(outbox, field):
    arguments = {"subject": "s", "body": "b", field: "two\nlines"}
    with pytest.raises(InvalidNotification, match=f"{field}: must be a single line"):
        outbox.notify("Operators").send(**arguments)
    assert buffered(outbox) == 0


@pytest.mark.parametrize("character", ["\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028"])
def test_single_line_fields_refuse_every_control_character_but_tab(outbox, character):
    with pytest.raises(InvalidNotification, match="subject: must not contain control characters"):
        outbox.notify("Operators").send(f"Alarm{character}Bcc: x@evil.example", "b")
    outbox.notify("Operators").send("Alarm\tpump 3", "b")
    assert buffered(outbox) == 1


@pytest.mark.parametrize(
    "name, problem",
    [
        ("\u041eperators", "mixes Cyrillic and Latin letters"),
        ("Oper\u200bators", "must not contain invisible formatting"),
    ],
)
def test_look_alike_list_names_are_refused_at_notify(outbox, name, problem):
    with pytest.raises(InvalidNotification, match=f"list_name: {problem}"):
        outbox.notify(name)


def test_the_body_may_have_line_breaks(outbox):
    outbox.notify("Operators").send("s", "line one\r\nline two")
    assert buffered(outbox) == 1


def test_type_data_up_to_64_kib_of_json_is_accepted_and_more_is_refused(outbox):
    overhead = len(json.dumps({"blob": ""}))
    outbox.notify("Operators").send("s", "b", type_data={"blob": "x" * (65_536 - overhead)})

    with pytest.raises(InvalidNotification, match="type_data: must be at most 65,536 bytes as JSON"):
        outbox.notify("Operators").send("s", "b", type_data={"blob": "x" * (65_537 - overhead)})
    assert buffered(outbox) == 1


def test_email_attachment_contents_do_not_count_against_the_type_data_limit_as_at_central(outbox):
    chart = {"filename": "trend.png", "content_type": "image/png", "content_base64": "QUJD" * 50_000}
    outbox.notify("Operators").send("s", "b", type_data={"attachments": [chart]})
    with pytest.raises(InvalidNotification, match="type_data: must be at most 65,536 bytes as JSON"):
        outbox.notify("Operators").send("s", "b", type_data={"attachments": [chart], "html": "x" * 65_536})


def test_type_data_is_measured_as_central_measures_it_with_escaped_non_ascii(outbox):
    # "é" is one character but six ("\u00e9") in central's ASCII-escaped JSON.
    with pytest.raises(InvalidNotification, match="type_data"):
        outbox.notify("Operators").send("s", "b", type_data={"text": "é" * 11_000})


@pytest.mark.parametrize(
    "type_data, problem",
    [
        ({"a\x00": 1}, "NUL"),
        ({"a": ["ok", "nul\x00"]}, "NUL"),
        ({"a": float("nan")}, "NaN"),
        ({"a": float("inf")}, "NaN or infinite"),
    ],
)
def test_type_data_with_nul_or_non_finite_numbers_is_refused(outbox, type_data, problem):
    with pytest.raises(InvalidNotification, match=problem):
        outbox.notify("Operators").send("s", "b", type_data=type_data)


def test_type_data_nested_deeper_than_central_accepts_is_refused(outbox):
    deep: dict = {}
    node = deep
    for _ in range(25):
        node["next"] = {}
        node = node["next"]
    with pytest.raises(InvalidNotification, match="nested"):
        outbox.notify("Operators").send("s", "b", type_data=deep)


def test_a_notification_over_the_body_limit_is_refused_with_both_sizes(make_outbox):
    outbox = make_outbox(max_body_bytes=4096)
    outbox.notify("Operators").send("s", "x" * 3500)

    with pytest.raises(InvalidNotification) as raised:
        outbox.notify("Operators").send("s", "x" * 4096)

    assert raised.value.field == "notification"
    assert "central accepts request bodies of at most 4,096 bytes" in str(raised.value)
    assert buffered(outbox) == 1


def test_the_default_body_limit_is_centrals_default():
    assert MAX_BODY_BYTES == 1_048_576


def test_a_blank_type_or_list_is_refused(outbox):
    with pytest.raises(InvalidNotification, match="type: must not be blank"):
        outbox.notify("Operators").send("s", "b", type=" ")
    with pytest.raises(InvalidNotification, match="list_name: must not be blank"):
        outbox.notify(" ")


def test_a_site_id_over_64_characters_is_refused_when_the_outbox_is_made(make_outbox):
    with pytest.raises(InvalidNotification, match="source_site_id"):
        make_outbox(site_id="p" * 65)


def test_invalid_notification_is_a_value_error_for_existing_callers(outbox):
    with pytest.raises(ValueError):
        outbox.notify("Operators").send("x" * 300, "b")
