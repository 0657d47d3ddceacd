"""SMTP pipelining (RFC 2920) against a relay that follows a script, on a real socket: the
client writes MAIL FROM, its RCPT TOs and DATA before it reads a reply, judges each reply as it
would one at a time, and never sends the message's content unless a recipient was accepted
and DATA answered 354."""

import contextlib
import socket
import threading
from dataclasses import dataclass, field

import pytest

from notifications.models import DeliveryAttempt, Notification
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass

Status = Notification.Status


@dataclass
class ScriptedRelay:
    """A relay on 127.0.0.1 that advertises PIPELINING and answers nothing until it has read
    a transaction's commands up to DATA (a client waiting for each reply stalls there until its
    timeout and the commands never arrive together), then writes ``replies`` at once. After a
    354 it reads the content up to the final dot and answers ``after_data``; ``close_after``
    closes the connection once the commands are read, without a reply."""

    replies: list[str]
    after_data: str = "250 2.0.0 queued"
    close_after: bool = False
    host: str = "127.0.0.1"
    batches: list[list[str]] = field(default_factory=list)  # the commands read before each answer
    contents: list[bytes] = field(default_factory=list)  # content received up to a final dot
    incomplete: list[bytes] = field(default_factory=list)  # content cut off by the client

    def __post_init__(self) -> None:
        self.listener = socket.create_server((self.host, 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # a client gone mid-session ends it
                conn.settimeout(5)
                self._session(conn, conn.makefile("rb"))

    def _session(self, conn: socket.socket, reader) -> None:
        conn.sendall(b"220 relay ESMTP\r\n")
        while True:
            line = reader.readline()
            if not line:
                return
            verb = line[:4].upper()
            if verb == b"EHLO":
                conn.sendall(b"250-relay\r\n250 PIPELINING\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            elif verb == b"RSET":
                conn.sendall(b"250 OK\r\n")
            elif verb == b"MAIL":
                batch = [line.decode().strip()]
                while not batch[-1].upper().startswith("DATA"):
                    line = reader.readline()
                    if not line:
                        self.batches.append(batch)
                        return
                    batch.append(line.decode().strip())
                self.batches.append(batch)
                if self.close_after:
                    return
                conn.sendall("".join(f"{reply}\r\n" for reply in self.replies).encode())
                if self.replies[-1].startswith("354"):
                    content = b""
                    while not content.endswith(b"\r\n.\r\n"):
                        chunk = reader.readline()
                        if not chunk:
                            self.incomplete.append(content)
                            return
                        content += chunk
                    self.contents.append(content)
                    conn.sendall(f"{self.after_data}\r\n".encode())
            else:
                conn.sendall(b"502 not implemented\r\n")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay_with(db):
    relays = []

    def start(replies, **options):
        relay = ScriptedRelay(replies, **options)
        relays.append(relay)
        configure_smtp(relay)
        return relay

    yield start
    for relay in relays:
        relay.close()


@pytest.mark.usefixtures("operators_list")
def test_the_commands_go_together_and_the_message_is_delivered(relay_with):
    relay = relay_with(["250 OK", "250 OK", "250 OK", "354 go ahead"])
    (notification,) = queue()
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    (batch,) = relay.batches
    assert batch == [
        "mail FROM:<outbox@example.com>",
        "rcpt TO:<op1@example.com>",
        "rcpt TO:<op2@example.com>",
        "DATA",
    ]
    (content,) = relay.contents
    assert f"X-Notification-Id: {notification.pk}".encode() in content


@pytest.mark.usefixtures("operators_list")
def test_each_recipient_keeps_its_own_reply(relay_with):
    relay_with(["250 OK", "550 5.1.1 no such user", "250 OK", "354 go ahead"])
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    outcomes = {entry["target"]: (entry["outcome"], entry.get("smtp_code")) for entry in notification.resolved_targets}
    assert outcomes == {"op1@example.com": ("refused", 550), "op2@example.com": ("delivered", 250)}
    assert notification.targets_refused == 1


@pytest.mark.usefixtures("operators_list")
@pytest.mark.parametrize(
    ("replies", "shown"),
    [
        # The sender refused: every later command is refused too, DATA included (but not here).
        (["553 5.7.1 sender not allowed", "503 no sender", "503 no sender", "354 go ahead"], "553"),
        # Every recipient refused.
        (["250 OK", "550 5.1.1 no such user", "550 5.1.1 no such user", "354 go ahead"], "550"),
    ],
    ids=["sender-refused", "recipients-refused"],
)
def test_a_354_with_nothing_to_deliver_to_gets_no_content(relay_with, replies, shown):
    # A relay that should have answered DATA 503: the client drops the connection instead of
    # sending content, so there is nothing to deliver.
    relay = relay_with(replies)
    (notification,) = queue()
    run_pass()
    assert relay.contents == [] and relay.incomplete == [b""]
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert shown in notification.last_error


@pytest.mark.usefixtures("operators_list")
def test_a_connection_lost_before_any_reply_defers_every_recipient(relay_with):
    relay_with(["250 OK"], close_after=True)
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert {entry["outcome"] for entry in notification.resolved_targets} == {"deferred"}
    # No content was sent: the server cannot hold the message, so the attempt is not ambiguous.
    (attempt,) = DeliveryAttempt.objects.filter(notification=notification)
    assert attempt.outcome == DeliveryAttempt.Outcome.TRANSIENT
