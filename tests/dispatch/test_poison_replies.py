"""What a remote SMTP server answers must never wedge the dispatcher: a reply that the database
cannot store as it is (a NUL byte, control characters) is recorded in a storable form, and the
other rows of the pass are delivered and finished as usual (once each)."""

import pytest

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
