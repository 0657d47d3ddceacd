"""Plaintext SMTP connections, once set up, wait with the kernel's socket timeouts on a blocking
socket (notifications/adapters/smtp_connect.py, ``transfer_mode``): a server that goes silent or
stops reading still ends in a failure of class timeout after the configured time, exactly as
with Python's own timeouts; TLS connections keep Python's timeouts. Real sockets on loopback."""

import contextlib
import smtplib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from notifications.adapters.email import classify, email_send_test
from notifications.adapters.smtp_connect import AuthGate, ConnectSettings, reply_wait, smtp_open
from notifications.models import SmtpConfiguration
from tests.dispatch.test_failure_classes import failure_of, plain_config
from tests.support.smtp import serving_port


@contextlib.contextmanager
def mute_after_ehlo(*, trickle: bool = False) -> Iterator[int]:
    """A server that greets, answers EHLO (advertising PIPELINING) and then answers nothing,
    keeping the connection open until the test ends: it reads nothing more, or with
    ``trickle`` 64 KiB every 0.3 s (never long enough for a 1 s timeout between two
    pieces) for at most 20 s. Yields its port."""

    def session(conn: socket.socket, stopping: threading.Event) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall(b"220 mute ESMTP\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            line += conn.recv(1)
        conn.sendall(b"250-mute\r\n250 PIPELINING\r\n")
        until = time.monotonic() + 20
        while trickle and not stopping.is_set() and time.monotonic() < until:
            conn.recv(65536)
            time.sleep(0.3)

    with serving_port(session) as port:
        yield port


def opened(config: SmtpConfiguration) -> smtplib.SMTP:
    return smtp_open(ConnectSettings.of(config), context=None, gate=AuthGate(), classify=classify)


def receive_timeout(sock: socket.socket | None) -> float:
    assert sock is not None
    seconds, micros = struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
    return seconds + micros / 1_000_000


def test_a_plaintext_connection_waits_in_the_kernel_once_set_up(smtp_server):
    smtp = opened(plain_config(smtp_server.port, timeout_seconds=7))
    try:
        assert smtp.sock is not None and smtp.sock.gettimeout() is None  # blocking: no poll before each call
        assert receive_timeout(smtp.sock) == 7.0
        assert smtp.noop()[0] == 250  # and it still speaks SMTP
    finally:
        smtp.quit()


def test_a_tls_connection_keeps_python_timeouts(db, monkeypatch):
    from tests.support.smtp import SmtpServer

    with SmtpServer(security="tls") as server:
        monkeypatch.setenv("SSL_CERT_FILE", server.ca_file)
        config = plain_config(server.port, security="tls", timeout_seconds=7)
        smtp = smtp_open(ConnectSettings.of(config), context=None, gate=AuthGate(), classify=classify)
        try:
            assert smtp.sock is not None and smtp.sock.gettimeout() == 7.0
            assert receive_timeout(smtp.sock) == 0.0
        finally:
            smtp.quit()


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
            smtp.send(b"x" * (64 << 20))  # far more than both sides' socket buffers hold
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="DATA").failure_class == "timeout"
    assert elapsed < 10


def test_a_server_reading_a_large_message_slowly_is_class_timeout_after_the_configured_time():
    """The kernel's send timeout restarts whenever the server takes a little; a large write
    is bounded as a whole (else the trickle would hold the message past the claim's lease)."""
    with mute_after_ehlo(trickle=True) as port:
        smtp = opened(plain_config(port, timeout_seconds=1))
        started = time.monotonic()
        with pytest.raises(smtplib.SMTPServerDisconnected) as caught:
            smtp.send(b"x" * (64 << 20))
        elapsed = time.monotonic() - started
    assert classify(caught.value, stage="DATA").failure_class == "timeout"
    assert elapsed < 5


def test_the_answer_to_a_message_end_may_take_the_data_timeout_and_later_replies_the_timeout_again(smtp_server):
    """The wait for the answer to the final dot is ``data_timeout_seconds``; the connection's
    own timeout is back for what follows on the same connection."""
    smtp_server.behave("accept", delay_seconds=2.5)
    config = plain_config(smtp_server.port, timeout_seconds=1, data_timeout_seconds=5)
    smtp = opened(config)
    try:
        assert smtp.mail("outbox@example.com")[0] == 250
        assert smtp.rcpt("op1@example.com")[0] == 250
        started = time.monotonic()
        with reply_wait(smtp, 5):
            code, _ = smtp.data(b"Subject: slow\r\n\r\nanswered after 2.5 s\r\n")
        assert code == 250 and time.monotonic() - started >= 2.4
        assert receive_timeout(smtp.sock) == 1.0
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
