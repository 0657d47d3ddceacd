"""A bounded load generator on loopback that logs every notification id with its outcome.

Outcomes: ``ack`` (201/200: central committed it), ``reject`` (a 4xx other than 429: central
refused it for good), ``indeterminate`` (timeout, connection reset, 429 or 5xx: we cannot know
whether central stored it, so the id is re-sent until acknowledged).
"""

import http.client
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, Self
from urllib.parse import urlparse


def notification(notification_id: str, *, list_name: str = "Operators", subject: str | None = None) -> dict[str, Any]:
    """A valid notification payload with this id."""
    return {
        "notification_id": notification_id,
        "list_name": list_name,
        "subject": subject or f"Chaos {notification_id[:8]}",
        "body": "Fault-injection load.",
        "source_instance_id": "Chaos",
        "source_script": "chaos",
        "site_enqueued_at": "2026-11-21T10:00:00Z",
    }


class Ledger:
    """What the client knows about each id: the payload sent and the last outcome."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.payloads: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, str] = {}
        self.attempts: Counter[str] = Counter()

    def record(self, payload: dict[str, Any], outcome: str) -> None:
        with self.lock:
            nid = payload["notification_id"]
            self.payloads[nid] = payload
            self.attempts[nid] += 1
            # An ack is final: a later indeterminate answer to a re-send does not undo it.
            if self.outcomes.get(nid) != "ack":
                self.outcomes[nid] = outcome

    def ids(self, outcome: str) -> list[str]:
        with self.lock:
            return [nid for nid, value in self.outcomes.items() if value == outcome]

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(self.outcomes.values())


class Client:
    """One keep-alive connection posting notifications; classifies each answer."""

    def __init__(self, base_url: str, key: str, timeout: float = 5.0) -> None:
        parsed = urlparse(base_url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port
        self.headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"}
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, payload: dict[str, Any]) -> str:
        """Post one notification; ``ack``, ``reject`` or ``indeterminate``."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", "/api/v1/notifications/", json.dumps(payload), self.headers)
            response = self.conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            return "indeterminate"
        if response.status in (200, 201):
            return "ack"
        if response.status == 429 or response.status >= 500:
            return "indeterminate"
        return "reject"

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class LoadGenerator:
    """Posts new notifications from ``threads`` threads at about ``rate`` per second in total,
    for ``duration`` seconds at most and ``limit`` notifications at most. Bounded by both."""

    def __init__(
        self,
        base_url: str,
        key: str,
        ledger: Ledger,
        *,
        rate: float = 100,
        duration: float = 10,
        limit: int = 2000,
        threads: int = 4,
        make: Callable[[str], dict[str, Any]] = notification,
    ) -> None:
        self.base_url, self.key, self.ledger = base_url, key, ledger
        self.rate, self.duration, self.limit, self.threads = rate, duration, limit, threads
        self.make = make
        self.sent = 0
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.workers: list[threading.Thread] = []

    def _take(self) -> bool:
        with self.lock:
            if self.sent >= self.limit:
                return False
            self.sent += 1
            return True

    def _run(self) -> None:
        client = Client(self.base_url, self.key)
        interval = self.threads / self.rate
        deadline = time.monotonic() + self.duration
        next_at = time.monotonic()
        while not self.stop_event.is_set() and time.monotonic() < deadline and self._take():
            payload = self.make(str(uuid.uuid4()))
            self.ledger.record(payload, client.post(payload))
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
        client.close()

    def start(self) -> Self:
        self.workers = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]
        for worker in self.workers:
            worker.start()
        return self

    def join(self) -> None:
        for worker in self.workers:
            worker.join()

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


def resend_until_acked(base_url: str, key: str, ledger: Ledger, *, deadline_seconds: float = 120) -> list[str]:
    """Re-send every indeterminate id (same payload, same id) until central acknowledges it."""
    client = Client(base_url, key, timeout=10)
    deadline = time.monotonic() + deadline_seconds
    pending = ledger.ids("indeterminate")
    while pending and time.monotonic() < deadline:
        for nid in pending:
            ledger.record(ledger.payloads[nid], client.post(ledger.payloads[nid]))
        pending = ledger.ids("indeterminate")
        if pending:
            time.sleep(0.5)
    client.close()
    return pending


def post_same_ids_concurrently(
    base_url: str, key: str, ledger: Ledger, *, count: int = 200, threads: int = 8
) -> list[dict[str, Any]]:
    """Every thread posts the same ``count`` ids at once; each id must end with one row."""
    payloads = [notification(str(uuid.uuid4())) for _ in range(count)]
    barrier = threading.Barrier(threads)

    def run() -> None:
        client = Client(base_url, key)
        barrier.wait()
        for payload in payloads:
            ledger.record(payload, client.post(payload))
        client.close()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return payloads
