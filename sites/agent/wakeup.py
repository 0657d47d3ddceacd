"""Waking the forwarder the moment a notification is buffered, within a process and across
processes, on Linux and Windows.

A running forwarder listens on a UDP socket bound to 127.0.0.1 (a port the system picks) and
publishes that port in a small file next to the buffer, ``<buffer>-forwarder``. ``send()`` (in
any process: a script, the ``send`` command) reads the file and sends a one-byte datagram to
the port; the forwarder, sleeping in ``select()`` until its next sweep, wakes and sweeps at once.

A datagram carries no data and is never trusted: any local process that sends one only causes
an early sweep of rows that are due anyway. A lost datagram, a stale file (the forwarder was
killed) or no forwarder at all costs nothing but the wait for the next sweep, so sending never
fails because of a wake-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
from typing import Sequence

WAKE_BYTE = b"w"


def wakeup_file(db_path: str) -> str:
    """Where the forwarder of the buffer ``db_path`` publishes its wake-up port."""
    return os.fspath(db_path) + "-forwarder"


def wake_forwarder(db_path: str) -> bool:
    """Poke the forwarder of ``db_path`` if one has published its port. True if a datagram went
    out (not proof that a forwarder is listening)."""
    try:
        with open(wakeup_file(db_path), encoding="utf-8") as handle:
            port = int(json.load(handle)["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return poke(port)


def poke(port: int) -> bool:
    """Send the wake-up datagram to 127.0.0.1:``port``; True if it was sent."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(WAKE_BYTE, ("127.0.0.1", port))
    except OSError:
        return False
    return True


class WakeListener:
    """The forwarder's end: a UDP socket on 127.0.0.1 whose port is published for ``db_path``.

    ``publish()`` writes the port file (atomically); ``close()`` removes it if it still names
    this listener, so a second forwarder that took over keeps its own.
    """

    def __init__(self, db_path: str) -> None:
        self.path = wakeup_file(db_path)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)
        self.port = int(self.socket.getsockname()[1])

    def publish(self) -> None:
        """Write ``{"port": …, "pid": …}`` to the port file (replacing any stale one)."""
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"port": self.port, "pid": os.getpid()}, handle)
        os.replace(temporary, self.path)

    def poke(self) -> None:
        """Wake this listener from the same process."""
        poke(self.port)

    def drain(self) -> int:
        """Read every pending datagram; returns how many there were."""
        count = 0
        while True:
            try:
                self.socket.recv(64)
            except (BlockingIOError, InterruptedError):
                return count
            except OSError:
                # Windows reports an earlier ICMP "port unreachable" here; it is not ours.
                return count
            count += 1

    def wait(self, timeout: float, *, also: Sequence[socket.socket] = ()) -> bool:
        """Sleep until a wake-up arrives, one of ``also`` is readable, or ``timeout`` seconds
        pass. True if woken by a datagram (which is consumed)."""
        readable, _, _ = select.select([self.socket, *also], [], [], max(timeout, 0.0))
        return self.socket in readable and self.drain() > 0

    def close(self) -> None:
        """Close the socket and remove the port file if it is still this listener's."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            with open(self.path, encoding="utf-8") as handle:
                published = json.load(handle)
            if int(published["port"]) == self.port and int(published["pid"]) == os.getpid():
                os.remove(self.path)
        self.socket.close()
