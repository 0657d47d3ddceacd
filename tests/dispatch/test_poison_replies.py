"""What a remote SMTP server answers must never wedge the dispatcher: a reply that the database
cannot store as it is (a NUL byte, control characters) is recorded in a storable form, and the
other rows of the pass are delivered and finished as usual (once each)."""

import pytest
from django.utils import timezone

from notifications import db
from notifications.models import DeliveryAttempt
from tests.dispatch.conftest import fresh, queue, run_pass

pytestmark = pytest.mark.usefixtures("operators_list")


def test_a_250_reply_with_a_nul_byte_is_recorded_escaped_and_every_other_row_is_delivered_once(
    smtp_server, smtp_config
):
    smtp_server.poison_marker = "POISON"
    innocent = queue(5)
    (poisoned,) = queue(subject="POISON in the reply")

    report = run_pass()

    assert report.delivered == 6
    assert report.claimed == 6
    for row in [*innocent, poisoned]:
        assert fresh(row).status == "Delivered"
    attempt = DeliveryAttempt.objects.get(notification=poisoned)
    assert attempt.outcome == DeliveryAttempt.Outcome.SUCCESS
    assert attempt.detail["smtp_reply"] == "2.0.0 queued as \\x00ABC"
    # Nothing is left claimed, so nothing is sent again.
    assert run_pass().claimed == 0
    assert set(smtp_server.count_by_notification_id().values()) == {1}
    assert smtp_server.count == 6


def test_a_refusal_with_control_characters_parks_with_the_reply_escaped(smtp_server, smtp_config):
    smtp_server.code_5xx = "554 5.7.1 no\x00pe \x1b[2J"
    smtp_server.behave("5xx")
    (row,) = queue()
    run_pass()
    row = fresh(row)
    assert row.status == "Parked"
    assert "no\\x00pe \\x1b[2J" in row.last_error
    assert "\x00" not in row.last_error and "\x1b" not in row.last_error


def test_the_storage_seam_escapes_nul_and_replaces_unpaired_surrogates_at_any_depth():
    value = {"reply\x00": ["a\x00b", {"x": "\ud800"}], "code": 250}
    assert db.storable(value) == {"reply\\x00": ["a\\x00b", {"x": "\ufffd"}], "code": 250}


def test_the_storage_seam_leaves_clean_values_as_they_are():
    # The common case is checked in one pass; text that merely looks like an escape stays text.
    value = {"targets": [{"target": "ops@example.com", "outcome": "delivered", "smtp_code": 250}], "note": "\\u0000"}
    assert db.storable(value) == {
        "targets": [{"target": "ops@example.com", "outcome": "delivered", "smtp_code": 250}],
        "note": "\\u0000",
    }
    assert db.storable(["é ✓", 1.5, None, True]) == ["é ✓", 1.5, None, True]


def test_the_storage_seam_with_text_gives_the_stored_value_and_a_text_that_groups_equal_values():
    clean = {"status": "Delivered", "last_error": "", "targets": [{"target": "ops@example.com", "code": 250}]}
    stored, text = db.storable_with_text(clean)
    assert stored is clean  # nothing to repair: the value itself, serialised once
    reordered = {"targets": [{"code": 250, "target": "ops@example.com"}], "last_error": "", "status": "Delivered"}
    assert db.storable_with_text(reordered)[1] == text  # equal values, equal texts

    poisoned = {"last_error": "421 \x00 closing", "detail": {"reply": "\ud800"}}
    stored, text = db.storable_with_text(poisoned)
    assert stored == {"last_error": "421 \\x00 closing", "detail": {"reply": "\ufffd"}}
    assert text == db.storable_with_text(stored)[1]  # the text of what is stored, not of the input
    text.encode("utf-8")


def test_results_written_back_by_primary_key_are_stored_repaired_and_the_objects_hold_what_was_written(
    smtp_config,
):
    clean, poisoned = (
        DeliveryAttempt.objects.create(notification=row, started_at=timezone.now(), worker="w") for row in queue(2)
    )
    clean.error, clean.detail = "250 ok", {"smtp_reply": "2.0.0 ok"}
    poisoned.error, poisoned.detail = "451 \x00 later", {"smtp_reply": "\ud800 \x00"}

    db.update_by_pk([clean, poisoned], ["error", "detail"])

    assert (poisoned.error, poisoned.detail) == ("451 \\x00 later", {"smtp_reply": "\ufffd \\x00"})
    for attempt in (clean, poisoned):
        stored = DeliveryAttempt.objects.get(pk=attempt.pk)
        assert (stored.error, stored.detail) == (attempt.error, attempt.detail)
    assert (clean.error, clean.detail) == ("250 ok", {"smtp_reply": "2.0.0 ok"})
