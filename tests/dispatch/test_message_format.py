"""The message the email adapter composes parses back to exactly what was sent."""

from email import message_from_bytes
from email.policy import default

import pytest

from notifications.adapters.email_compose import MAX_LINE_BYTES, compose_message


def compose(subject="Pump 3 tripped", body="Overcurrent at 10:00.\nCheck the motor.", to=("a@example.com",)):
    return compose_message(
        from_address="outbox@example.com",
        to=list(to),
        subject=subject,
        body=body,
        message_id="<id@example.com>",
        notification_id="6f1c",
        date="Mon, 23 Nov 2026 10:00:00 +0000",
    )


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


def rich(**content):
    from notifications.adapters.email_compose import compose_rich
    from notifications.email_content import Attachment, EmailContent

    attachments = tuple(Attachment(**a) for a in content.pop("attachments", ()))
    return compose_rich(
        from_address="outbox@example.com",
        to=[],
        subject="Pumpe 3 ausgelöst",
        body="Überstrom.\n" + "y" * 3000,
        message_id="<id@example.com>",
        notification_id="6f1c",
        date="Mon, 23 Nov 2026 10:00:00 +0000",
        content=EmailContent(attachments=attachments, **content),
    )


def test_a_rich_message_keeps_every_line_within_the_limit_and_uses_crlf_only():
    raw = rich(
        html="<p>" + "z" * 5000 + "</p>",
        cc=("chief@example.com",),
        attachments=[{"filename": "n" * 250 + ".csv", "content_type": "text/csv", "content": b"a;b\n" * 5000}],
    )
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert all(len(line) <= MAX_LINE_BYTES for line in raw.split(b"\r\n"))
    message = message_from_bytes(raw, policy=default)
    assert message["Subject"] == "Pumpe 3 ausgelöst"
    (attachment,) = message.iter_attachments()
    filename = attachment.get_filename() or ""
    assert len(filename) == 120 and filename.endswith(".csv")


def test_no_visible_recipients_shows_the_undisclosed_recipients_group_in_both_composers():
    for raw in (compose(to=()), rich(html="<p>x</p>")):
        message = message_from_bytes(raw, policy=default)
        assert message["To"] == "undisclosed-recipients:;" and message["To"].addresses == ()


def test_the_date_header_is_the_current_second_written_once_a_second(monkeypatch):
    from datetime import UTC, datetime

    from notifications.adapters import email

    now = [datetime(2026, 1, 1, 0, 0, 0, 400_000, tzinfo=UTC)]
    monkeypatch.setattr(email.timezone, "now", lambda: now[0])
    assert email._date_header() == "Thu, 01 Jan 2026 00:00:00 +0000"
    now[0] = now[0].replace(microsecond=900_000)
    assert email._date_header() == "Thu, 01 Jan 2026 00:00:00 +0000"
    now[0] = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert email._date_header() == "Thu, 01 Jan 2026 00:00:01 +0000"


def test_a_message_is_dot_stuffed_only_where_a_line_starts_with_a_dot():
    from notifications.adapters.email import _dot_stuffed

    assert _dot_stuffed(b"Subject: x\r\n\r\nno dots here.\r\n") == b"Subject: x\r\n\r\nno dots here.\r\n.\r\n"
    assert _dot_stuffed(b".first\r\n.\r\nend") == b"..first\r\n..\r\nend\r\n.\r\n"
