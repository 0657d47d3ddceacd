"""Slow clients against a running central: some send their request headers one byte per second,
some send complete headers and then their body one byte per second, while a prober asks for
``/healthz`` (a fresh connection each time, a deadline per probe) and counts the answers.

Used by tests/e2e/test_slow_clients.py against the default web server configuration, and
runnable to compare worker classes (figures for the README), e.g.::

    DATABASE_URL=postgres://… python -m tests.support.slow_clients --worker-class sync

Traffic goes to 127.0.0.1 only, and every run is bounded in time.
"""

import argparse
import http.client
import os
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass

HEADER_START = b"POST /api/v1/notifications/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: "
BODY_LENGTH = 10_000


@dataclass(frozen=True)
class ProbeReport:
    """``answered``: probes answered 200 within the deadline, of ``probes``; ``slowest``: the
    slowest answered probe, in seconds."""

    probes: int
    answered: int
    slowest: float

    @property
    def ratio(self) -> float:
        return self.answered / self.probes if self.probes else 0.0


class Dribblers:
    """``header_clients`` connections dribbling headers and ``body_clients`` connections
    dribbling a body (after complete headers carrying ``key``), one byte per second each, from
    one thread, until stopped. A connection the server closes is opened again."""

    def __init__(
        self,
        port: int,
        *,
        header_clients: int,
        body_clients: int,
        key: str = "",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: speak TLS with this client context (e.g. to a proxy terminating TLS)."""
        self.port = port
        self.key = key
        self.tls = tls
        self.kinds = ["header"] * header_clients + ["body"] * body_clients
        self.sockets: list[socket.socket | None] = [None] * len(self.kinds)
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dribblers", daemon=True)

    def _open(self, kind: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname="127.0.0.1")
        if kind == "header":
            sock.sendall(HEADER_START)
        else:
            sock.sendall(
                b"POST /api/v1/notifications/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                + f"Authorization: Api-Key {self.key}\r\nContent-Length: {BODY_LENGTH}\r\n\r\n".encode()
                + b'{"subject": "'
            )
        return sock

    def _run(self) -> None:
        while not self._stop.is_set():
            for index, kind in enumerate(self.kinds):
                try:
                    sock = self.sockets[index]
                    if sock is None:
                        sock = self.sockets[index] = self._open(kind)
                    else:
                        sock.send(b"a")
                except OSError:
                    self._close(index)
                    self.reconnects += 1
            self._stop.wait(1.0)

    def _close(self, index: int) -> None:
        sock = self.sockets[index]
        self.sockets[index] = None
        if sock is not None:
            sock.close()

    def start(self) -> "Dribblers":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for index in range(len(self.sockets)):
            self._close(index)


def probe(port: int, *, seconds: float, interval: float = 0.25, deadline: float = 2.0) -> ProbeReport:
    """Ask for /healthz every ``interval`` s for ``seconds`` s, each on a new connection that
    must answer 200 within ``deadline`` s."""
    probes = answered = 0
    slowest = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        probes += 1
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
        try:
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            response.read()
            took = time.monotonic() - started
            if response.status == 200 and took <= deadline:
                answered += 1
                slowest = max(slowest, took)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            connection.close()
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return ProbeReport(probes=probes, answered=answered, slowest=slowest)


def under_slow_clients(
    port: int,
    *,
    header_clients: int = 50,
    body_clients: int = 10,
    key: str = "",
    seconds: float = 12.0,
    dribble_port: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> ProbeReport:
    """Probe /healthz on ``port`` for ``seconds`` while the dribblers hold their connections to
    ``dribble_port`` (default: ``port``; ``tls``: over TLS). They start two seconds before the
    probing, so that every one of them is connected."""
    dribblers = Dribblers(
        dribble_port or port, header_clients=header_clients, body_clients=body_clients, key=key, tls=tls
    ).start()
    try:
        time.sleep(2.0)
        return probe(port, seconds=seconds)
    finally:
        dribblers.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-class", help="override gunicorn.conf.py's worker class (e.g. sync, gthread)")
    parser.add_argument("--threads", type=int, help="threads per worker (gthread)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--headers", type=int, default=50, help="clients dribbling headers")
    parser.add_argument("--bodies", type=int, default=10, help="clients dribbling bodies")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
    import django

    django.setup()
    from tests.support.processes import Central

    options = []
    if args.worker_class:
        options += ["--worker-class", args.worker_class]
        if args.worker_class != "asgi":
            options.append("outbox_project.wsgi:application")  # the WSGI workers need the WSGI entry point
    if args.threads:
        options += ["--threads", str(args.threads)]
    with Central(workers=args.workers, options=options, database=os.environ.get("DATABASE_URL")) as central:
        report = under_slow_clients(
            central.port, header_clients=args.headers, body_clients=args.bodies, seconds=args.seconds
        )
    print(
        f"worker class {args.worker_class or '(gunicorn.conf.py)'}: {report.answered} of {report.probes} "
        f"/healthz probes answered within 2 s ({report.ratio:.0%}), slowest {report.slowest:.2f} s, "
        f"with {args.headers} clients dribbling headers and {args.bodies} dribbling bodies"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
