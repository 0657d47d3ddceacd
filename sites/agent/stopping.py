"""Stopping a long-running forwarder on SIGTERM/SIGINT without races, on Linux and Windows.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread is inside ``threading.Event.wait()`` holding the event's internal lock, so a handler
must not touch an Event (setting it can deadlock) nor start a thread. :class:`StopSignal` is a
stop flag backed by a connected socket pair instead: ``wait()`` sleeps in ``select()`` on one
end, and ``set()`` — from a handler, another thread or the sleeper itself — writes a byte to
the other. The byte stays in the socket until read, so a stop requested just before the sleeper
enters ``select()`` still wakes it at once.

Where the platform has it (the main thread), ``signal.set_wakeup_fd`` makes the interpreter's C
handler write the signal number into the same socket the moment the signal arrives. That wakes
``select()`` even on Windows, where a console Ctrl+C does not interrupt it, and the sleeper
reads which signal it was from the byte itself. Signals the platform lacks are skipped
(``SIGTERM`` is never delivered on Windows; ``SIGBREAK`` is Windows' Ctrl+Break).
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from typing import Iterator, Protocol, Sequence

# The signals a forwarder stops on, where the platform has them.
STOP_SIGNAL_NAMES = ("SIGTERM", "SIGINT", "SIGBREAK")


class StopEvent(Protocol):
    """What the forwarder needs from a stop flag: ``threading.Event`` or :class:`StopSignal`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def stop_signals() -> dict[int, str]:
    """The stop signals this platform has: ``{number: name}``."""
    found = {}
    for name in STOP_SIGNAL_NAMES:
        number = getattr(signal, name, None)
        if number is not None:
            found[int(number)] = name
    return found


class StopSignal:
    """A stop flag that a signal handler or any thread can set and a sleeper wakes on at once.

    Event-compatible: ``set()``, ``is_set()``, ``wait(timeout)``. ``reason`` says what set it
    first (a signal name such as ``"SIGTERM"``, or what was passed to ``set()``).
    """

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._flag = False
        self.reason: str | None = None
        self._signals: dict[int, str] = {}

    # --- the flag -----------------------------------------------------------------------------

    def set(self, reason: str = "stop") -> None:
        """Request a stop. Safe from a signal handler and from any thread."""
        if self.reason is None:
            self.reason = reason
        self._flag = True
        with contextlib.suppress(OSError):  # a full socket buffer already wakes the sleeper
            self._writer.send(b"\0")

    def is_set(self) -> bool:
        """True once a stop was requested."""
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until a stop is requested or ``timeout`` seconds pass; True if stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            readable, _, _ = select.select([self._reader], [], [], remaining)
            if readable:
                self._drain()
        return self._flag

    @property
    def selectable(self) -> socket.socket:
        """The socket that becomes readable when a stop is requested (for a caller that also
        waits on sockets of its own with ``select()``; call :meth:`poll` when it is readable)."""
        return self._reader

    def poll(self) -> bool:
        """Take in whatever woke :attr:`selectable` (a signal's byte counts as a stop request)
        and return :meth:`is_set`; never blocks."""
        self._drain()
        return self._flag

    def _drain(self) -> None:
        while True:
            try:
                data = self._reader.recv(512)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not data:
                return
            for byte in data:
                # Bytes written by set_wakeup_fd are signal numbers; the Python-level handler
                # may not have run yet, so the byte itself counts as the stop request.
                if byte in self._signals:
                    self.set(self._signals[byte])

    def close(self) -> None:
        """Release the socket pair."""
        self._reader.close()
        self._writer.close()

    def __enter__(self) -> StopSignal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- signals ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def on_signals(self, names: Sequence[str] = STOP_SIGNAL_NAMES) -> Iterator[dict[int, str]]:
        """While inside, the named signals (those the platform has) set this flag instead of
        killing the process. Yields ``{number: name}`` of the signals handled; empty outside
        the main thread, where Python cannot install handlers. Restores what was there before.
        """
        wanted = {number: name for number, name in stop_signals().items() if name in names}
        if threading.current_thread() is not threading.main_thread() or not wanted:
            yield {}
            return

        def handler(signum: int, frame: object) -> None:
            self.set(wanted.get(signum, f"signal {signum}"))

        previous = {}
        previous_fd: int | None = None
        self._signals = wanted
        try:
            for number in wanted:
                previous[number] = signal.signal(number, handler)
            try:
                previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
            except (ValueError, OSError):
                previous_fd = None  # the handler's own write still wakes the sleeper
            yield dict(wanted)
        finally:
            if previous_fd is not None:
                with contextlib.suppress(ValueError, OSError):
                    signal.set_wakeup_fd(previous_fd)
            for number, old in previous.items():
                # None: the previous handler was not installed from Python; the default is
                # the closest we can restore.
                signal.signal(number, old if old is not None else signal.SIG_DFL)
            self._signals = {}
