"""The email adapter against servers that misbehave the way real ones can, scripted on a socket
on loopback (aiosmtpd will not do these): every recipient gets the outcome the server's
behaviour calls for, every wait ends after the configured time, and every connection the
adapter opened is closed once its session is over, whatever went wrong."""

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import EmailSession, EmailTargets
from notifications.models import Notification, SmtpConfiguration
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass
from tests.dispatch.test_failure_classes import plain_config
from tests.support.smtp import SmtpServer, serving_port

TARGETS = ["op1@example.com", "op2@example.com"]


def notification(subject: str = "pump 3 tripped") -> Notification:
    return Notification(
        notification_id=uuid.uuid4(), subject=subject, body="Pump 3 tripped at 12:00.\n", type="email", list_name="ops"
    )


def outcome(config: SmtpConfiguration, row: Notification, targets: list[str]) -> tuple[Any, ...]:
    """What one delivery through a session of its own came to (the session closed after)."""
    session = EmailSession(config)
    try:
        result = session.deliver(row, EmailTargets(targets))
    except DeliveryError as error:
        outcomes = [entry["outcome"] for entry in error.targets]
        return ("error", error.failure_class, outcomes, error.ambiguous, error.message)
    finally:
        session.close()
    return ("delivered", [entry["outcome"] for entry in result.targets], result.detail.get("smtp_code"))


@dataclass
class Connections:
    """What a scripted server saw of its connections: how many it accepted, and how many the
    client closed (its end of the stream, before the test ended)."""

    accepted: int = 0
    closed_by_client: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def all_closed(self, timeout: float = 2.0) -> bool:
        """Every accepted connection closed by the client (waiting up to ``timeout``)."""
        with self.changed:
            return self.changed.wait_for(lambda: self.closed_by_client == self.accepted, timeout)


@contextlib.contextmanager
def scripted(
    *,
    mail: bytes | None = b"250 2.1.0 ok\r\n",
    end: bytes | None = b"250 2.0.0 queued\r\n",
    close_after_354: bool = False,
    bytewise: bool = False,
    content: str = "read",
    greeting_after: float = 0.0,
) -> Iterator[tuple[int, Connections]]:
    """A server that speaks SMTP with PIPELINING, greets ``greeting_after`` seconds after the
    connection, and answers MAIL FROM with ``mail`` (None: never answers), the end of a message
    with ``end`` (None: never answers; empty: closes the connection; without a line end: closes
    after it), optionally closing right after its 354, and writing every reply a byte at a time
    (``bytewise``: each read of the client's gets a piece of a line). ``content``: how the
    message is read after the 354: ``read`` at once, ``slowly`` (64 KiB at a time, a
    millisecond's pause after each), or ``stalled`` (nothing for 1.5 s, longer than the
    client's timeout, then the rest). Yields its port and what it saw of its connections."""
    seen = Connections()

    def until_closed(conn: socket.socket, stopping: threading.Event) -> None:
        """Wait for the client to close the connection (or the port to close)."""
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass
        if not stopping.is_set():
            with seen.changed:
                seen.closed_by_client += 1
                seen.changed.notify_all()

    def session(conn: socket.socket, stopping: threading.Event) -> None:
        with seen.changed:
            seen.accepted += 1
        try:
            converse(conn, stopping)
        finally:
            until_closed(conn, stopping)

    def converse(conn: socket.socket, stopping: threading.Event) -> None:
        if content == "stalled":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

        def say(data: bytes) -> None:
            if not bytewise:
                conn.sendall(data)
                return
            for index in range(len(data)):
                conn.sendall(data[index : index + 1])
                time.sleep(0.0005)

        reader = conn.makefile("rb")
        if greeting_after and not greeting_awaited(conn, greeting_after):
            return
        say(b"220 scripted ESMTP\r\n")
        while line := reader.readline():
            command = line[:4].upper()
            if command == b"EHLO":
                say(b"250-scripted\r\n250-SIZE 1000000\r\n250 PIPELINING\r\n")
            elif command == b"MAIL":
                if mail is None:
                    return  # silent from now on
                say(mail)
            elif command == b"RCPT":
                say(b"250 2.1.5 ok\r\n")
            elif command == b"DATA":
                say(b"354 go ahead\r\n")
                if close_after_354:
                    conn.shutdown(socket.SHUT_WR)
                    return
                if content == "stalled" and stopping.wait(1.5):
                    return
                if not read_message(reader, slowly=content == "slowly"):
                    return
                if end is None:
                    return  # silent from now on
                if not end:
                    conn.shutdown(socket.SHUT_WR)
                    return
                say(end)
                if not end.endswith(b"\n"):  # a line cut short: the server goes
                    conn.shutdown(socket.SHUT_WR)
                    return
            elif command == b"QUIT":
                say(b"221 bye\r\n")
                return
            else:
                say(b"250 ok\r\n")

    with serving_port(session) as port:
        yield port, seen


