"""The email adapter's conversation runs two ways (notifications/adapters/smtp_steps.py): blocking
on the caller's thread, and many at a time on one thread with non-blocking sockets (how a
dispatch pass delivers email). Whatever a server does, both ways must come to the same outcome,
and the loop must keep its own promises: many deliveries at once on one thread, each in its own
context, a failure of one never stopping the others, and a bug never leaving a delivery waiting.
Real sockets on loopback: aiosmtpd, and scripted servers for what aiosmtpd will not do."""

import contextlib
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from notifications.adapters.base import DeliveryError, delivery_deadline, delivery_time_left
from notifications.adapters.email import EmailSession, EmailTargets
from notifications.adapters.smtp_steps import Blocking, StepLoop
from notifications.models import Notification, SmtpConfiguration
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.dispatch.test_failure_classes import plain_config
from tests.support.smtp import SmtpServer, serving_port

TARGETS = ["op1@example.com", "op2@example.com"]


def notification(subject: str = "pump 3 tripped") -> Notification:
    return Notification(
        notification_id=uuid.uuid4(), subject=subject, body="Pump 3 tripped at 12:00.\n", type="email", list_name="ops"
    )


def outcome(deliver: Any) -> tuple[Any, ...]:
    """What a delivery came to, comparable across the two ways of running it."""
    try:
        result = deliver()
    except DeliveryError as error:
        return ("error", error.message, error.failure_class, error.targets, error.ambiguous, error.outcome_unknown)
    return ("delivered", result.targets, result.warning, result.detail)


def blocking(config: SmtpConfiguration, row: Notification, targets: list[str]) -> tuple[Any, ...]:
    session = EmailSession(config)
    try:
        return outcome(lambda: session.deliver(row, EmailTargets(targets)))
    finally:
        session.close()


def looped(
    config: SmtpConfiguration, rows: list[Notification], targets: list[str], *, size: int = 4
) -> list[tuple[Any, ...]]:
    """``rows`` delivered through one StepLoop turned on this thread; outcomes in row order."""
    session = EmailSession(config)
    results: dict[int, tuple[Any, BaseException | None]] = {}
    loop = StepLoop(size=size, done=lambda key, value, error: results.__setitem__(key, (value, error)))
    try:
        for index, row in enumerate(rows):
            loop.submit(index, session.deliver_steps, row, EmailTargets(targets))
        while loop.busy:
            loop.turn(None)
    finally:
        loop.close()
        session.close()

    def replay(index: int) -> Any:
        value, error = results[index]
        if error is not None:
            raise error
        return value

    return [outcome(lambda index=index: replay(index)) for index in range(len(rows))]


@contextlib.contextmanager
def scripted(
    *,
    mail: bytes | None = b"250 2.1.0 ok\r\n",
    end: bytes | None = b"250 2.0.0 queued\r\n",
    close_after_354: bool = False,
    bytewise: bool = False,
    content: str = "read",
) -> Iterator[int]:
    """A server that speaks SMTP with PIPELINING and answers MAIL FROM with ``mail`` (None:
    never answers), the end of a message with ``end`` (None: never answers; empty: closes the
    connection; without a line end: closes after it), optionally closing right after its 354, and writing every reply a byte at a
    time (``bytewise``: each read of the client's gets a piece of a line). ``content``: how the
    message is read after the 354: ``read`` at once, ``slowly`` (64 KiB at a time, a millisecond's
    pause after each), or ``never``. Yields its port."""

    def session(conn: socket.socket, stopping: threading.Event) -> None:
        if content == "never":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

        def say(data: bytes) -> None:
            if not bytewise:
                conn.sendall(data)
                return
            for index in range(len(data)):
                conn.sendall(data[index : index + 1])
                time.sleep(0.0005)

        reader = conn.makefile("rb")
        say(b"220 scripted ESMTP\r\n")
        while line := reader.readline():
            command = line[:4].upper()
            if command == b"EHLO":
                say(b"250-scripted\r\n250-SIZE 1000000\r\n250 PIPELINING\r\n")
            elif command == b"MAIL":
                if mail is None:
                    stopping.wait(10)
                    return
                say(mail)
            elif command == b"RCPT":
                say(b"250 2.1.5 ok\r\n")
            elif command == b"DATA":
                say(b"354 go ahead\r\n")
                if close_after_354:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                if content == "never":
                    stopping.wait(10)
                    return
                if content == "slowly":
                    tail = b""
                    while not tail.endswith(b"\r\n.\r\n"):
                        piece = reader.read1(65536)
                        if not piece:
                            return
                        tail = (tail + piece)[-5:]
                        time.sleep(0.001)
                else:
                    while reader.readline() not in (b".\r\n", b""):
                        pass
                if end is None:
                    stopping.wait(10)
                    return
                if not end:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                say(end)
                if not end.endswith(b"\n"):  # a line cut short: the server goes
                    conn.shutdown(socket.SHUT_RDWR)
                    return
            elif command == b"QUIT":
                say(b"221 bye\r\n")
                return
            else:
                say(b"250 ok\r\n")

    with serving_port(session) as port:
        yield port


