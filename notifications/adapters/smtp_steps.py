"""SMTP conversations written once, run two ways: blocking on the caller's thread, or many at a
time on one thread with non-blocking sockets.

The email adapter writes a delivery as a generator that yields the network steps it needs (a
:class:`Exchange`: write some bytes, then read so many replies; or a :class:`Blocking` call
such as opening a connection) and is sent back each step's result, or has its exception thrown
in. The adapter's logic (which replies mean what, which recipients are owed what) exists once;
only the running differs:

* :func:`steps_run` runs one delivery on the calling thread with smtplib's own blocking calls
  (the console's "Send test email", and adapters' callers outside dispatch).
* :class:`StepLoop` runs a dispatch pass's email deliveries, up to its ``size`` at a time, on a
  single thread: every connection's socket is non-blocking and one ``epoll`` waits for all of
  them. With a thread per connection, every read and write hands the interpreter lock to
  another thread; measured on two cores, that cost a delivery thread about as much CPU as the
  SMTP conversation itself (docs/architecture.md, "What a delivery costs"). Opening a
  connection (TCP, TLS, EHLO, AUTH) is rare and stays blocking, on a short-lived helper thread,
  so that a slow relay's handshake never holds up the other connections.

Both ways fail alike: a lost connection, an unreadable reply, a timed-out read or write raise
the same smtplib exceptions (with a TimeoutError as cause or context when a wait ran out), and
the connection is closed as smtplib closes it, so the adapter classifies a failure the same way
whichever ran it. The loop's waits: a write must be over within the connection's timeout, as
Python's ``sendall`` with a timeout; a read waits the connection's timeout since the server's
last byte, or the step's ``wait`` in all (the answer to a message's end).
"""

import contextlib
import contextvars
import logging
import selectors
import smtplib
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from notifications.adapters.smtp_connect import reply_wait

T = TypeVar("T")

logger = logging.getLogger(__name__)

# smtplib's longest reply line (a longer one fails as "500 Line too long.").
MAX_LINE = 8192
# Bytes asked of the kernel per read.
READ_BYTES = 65536


@dataclass(slots=True)
class Exchange:
    """Write ``data`` (a str is encoded as smtplib encodes commands) to ``smtp``, then read
    ``replies`` replies; the result is the list of ``(code, text)`` as smtplib's ``getreply``
    returns them. ``wait``: seconds the replies may take in all, instead of the connection's
    timeout since the last byte."""

    smtp: smtplib.SMTP
    data: bytes | str | None
    replies: int = 0
    wait: float | None = None


@dataclass(slots=True)
class Blocking:
    """Call ``call`` where blocking is harmless (opening a connection); its result or exception
    comes back."""

    call: Callable[[], Any]


Step = Exchange | Blocking
Steps = Generator[Step, Any, T]