def greeting_awaited(conn: socket.socket, seconds: float) -> bool:
    """Wait ``seconds`` before greeting; False when the client went (or the port closed) first."""
    conn.settimeout(seconds)
    try:
        return bool(conn.recv(1, socket.MSG_PEEK))
    except TimeoutError:
        return True
    finally:
        conn.settimeout(None)


def read_message(reader: Any, *, slowly: bool) -> bool:
    """Read a message up to its final dot; False when the client went first."""
    if not slowly:
        while (line := reader.readline()) != b".\r\n":
            if not line:
                return False
        return True
    tail = b""
    while not tail.endswith(b"\r\n.\r\n"):
        piece = reader.read1(65536)
        if not piece:
            return False
        tail = (tail + piece)[-5:]
        time.sleep(0.001)
    return True


# What a server does, and what the delivery must come to: (kind, failure class, every target's
# outcome, ambiguous).
SCRIPTS: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {
    "accepted, every reply in pieces and the last one multi-line": (
        {"end": b"250-2.0.0 first line\r\n250 2.0.0 queued as 42\r\n", "bytewise": True},
        ("delivered", ["delivered", "delivered"], 250),
    ),
    "a last line without its line end before closing": (
        {"end": b"250 2.0.0 queued"},
        ("delivered", ["delivered", "delivered"], 250),
    ),
    # The server cannot have the message: the recipients are owed it (retried).
    "sender refused": (
        {"mail": b"553 5.7.1 sender not allowed\r\n"},
        ("error", "configuration", ["deferred"] * 2, False),
    ),
    "a temporary refusal of the message": (
        {"end": b"451 4.3.0 try again later\r\n"},
        ("error", "provider_error", ["deferred"] * 2, False),
    ),
    # The whole message was sent and no usable answer came: the server may have it.
    "closed after the 354 (the message still written)": (
        {"close_after_354": True},
        ("error", "connection", ["ambiguous"] * 2, True),
    ),
    "closed after the whole message": ({"end": b""}, ("error", "connection", ["ambiguous"] * 2, True)),
    "an unreadable answer to the message": (
        {"end": b"xyz what\r\n"},
        ("error", "provider_error", ["ambiguous"] * 2, True),
    ),
    "an answer line too long": ({"end": b"250 " + b"x" * 9000 + b"\r\n"}, ("error", None, ["ambiguous"] * 2, True)),
}


@pytest.mark.parametrize(("script", "expected"), SCRIPTS.values(), ids=SCRIPTS.keys())
def test_each_recipient_gets_the_outcome_the_servers_behaviour_calls_for_and_no_connection_is_left_open(
    script, expected
):
    with scripted(**script) as (port, seen):
        came_to = outcome(plain_config(port), notification(), TARGETS)
        assert seen.all_closed(), f"{seen.accepted} connections, {seen.closed_by_client} closed"
    compared = came_to[: len(expected)]
    if expected[1] is None:  # the class of an unreadable reply is the classifier's to say
        compared, expected = compared[:1] + compared[2:], expected[:1] + expected[2:]
    assert compared == expected, came_to


def test_a_server_silent_after_ehlo_times_out_after_the_configured_time_and_the_connection_is_closed():
    with scripted(mail=None) as (port, seen):
        started = time.monotonic()
        kind, failure_class, targets, ambiguous, _ = outcome(
            plain_config(port, timeout_seconds=1), notification(), TARGETS
        )
        elapsed = time.monotonic() - started
        assert seen.all_closed()
    assert (kind, failure_class, targets, ambiguous) == ("error", "timeout", ["deferred"] * 2, False)
    assert 0.9 <= elapsed < 5, elapsed


def test_no_answer_to_the_message_is_ambiguous_after_the_data_timeout_not_the_timeout():
    with scripted(end=None) as (port, seen):
        config = plain_config(port, timeout_seconds=0.3, data_timeout_seconds=1.5)
        started = time.monotonic()
        kind, failure_class, targets, ambiguous, _ = outcome(config, notification(), TARGETS)
        elapsed = time.monotonic() - started
        assert seen.all_closed()
    assert (kind, failure_class, targets, ambiguous) == ("error", "timeout", ["ambiguous"] * 2, True)
    assert 1.4 <= elapsed < 5, elapsed


