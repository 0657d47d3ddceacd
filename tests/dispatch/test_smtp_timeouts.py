"""Every wait of an SMTP connection is bounded (notifications/adapters/smtp_connect.py): a
server that goes silent or stops reading ends in a failure of class timeout after the
configured time, the answer to a message's end has a wait of its own, and no wait outlives the
delivery's deadline (the claim's lease). Real sockets on loopback."""

import contextlib
import smtplib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from notifications.adapters.base import delivery_deadline
from notifications.adapters.email import classify, email_send_test
from notifications.adapters.smtp_connect import AuthGate, ConnectSettings, NoGreeting, SmtpConnection, smtp_open
from notifications.models import SmtpConfiguration
from tests.dispatch.test_failure_classes import failure_of, plain_config
from tests.support.smtp import serving_port, silent_port


@contextlib.contextmanager
def mute_after_ehlo(*, trickle: bool = False) -> Iterator[int]:
    """A server that greets, answers EHLO (advertising PIPELINING) and then answers nothing,
    keeping the connection open until the test ends: it reads nothing more, or with
    ``trickle`` 64 KiB every 0.3 s (never long enough for a 1 s timeout between two
    pieces) until the test ends. Yields its port."""

    def session(conn: socket.socket, stopping: threading.Event) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall(b"220 mute ESMTP\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            line += conn.recv(1)
        conn.sendall(b"250-mute\r\n250 PIPELINING\r\n")
        while trickle and not stopping.is_set():
            conn.recv(65536)
            stopping.wait(0.3)

    with serving_port(session) as port:
        yield port


def opened(config: SmtpConfiguration) -> SmtpConnection:
    return smtp_open(ConnectSettings.of(config), context=None, gate=AuthGate(), classify=classify)


def test_a_server_silent_after_ehlo_is_class_timeout_after_the_configured_time():
    with mute_after_ehlo() as port:
        started = time.monotonic()
        error = failure_of(plain_config(port, timeout_seconds=1))
        elapsed = time.monotonic() - started
    assert error.failure_class == "timeout"
    assert "timed out" in error.message
    assert 0.9 <= elapsed < 5


def test_a_server_that_stops_reading_is_class_timeout_when_sending():
    with mute_after_ehlo() as port:
        smtp = opened(plain_config(port, timeout_seconds=1))
        started = time.monotonic()
        with pytest.raises(smtplib.SMTPServerDisconnected) as caught:
            smtp.exchange(b"x" * (64 << 20))  # far more than both sides' socket buffers hold
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="DATA").failure_class == "timeout"
    assert elapsed < 5


def test_a_server_reading_a_large_message_slowly_is_class_timeout_after_the_configured_time():
    """The timeout bounds the whole write, not each piece the server takes (else the trickle
    would hold the message past the claim's lease)."""
    with mute_after_ehlo(trickle=True) as port:
        smtp = opened(plain_config(port, timeout_seconds=1))
        started = time.monotonic()
        with pytest.raises(smtplib.SMTPServerDisconnected) as caught:
            smtp.exchange(b"x" * (64 << 20))
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="DATA").failure_class == "timeout"
    assert elapsed < 5


def test_the_answer_to_a_message_end_may_take_the_data_timeout_and_later_replies_the_timeout_again(smtp_server):
    """The wait for the answer to the final dot is ``data_timeout_seconds``; the connection's
    own timeout is back for what follows on the same connection."""
    smtp_server.behave("accept", delay_seconds=2.5)
    smtp = opened(plain_config(smtp_server.port, timeout_seconds=1, data_timeout_seconds=5))
    try:
        assert smtp.mail("outbox@example.com")[0] == 250
        assert smtp.rcpt("op1@example.com")[0] == 250
        assert smtp.exchange("DATA\r\n", 1)[0][0] == 354
        started = time.monotonic()
        ((code, _),) = smtp.exchange(b"Subject: slow\r\n\r\nanswered after 2.5 s\r\n.\r\n", 1, wait=5)
        assert code == 250 and time.monotonic() - started >= 2.4
        assert smtp.exchange("NOOP\r\n", 1)[0][0] == 250
        assert smtp.sock is not None and smtp.sock.gettimeout() == 1.0
    finally:
        smtp.quit()


def test_a_delivery_whose_answer_comes_within_the_data_timeout_is_delivered(smtp_server):
    smtp_server.behave("accept", delay_seconds=2.5)
    result = email_send_test(
        config=plain_config(smtp_server.port, timeout_seconds=1, data_timeout_seconds=5), to="op1@example.com"
    )
    assert [entry["outcome"] for entry in result.targets] == ["delivered"]


def test_a_server_hanging_after_the_message_fails_after_the_data_timeout_not_the_timeout(smtp_server):
    smtp_server.behave("hang", hang_seconds=30)
    started = time.monotonic()
    error = failure_of(plain_config(smtp_server.port, timeout_seconds=1, data_timeout_seconds=3))
    elapsed = time.monotonic() - started
    assert error.failure_class == "timeout" and error.ambiguous
    assert 2.9 <= elapsed < 6


def test_no_command_waits_past_the_delivery_deadline():
    # The other steps' timeout is 30 s; the delivery must be over within 1 s.
    with mute_after_ehlo() as port:
        started = time.monotonic()
        with delivery_deadline(time.monotonic() + 1):
            smtp = opened(plain_config(port, timeout_seconds=30))
            with pytest.raises(smtplib.SMTPServerDisconnected) as caught:
                smtp.exchange("NOOP\r\n", 1)
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="NOOP").failure_class == "timeout"
    assert elapsed < 3


def test_the_greeting_never_waits_past_the_delivery_deadline():
    with silent_port() as port:
        started = time.monotonic()
        with delivery_deadline(time.monotonic() + 1), pytest.raises(NoGreeting) as caught:
            opened(plain_config(port, greeting_timeout_seconds=30))
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="connect").failure_class == "timeout"
    assert elapsed < 3