def steps_run(steps: "Steps[T]") -> T:
    """Run ``steps`` to the end on this thread, each step with smtplib's blocking calls."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = _blocking(step)
        except BaseException as exc:  # noqa: BLE001 - thrown into the steps, which decide
            error = exc


def _blocking(step: Step) -> Any:
    if isinstance(step, Blocking):
        return step.call()
    smtp = step.smtp
    blocking_again(smtp)
    if step.data is not None:
        smtp.send(step.data)
    if not step.replies:
        return []
    if step.wait is None:
        return [smtp.getreply() for _ in range(step.replies)]
    with reply_wait(smtp, step.wait):
        return [smtp.getreply() for _ in range(step.replies)]


def blocking_again(smtp: smtplib.SMTP) -> None:
    """A connection the loop used waits again as it did before (kernel or Python timeouts,
    notifications.adapters.smtp_connect), for a blocking call such as QUIT."""
    wire: _Wire | None = getattr(smtp, "_wire", None)
    if wire is None or not wire.nonblocking or smtp.sock is None:
        return
    wire.nonblocking = False
    smtp.sock.settimeout(None if getattr(smtp, "kernel_timeouts", False) else smtp.timeout)


class _Wire:
    """What the loop keeps of one connection between steps: bytes read beyond the last reply
    (none, in a conversation kept in step), and whether the server has closed its side."""

    __slots__ = ("buffer", "eof", "nonblocking")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False
        self.nonblocking = False


def _wire(smtp: smtplib.SMTP) -> "_Wire":
    wire: _Wire | None = getattr(smtp, "_wire", None)
    if wire is None:
        wire = _Wire()
        smtp._wire = wire  # type: ignore[attr-defined]
    return wire


def _lost(smtp: smtplib.SMTP, message: str, cause: BaseException | None) -> smtplib.SMTPServerDisconnected:
    """Close ``smtp`` as smtplib does when a call fails, and the exception smtplib raises then
    (with what caused it as its context)."""
    with contextlib.suppress(OSError):
        smtp.close()
    error = smtplib.SMTPServerDisconnected(message)
    error.__context__ = cause
    return error


def _timed_out() -> TimeoutError:
    return TimeoutError("timed out")


@dataclass(eq=False)
class _Run:
    """One generator the loop runs, and the state of the step it waits on."""

    key: Any
    steps: Steps[Any]
    context: contextvars.Context
    step: Exchange | None = None
    wire: _Wire | None = None  # the step's connection's
    out: memoryview | None = None  # bytes still to write
    replies: list[tuple[int, bytes]] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)  # lines of the reply being read
    deadline: float = 0.0
    registered: socket.socket | None = None  # the socket registered with the selector
    events: int = 0


class StepLoop:
    """Runs generators of steps, up to ``size`` at a time, on the thread that calls :meth:`turn`.

    :meth:`submit` queues ``factory(*args)`` (a generator of steps, created and run in a context
    of its own, so context variables set within one never leak into another); when it ends,
    ``done(key, result, error)`` is called from :meth:`turn`. The owner turns the loop while it
    has nothing else to do (a dispatch pass: while it waits for results), so the deliveries and
    the pass share one thread and never hand the interpreter lock to each other. Other threads
    may :meth:`submit` and :meth:`wake` it. :meth:`drop` forgets what is queued and not started.
    """

    def __init__(self, *, size: int, done: Callable[[Any, Any, BaseException | None], None]) -> None:
        self._size = size
        self._done = done
        self._tasks: deque[tuple[Any, Callable[..., Steps[Any]], tuple[Any, ...]]] = deque()
        self._answers: deque[tuple[_Run, Any, BaseException | None]] = deque()  # from Blocking calls
        self._running: set[_Run] = set()
        self._waiting: set[_Run] = set()  # runs waiting on a socket (with a deadline)
        self._sleeping = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)

    # --- the callers' side ------------------------------------------------------------------

    def submit(self, key: Any, factory: Callable[..., "Steps[Any]"], *args: Any) -> None:
        self._tasks.append((key, factory, args))
        if self._sleeping:
            self.wake()

    def drop(self) -> None:
        """Forget the generators queued and not started (a failed pass: nobody could record
        their results)."""
        self._tasks.clear()

    @property
    def busy(self) -> bool:
        """Generators run or wait to be started."""
        return bool(self._running or self._tasks)

    def close(self) -> None:
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def wake(self) -> None:
        """End a :meth:`turn` waiting now or about to wait (from any thread)."""
        with contextlib.suppress(BlockingIOError):  # a wake is pending already
            self._wake_write.send(b"\0")

    @property
    def sleeping(self) -> bool:
        """A :meth:`turn` waits (or is about to): another thread's news must :meth:`wake` it."""
        return self._sleeping

    # --- the loop -----------------------------------------------------------------------------

    def turn(self, timeout: float | None, *, news: Callable[[], bool] | None = None) -> None:
        """Start what can be started, wait up to ``timeout`` seconds (None: until something
        happens) for the sockets, and move every run that can move. ``news``: the owner's own
        reason not to wait (checked once :attr:`sleeping` is set, so that another thread either
        sees it set and wakes the loop, or its news is seen here). A bug in here fails every
        run and queued generator with it (their owner raises it), never leaves them waiting."""
        try:
            self._turn(timeout, news)
        except BaseException as exc:
            for run in list(self._running):
                self._report(run.key, None, exc)
            for task in list(self._tasks):
                self._report(task[0], None, exc)
            self._running.clear()
            self._waiting.clear()
            self._tasks.clear()
            raise

    def _report(self, key: Any, value: Any, error: BaseException | None) -> None:
        try:
            self._done(key, value, error)
        except Exception:
            logger.exception("a delivery's result could not be handed over")

    def _turn(self, timeout: float | None, news: Callable[[], bool] | None) -> None:
        running, waiting = self._running, self._waiting
        while self._answers:
            run, value, error = self._answers.popleft()
            self._advance(run, value, error)
        while len(running) < self._size and self._tasks:
            self._start(self._tasks.popleft())
        if waiting:
            soonest = max(0.0, min(run.deadline for run in waiting) - time.monotonic())
            timeout = soonest if timeout is None else min(timeout, soonest)
        self._sleeping = True
        if self._answers or (len(running) < self._size and self._tasks) or (news is not None and news()):
            timeout = 0.0
        events = self._selector.select(timeout)
        self._sleeping = False
        for key, mask in events:
            run = key.data
            if run is None:
                with contextlib.suppress(BlockingIOError):
                    self._wake_read.recv(4096)
            elif run in waiting:
                self._ready(run, mask)
        if waiting:
            now = time.monotonic()
            for run in [run for run in waiting if run.deadline <= now]:
                self._expire(run)
        while self._answers:
            run, value, error = self._answers.popleft()
            self._advance(run, value, error)
        while len(running) < self._size and self._tasks:
            self._start(self._tasks.popleft())

    def _start(self, task: tuple[Any, Callable[..., "Steps[Any]"], tuple[Any, ...]]) -> None:
        key, factory, args = task
        context = contextvars.Context()
        try:
            steps = context.run(factory, *args)
        except BaseException as exc:  # noqa: BLE001 - the caller's to raise
            self._report(key, None, exc)
            return
        run = _Run(key=key, steps=steps, context=context)
        self._running.add(run)
        self._advance(run, None, None)

    def _advance(self, run: _Run, value: Any, error: BaseException | None) -> None:
        """Resume ``run`` with a step's result (or exception) until it waits or ends."""
        waiting = self._waiting
        while True:
            waiting.discard(run)
            try:
                if error is None:
                    step = run.context.run(run.steps.send, value)
                else:
                    step = run.context.run(run.steps.throw, error)
            except StopIteration as finished:
                self._end(run, finished.value, None)
                return
            except BaseException as exc:  # noqa: BLE001 - the caller's to raise
                self._end(run, None, exc)
                return
            value, error = None, None
            if isinstance(step, Blocking):
                self._unregister(run)
                threading.Thread(target=self._call, args=(run, step.call), name="smtp_connect", daemon=True).start()
                return
            registered = run.registered
            if registered is not None and (registered is not step.smtp.sock or registered.fileno() < 0):
                self._unregister(run)
            try:
                finished_at_once = self._begin(run, step)
            except BaseException as exc:  # noqa: BLE001 - thrown into the steps
                error = exc
                continue
            if finished_at_once:
                value = run.replies
                continue
            waiting.add(run)
            return

    def _call(self, run: _Run, call: Callable[[], Any]) -> None:
        """A helper thread: one blocking call, its answer handed to the loop."""
        value: Any = None
        error: BaseException | None = None
        try:
            value = run.context.copy().run(call)
        except BaseException as exc:  # noqa: BLE001 - thrown into the steps
            error = exc
        self._answers.append((run, value, error))
        self.wake()

    def _end(self, run: _Run, value: Any, error: BaseException | None) -> None:
        self._unregister(run)
        self._running.discard(run)
        self._report(run.key, value, error)

    # --- one exchange -------------------------------------------------------------------------

    def _begin(self, run: _Run, step: Exchange) -> bool:
        """Start ``step``: write what it can at once. True when the step is over already (only
        a write, and it went out); raises what the step fails with."""
        smtp = step.smtp
        sock = smtp.sock
        if sock is None:
            raise smtplib.SMTPServerDisconnected("please run connect() first")
        wire = _wire(smtp)
        if not wire.nonblocking:
            sock.setblocking(False)
            wire.nonblocking = True
        run.step = step
        run.wire = wire
        run.replies = []
        run.lines = []
        data = step.data
        if data:
            if isinstance(data, str):
                data = data.encode(smtp.command_encoding)
            run.out = memoryview(data)
            run.deadline = time.monotonic() + (smtp.timeout or 0)
            self._write(run)
            if run.out is not None:
                self._interest(run, selectors.EVENT_WRITE)
                return False
        else:
            run.out = None
        return self._reading_begin(run)

    def _reading_begin(self, run: _Run) -> bool:
        step = run.step
        assert step is not None
        if not step.replies:
            return True
        wire = run.wire
        assert wire is not None
        if wire.buffer and self._parse(run):  # in a conversation kept in step, nothing is left over
            return True
        if wire.eof:
            raise self._lost(run, "Connection unexpectedly closed", None)
        run.deadline = time.monotonic() + (step.wait if step.wait is not None else step.smtp.timeout or 0)
        self._interest(run, selectors.EVENT_READ)
        return False

    def _write(self, run: _Run) -> None:
        """Write what the socket takes now (``run.out`` is None once all is written)."""
        smtp = run.step.smtp  # type: ignore[union-attr]
        sock = smtp.sock
        out = run.out
        assert sock is not None and out is not None
        try:
            while out:
                out = out[sock.send(out) :]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            run.out = out
            return
        except OSError as exc:
            run.out = None
            raise self._lost(run, "Server not connected", exc) from None
        run.out = None

    def _interest(self, run: _Run, events: int) -> None:
        sock = run.step.smtp.sock  # type: ignore[union-attr]
        assert sock is not None
        if run.registered is None:
            self._selector.register(sock, events, run)
            run.registered, run.events = sock, events
        elif run.events != events:
            self._selector.modify(sock, events, run)
            run.events = events

    def _unregister(self, run: _Run) -> None:
        if run.registered is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(run.registered)
            run.registered = None

    def _ready(self, run: _Run, mask: int) -> None:
        step = run.step
        assert step is not None
        try:
            if run.out is not None:
                self._write(run)
                if run.out is not None:
                    return
                if not self._reading_begin(run):
                    return
                self._advance(run, run.replies, None)
                return
            if self._read(run):
                self._advance(run, run.replies, None)
        except BaseException as exc:  # noqa: BLE001 - thrown into the steps
            self._unregister(run)
            self._advance(run, None, exc)

    def _read(self, run: _Run) -> bool:
        """Read what has come; True once the step's replies are all in."""
        step = run.step
        assert step is not None
        smtp = step.smtp
        sock = smtp.sock
        assert sock is not None
        wire = run.wire
        assert wire is not None
        pending = sock.pending if isinstance(sock, ssl.SSLSocket) else None
        try:
            while True:
                data = sock.recv(READ_BYTES)
                if not data:
                    wire.eof = True
                    break
                wire.buffer += data
                if len(data) < READ_BYTES and not (pending is not None and pending()):
                    break
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError as exc:
            raise self._lost(run, f"Connection unexpectedly closed: {exc}", exc) from None
        if self._parse(run):
            return True
        if wire.eof:
            raise self._lost(run, "Connection unexpectedly closed", None)
        if step.wait is None:
            run.deadline = time.monotonic() + (smtp.timeout or 0)  # the timeout runs from the last byte
        return False

    def _parse(self, run: _Run) -> bool:
        """Take whole reply lines off the connection's buffer, as smtplib's ``getreply`` reads
        them; True once the step's replies are all in. At the end of the stream, a last line
        without its line end counts as a line (as ``readline`` returns it)."""
        step, wire = run.step, run.wire
        assert step is not None and wire is not None
        buffer = wire.buffer
        replies, lines, want = run.replies, run.lines, step.replies
        size = len(buffer)
        start = 0
        while len(replies) < want:
            end = buffer.find(b"\n", start)
            if end < 0:
                if size - start > MAX_LINE:
                    raise self._too_long(run)
                if not (wire.eof and start < size):
                    break
                end = size - 1
            if end + 1 - start > MAX_LINE:
                raise self._too_long(run)
            line = bytes(buffer[start : end + 1])
            start = end + 1
            try:
                code = int(line[:3])
            except ValueError:
                code = -1
            text = line[4:].strip(b" \t\r\n")
            if code != -1 and line[3:4] == b"-":
                lines.append(text)
            elif lines:
                lines.append(text)
                replies.append((code, b"\n".join(lines)))
                lines.clear()
            else:
                replies.append((code, text))
        if start:
            del buffer[:start]
        return len(replies) >= want

    def _lost(self, run: _Run, message: str, cause: BaseException | None) -> smtplib.SMTPServerDisconnected:
        """:func:`_lost` for ``run``'s connection, taken off the selector first: once closed,
        its descriptor may be reused by a connection opened meanwhile."""
        self._unregister(run)
        return _lost(run.step.smtp, message, cause)  # type: ignore[union-attr]

    def _too_long(self, run: _Run) -> smtplib.SMTPResponseException:
        smtp = run.step.smtp  # type: ignore[union-attr]
        self._unregister(run)
        with contextlib.suppress(OSError):
            smtp.close()
        return smtplib.SMTPResponseException(500, "Line too long.")

    def _expire(self, run: _Run) -> None:
        """``run``'s wait ran out: the step fails as a timed-out smtplib call does."""
        if run.out is not None:
            run.out = None
            error = self._lost(run, "Server not connected", _timed_out())
        else:
            error = self._lost(run, "Connection unexpectedly closed: timed out", _timed_out())
        self._advance(run, None, error)