SCRIPTS = {
    "accepted, every reply in pieces and the last one multi-line": {
        "end": b"250-2.0.0 first line\r\n250 2.0.0 queued as 42\r\n",
        "bytewise": True,
    },
    "sender refused": {"mail": b"553 5.7.1 sender not allowed\r\n"},
    "closed after the 354": {"close_after_354": True},
    "closed after the whole message": {"end": b""},
    "an unreadable answer to the message": {"end": b"xyz what\r\n"},
    "an answer line too long": {"end": b"250 " + b"x" * 9000 + b"\r\n"},
    "a last line without its line end before closing": {"end": b"250 2.0.0 queued"},
    "a temporary refusal of the message": {"end": b"451 4.3.0 try again later\r\n"},
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_the_loop_and_the_blocking_way_come_to_the_same_outcome(script):
    with scripted(**script) as port:
        config = plain_config(port)
        row = notification()
        one_way = blocking(config, row, TARGETS)
        (other_way,) = looped(config, [row], TARGETS)
    assert other_way == one_way


def test_a_server_silent_after_ehlo_times_out_after_the_configured_time_in_the_loop():
    with scripted(mail=None) as port:
        started = time.monotonic()
        ((kind, _message, failure_class, *_),) = looped(
            plain_config(port, timeout_seconds=1), [notification()], TARGETS
        )
        elapsed = time.monotonic() - started
    assert (kind, failure_class) == ("error", "timeout")
    assert 0.9 <= elapsed < 5, elapsed


def test_no_answer_to_the_message_is_ambiguous_after_the_data_timeout_not_the_timeout_in_the_loop():
    with scripted(end=None) as port:
        config = plain_config(port, timeout_seconds=0.3, data_timeout_seconds=1.5)
        started = time.monotonic()
        ((kind, _message, failure_class, targets, ambiguous, _),) = looped(config, [notification()], TARGETS)
        elapsed = time.monotonic() - started
    assert (kind, failure_class, ambiguous) == ("error", "timeout", True)
    assert {entry["outcome"] for entry in targets} == {"ambiguous"}
    assert 1.4 <= elapsed < 5, elapsed


def big(megabytes: int) -> Notification:
    row = notification("a large report")
    row.body = "A line of a large report, long enough to count.\n" * (megabytes * 21_000)
    return row


def test_a_large_message_to_a_slow_reader_goes_out_in_pieces_in_the_loop(monkeypatch):
    interests: list[int] = []
    interest = StepLoop._interest

    def spying(self: StepLoop, run: Any, events: int) -> None:
        interests.append(events)
        interest(self, run, events)

    monkeypatch.setattr(StepLoop, "_interest", spying)
    with scripted(content="slowly") as port:
        config = plain_config(port, timeout_seconds=5, data_timeout_seconds=20)
        ((kind, targets, *_),) = looped(config, [big(8)], TARGETS)
    assert kind == "delivered"
    assert [entry["outcome"] for entry in targets] == ["delivered", "delivered"]
    assert selectors.EVENT_WRITE in interests  # the socket took the message a piece at a time


def test_a_server_that_stops_reading_the_message_times_out_and_the_recipients_are_owed_it_in_the_loop():
    with scripted(content="never") as port:
        started = time.monotonic()
        ((kind, _message, failure_class, targets, ambiguous, _),) = looped(
            plain_config(port, timeout_seconds=1), [big(8)], TARGETS
        )
        elapsed = time.monotonic() - started
    assert (kind, failure_class, ambiguous) == ("error", "timeout", False)
    assert {entry["outcome"] for entry in targets} == {"deferred"}  # never handed over: sent again
    assert 0.9 <= elapsed < 5, elapsed


def test_one_thread_delivers_many_at_once_over_as_many_connections():
    with SmtpServer(pipelining=True) as server:
        server.behave("accept", delay_seconds=0.2)  # every message answered 0.2 s after its end
        threads_before = threading.active_count()
        started = time.monotonic()
        outcomes = looped(
            plain_config(server.port, timeout_seconds=5), [notification() for _ in range(24)], TARGETS, size=6
        )
        elapsed = time.monotonic() - started
        assert [kind for kind, *_ in outcomes] == ["delivered"] * 24
        assert server.count == 24
        assert server.connections <= 6
    # 24 messages at 0.2 s each: 4.8 s one after another, 0.8 s six at a time.
    assert elapsed < 3, elapsed
    assert threading.active_count() <= threads_before  # the connections' helper threads are gone


def test_encrypted_connections_are_reused_across_messages_in_the_loop(monkeypatch):
    with SmtpServer(security="starttls", pipelining=True) as server:
        monkeypatch.setenv("SSL_CERT_FILE", server.ca_file)
        config = plain_config(server.port, security="starttls", timeout_seconds=5)
        outcomes = looped(config, [notification() for _ in range(12)], TARGETS, size=3)
        assert [kind for kind, *_ in outcomes] == ["delivered"] * 12
        assert server.count == 12
        assert server.connections <= 3


def test_each_run_keeps_its_own_context_across_its_steps():
    seen: dict[str, list[float | None]] = {"a": [], "b": []}

    def steps(name: str, deadline: float):
        with delivery_deadline(deadline):
            for _ in range(3):
                yield Blocking(lambda: time.sleep(0.01))
                left = delivery_time_left()
                seen[name].append(None if left is None else round(deadline - time.monotonic() - left))
        return name

    done: list[tuple[Any, Any, BaseException | None]] = []
    loop = StepLoop(size=2, done=lambda *item: done.append(item))
    far = time.monotonic() + 1000
    loop.submit("a", steps, "a", far)
    loop.submit("b", steps, "b", far + 500)
    while loop.busy:
        loop.turn(None)
    loop.close()
    assert sorted(value for _, value, _ in done) == ["a", "b"]
    # Each saw its own deadline at every step, though the two ran interleaved.
    assert seen == {"a": [0, 0, 0], "b": [0, 0, 0]}
    assert delivery_time_left() is None  # nothing leaked into the owner's context


def test_a_run_that_raises_fails_alone():
    def good(n: int):
        yield Blocking(lambda: n)
        return n

    def bad():
        yield Blocking(lambda: None)
        raise RuntimeError("a bug in one delivery")

    def broken_factory():
        raise ValueError("not even a generator")

    done: dict[Any, tuple[Any, BaseException | None]] = {}
    loop = StepLoop(size=2, done=lambda key, value, error: done.__setitem__(key, (value, error)))
    loop.submit(1, good, 1)
    loop.submit("bad", bad)
    loop.submit("factory", broken_factory)
    loop.submit(2, good, 2)
    while loop.busy:
        loop.turn(None)
    loop.close()
    assert done[1] == (1, None) and done[2] == (2, None)
    assert isinstance(done["bad"][1], RuntimeError)
    assert isinstance(done["factory"][1], ValueError)


def test_a_bug_in_the_loop_itself_fails_every_delivery_rather_than_leaving_it_waiting(monkeypatch):
    with scripted(end=b"250 2.0.0 queued\r\n") as port:
        session = EmailSession(plain_config(port))
        done: dict[Any, tuple[Any, BaseException | None]] = {}
        loop = StepLoop(size=1, done=lambda key, value, error: done.__setitem__(key, (value, error)))

        def ready(*args: Any) -> None:
            raise AssertionError("a bug while moving a run")

        monkeypatch.setattr(StepLoop, "_ready", ready)
        loop.submit("running", session.deliver_steps, notification(), EmailTargets(TARGETS))
        loop.submit("queued", session.deliver_steps, notification(), EmailTargets(TARGETS))
        with pytest.raises(AssertionError):
            while loop.busy:
                loop.turn(None)
        loop.close()
        session.close()
    assert set(done) == {"running", "queued"}
    assert all(isinstance(error, AssertionError) for _, error in done.values())
    assert not loop.busy


def delivering_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each email delivery starts on, in order (filled as they start)."""
    names: list[str] = []
    deliver_steps = EmailSession.deliver_steps

    def spying(self: EmailSession, *args: Any) -> Any:
        names.append(threading.current_thread().name)
        return (yield from deliver_steps(self, *args))

    monkeypatch.setattr(EmailSession, "deliver_steps", spying)
    return names


@pytest.mark.usefixtures("operators_list")
def test_a_pass_delivers_email_on_its_own_thread(smtp_server, smtp_config, monkeypatch):
    names = delivering_threads(monkeypatch)
    rows = queue(12)
    report = run_pass(concurrency=4)
    assert report.delivered == 12
    assert smtp_server.count == 12
    assert all(fresh(row).status == "Delivered" for row in rows)
    assert names == [threading.current_thread().name] * 12


@pytest.mark.usefixtures("operators_list")
def test_with_the_loop_off_a_pass_delivers_email_on_threads(smtp_server, smtp_config, monkeypatch):
    names = delivering_threads(monkeypatch)
    rows = queue(8)
    with override_settings(OUTBOX_DELIVERY_LOOP=False):
        report = run_pass(concurrency=4)
    assert report.delivered == 8
    assert smtp_server.count == 8
    assert all(fresh(row).status == "Delivered" for row in rows)
    assert len(names) == 8 and all(name.startswith("deliver_") for name in names)