def big(megabytes: int) -> Notification:
    row = notification("a large report")
    row.body = "A line of a large report, long enough to count.\n" * (megabytes * 21_000)
    return row


def test_a_large_message_to_a_slow_reader_is_delivered():
    with scripted(content="slowly") as (port, _):
        config = plain_config(port, timeout_seconds=5, data_timeout_seconds=20)
        assert outcome(config, big(8), TARGETS) == ("delivered", ["delivered", "delivered"], 250)


def test_a_server_that_stops_reading_the_message_times_out_and_the_recipients_are_owed_it(monkeypatch):
    # The server cannot see this connection end before it reads what was written (its window
    # is shut): the client's side is looked at instead, every connection the session opened.
    opened: list[Any] = []
    connect = EmailSession._connect

    def connecting(self: EmailSession) -> Any:
        opened.append(connect(self))
        return opened[-1]

    monkeypatch.setattr(EmailSession, "_connect", connecting)
    with scripted(content="stalled") as (port, _):
        started = time.monotonic()
        kind, failure_class, targets, ambiguous, _ = outcome(plain_config(port, timeout_seconds=1), big(8), TARGETS)
        elapsed = time.monotonic() - started
    assert (kind, failure_class, ambiguous) == ("error", "timeout", False)
    assert targets == ["deferred"] * 2  # never handed over: sent again
    assert 0.9 <= elapsed < 5, elapsed
    assert len(opened) == 1 and opened[0].sock is None  # closed


def test_a_greeting_slower_than_the_timeout_is_waited_for_within_the_greeting_timeout():
    # Relays delay their greeting on purpose (postscreen, greet_pause): the greeting has its
    # own wait, not the other commands' one second.
    with scripted(greeting_after=1.5) as (port, _):
        config = plain_config(port, timeout_seconds=1, greeting_timeout_seconds=5)
        assert outcome(config, notification(), TARGETS) == ("delivered", ["delivered", "delivered"], 250)


def test_a_greeting_later_than_the_greeting_timeout_fails_as_a_timeout_with_a_hint():
    with scripted(greeting_after=10) as (port, seen):
        started = time.monotonic()
        kind, failure_class, targets, _, message = outcome(
            plain_config(port, timeout_seconds=5, greeting_timeout_seconds=1), notification(), TARGETS
        )
        elapsed = time.monotonic() - started
        assert seen.all_closed()
    assert (kind, failure_class, targets) == ("error", "timeout", ["deferred"] * 2)
    assert "no greeting within 1 s" in message and "security=tls" in message
    assert 0.9 <= elapsed < 5, elapsed


@pytest.mark.usefixtures("operators_list")
def test_the_wait_for_the_greeting_never_outlives_the_claim(settings, db):
    # A 4 s lease: the greeting's 30 s wait ends before the lease does.
    settings.OUTBOX_LEASE_SECONDS = 4
    with scripted(greeting_after=30) as (port, _):
        SmtpConfiguration.objects.create(
            host="127.0.0.1", port=port, security="none", from_address="outbox@example.com", greeting_timeout_seconds=30
        )
        (row,) = queue()
        started = time.monotonic()
        run_pass()
        elapsed = time.monotonic() - started
    row = fresh(row)
    assert row.status == Notification.Status.RETRYING and row.claimed_by == ""
    assert row.attempts.get().failure_class == "timeout"
    assert elapsed < 4, elapsed


@pytest.mark.usefixtures("operators_list")
def test_a_pass_delivers_on_as_many_connections_at_once_as_it_has_threads(db):
    with SmtpServer(pipelining=True) as server:
        server.behave("accept", delay_seconds=0.2)  # every message answered 0.2 s after its end
        configure_smtp(server, timeout_seconds=5)
        rows = queue(24)
        started = time.monotonic()
        report = run_pass(concurrency=6)
        elapsed = time.monotonic() - started
        assert report.delivered == 24 and server.count == 24
        assert server.connections <= 6  # each thread reuses its connection
    assert all(fresh(row).status == Notification.Status.DELIVERED for row in rows)
    # 24 messages at 0.2 s each: 4.8 s one after another, 0.8 s six at a time.
    assert elapsed < 3, elapsed


@pytest.mark.usefixtures("operators_list")
def test_encrypted_connections_are_reused_across_the_messages_of_a_pass(db, monkeypatch):
    with SmtpServer(security="starttls", pipelining=True) as server:
        monkeypatch.setenv("SSL_CERT_FILE", server.ca_file)
        configure_smtp(server, security="starttls", timeout_seconds=5)
        queue(12)
        assert run_pass(concurrency=3).delivered == 12
        assert server.count == 12
        assert server.connections <= 3
