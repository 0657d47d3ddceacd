"""The message the email adapter composes parses back to exactly what was sent."""

from email import message_from_bytes
from email.policy import default

import pytest

from notifications.adapters.email import MAX_LINE_BYTES, compose_message


def compose(subject="Pump 3 tripped", body="Overcurrent at 10:00.\nCheck the motor.", to=("a@example.com",)):
    return compose_message(from_address="outbox@example.com", to=list(to), subject=subject, body=body,
                           message_id="<id@example.com>", notification_id="6f1c", date="Mon, 23 Nov 2026 10:00:00 +0000")  # fmt: skip


@pytest.mark.parametrize(
    "subject, body",
    [
        ("Pump 3 tripped", "Overcurrent at 10:00.\nCheck the motor."),
        ("Pumpe 3 ausgelöst — Überstrom " * 8, "Überstrom um 10:00.\r\nMotor prüfen. 温度过高"),
        ("Long line", "x" * 5000),
        ("Dots", ".\n..\n.leading dot"),
        ("Empty body", ""),
    ],
)
def test_subject_and_body_round_trip_and_no_line_is_too_long(subject, body):
    raw = compose(subject=subject, body=body)
    assert b"\n" not in raw.replace(b"\r\n", b"")  # no bare line feeds
    assert all(len(line) <= MAX_LINE_BYTES for line in raw.split(b"\r\n"))
    message = message_from_bytes(raw, policy=default)
    assert message["Subject"] == subject
    assert message.get_content().replace("\r\n", "\n").rstrip("\n") == body.replace("\r\n", "\n").rstrip("\n")
    assert message["X-Notification-Id"] == "6f1c"


def test_many_recipients_are_folded_and_all_listed():
    recipients = [f"operator{n}@example.com" for n in range(200)]
    raw = compose(to=recipients)
    assert all(len(line) <= MAX_LINE_BYTES for line in raw.split(b"\r\n"))
    message = message_from_bytes(raw, policy=default)
    assert [address.addr_spec for address in message["To"].addresses] == recipients
