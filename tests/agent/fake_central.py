"""A small programmable stand-in for central's ingest API, on a real socket on 127.0.0.1.

Why not the real central: the forwarder's job is to survive answers and faults that a healthy
central never gives on demand — 503s, 429 with Retry-After, 413 for a batch, timeouts,
connection resets, a revoked key in the middle of a backlog. This server produces each of them
deterministically. Tests against the real central (Django) live with the API tests.

By default it behaves like central (docs/api.md): a new id is 201, the same content again is a
200 replay, the same id with other content is 422; the batch endpoint answers per item.
Queue scripted answers with :meth:`FakeCentral.then`; each request consumes one. It answers
``GET /healthz`` (no key needed) and the list read ``GET /api/v1/notifications/?page_size=1``
like central, can serve over TLS (``tls=`` an ``ssl.SSLContext``), and can pretend its clock
is off (``clock_offset`` seconds added to its ``Date`` header).

The site endpoints (heartbeat, parked reports, command acknowledgements, watchdog pings, and a
site's acknowledge/clear of its notifications) are kept apart: their requests go to
``site_requests``, never consume the scripted answers, and behave like central (heartbeats
answer with ``commands`` until each is acknowledged; ``acknowledged`` commands only to agents
whose heartbeat lists that capability) unless ``site_always`` is set.

Round-3 rules kept as central keeps them (the lead's wire notes): ``budgets`` counts
notifications, not requests — a batch of N draws N, ``critical`` items from a budget of their
own — and a request whose budget lacks tokens is answered 429 with ``Retry-After`` and nothing
ingested; ``delivered_locally_at`` is not part of the idempotency fingerprint (a replay may add
it once to a row that has none); watchdog pings keep ``min(pinged_at, now)`` and never move a
watchdog's last ping backwards.
"""

import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional

GOOD_KEY = "site-key-plant-a"
_SITE_ACTION = re.compile(r"^/api/v1/notifications/([^/]+)/(ack|clear)/$")


@dataclass
class Reply:
    status: int
    body: object = None
    headers: dict = field(default_factory=dict)
    raw: Optional[bytes] = None  # sent as it is instead of ``body`` as JSON (a proxy's HTML page)


class Reset:
    """Abort the TCP connection (RST) without answering."""


class Hang:
    """Answer nothing until the test ends, so the client's timeout fires."""


@dataclass
class Received:
    method: str
    path: str
    headers: dict
    body: object


class FakeCentral:
    def __init__(self, *, tls=None):
        self.clock_offset = 0.0
        self.requests = []
        self.stored = {}  # notification_id -> payload, what "central" has committed
        self.script = []
        self.always = None  # when set, answers every request the script does not
        self.connections = set()  # client ports seen: how many TCP connections were used
        self.site_requests = []  # heartbeats, parked reports, acknowledgements
        self.site_always = None  # when set (a Reply, or a callable(received) -> Reply or None), answers site requests
        self.commands = []  # operator commands handed out in heartbeat answers until acknowledged
        self.acks = {}  # command id -> acknowledgement body
        self.parked = {}  # notification id -> latest parked item reported
        self.unparked = {}  # notification id -> latest unparked item reported
        # Notifications left per budget; None = unlimited.
        self.budgets: Dict[str, Optional[int]] = {"critical": None, "other": None}
        self.retry_after = "30"  # the Retry-After of a 429 for an empty budget
        self.watchdogs = {}  # name -> latest ping as central keeps it
        self.site_acks = {}  # notification id -> the site's acknowledgement body (the first one)
        self.site_clears = {}  # notification id -> the site's clear body (the first one)
        self._lock = threading.Condition()
        self._release = threading.Event()
        central = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like gunicorn

            def log_message(self, *args):
                pass

            def date_time_string(self, timestamp=None):
                return formatdate(time.time() + central.clock_offset, usegmt=True)

            def do_GET(self):
                central._handle(self)

            def do_POST(self):
                central._handle(self)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # resets and hangs are on purpose

        self.server = Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            # The handshake happens on the handler thread's first read, not in accept().
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    # --- programming it -----------------------------------------------------------------------

    def then(self, *behaviours):
        """Queue answers (Reply, Reset, Hang, or a callable(received) -> Reply) for the next requests."""
        with self._lock:
            self.script.extend(behaviours)
        return self

    def wait_for_requests(self, count, timeout=10):
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"central received {len(self.requests)} requests, expected {count}")

    def posted_ids(self):
        """Every notification id posted, in order (batch items flattened)."""
        ids: list = []
        for received in self.requests:
            if received.method != "POST":
                continue
            if received.path.endswith("/batch/"):
                ids.extend(item["notification_id"] for item in received.body["notifications"])
            else:
                ids.append(received.body["notification_id"])
        return ids

    # --- serving ------------------------------------------------------------------------------

    def _handle(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        received = Received(handler.command, handler.path, dict(handler.headers), body)
        if handler.path.startswith("/api/v1/sites/") or _SITE_ACTION.match(handler.path):
            with self._lock:
                self.site_requests.append(received)
                self._lock.notify_all()
            behaviour = self.site_always
            if callable(behaviour) and not isinstance(behaviour, type):
                behaviour = behaviour(received)  # a function may answer None: like central
            self._answer(handler, behaviour or self._site_like_central(received))
            return
        with self._lock:
            self.requests.append(received)
            self.connections.add(handler.client_address[1])
            behaviour = self.script.pop(0) if self.script else None
            self._lock.notify_all()
        if behaviour is None:
            behaviour = self.always
        if behaviour is None:
            behaviour = self._like_central(received)
        elif callable(behaviour) and not isinstance(behaviour, type):
            behaviour = behaviour(received)
        self._answer(handler, behaviour)

    def _answer(self, handler, behaviour):
        if isinstance(behaviour, Reset) or behaviour is Reset:
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        if isinstance(behaviour, Hang) or behaviour is Hang:
            self._release.wait(30)
            handler.close_connection = True
            return
        data = b"" if behaviour.body is None else json.dumps(behaviour.body).encode()
        if behaviour.raw is not None:
            data = behaviour.raw
        handler.send_response(behaviour.status)
        if "Content-Type" not in behaviour.headers:
            handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in behaviour.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def wait_for_site_requests(self, predicate, timeout=10):
        """Wait until ``predicate(site_requests)`` is true."""
        with self._lock:
            if not self._lock.wait_for(lambda: predicate(self.site_requests), timeout):
                raise AssertionError(f"central's site endpoints received {len(self.site_requests)} requests")

    def heartbeats(self):
        """The bodies of every heartbeat received, in order."""
        return [r.body for r in self.site_requests if r.path == "/api/v1/sites/heartbeat/"]

    def watchdog_pings(self):
        """The bodies of every watchdog ping received, in order."""
        return [r.body for r in self.site_requests if r.path == "/api/v1/sites/watchdogs/"]

    def _site_like_central(self, received):
        if received.headers.get("Authorization") != f"Api-Key {GOOD_KEY}":
            return Reply(401, {"error": "authentication_failed", "detail": "Invalid API key."})
        with self._lock:
            if received.path == "/api/v1/sites/heartbeat/":
                acknowledging = "acknowledged" in (received.body.get("capabilities") or [])
                pending = [
                    c
                    for c in self.commands
                    if c["id"] not in self.acks and (acknowledging or c["action"] != "acknowledged")
                ]
                return Reply(200, {"commands": pending})
            if received.path == "/api/v1/sites/parked/":
                for item in received.body["parked"]:
                    self.parked[item["notification_id"]] = item
                    self.unparked.pop(item["notification_id"], None)
                for item in received.body["unparked"]:
                    self.unparked[item["notification_id"]] = item
                    self.parked.pop(item["notification_id"], None)
                return Reply(200, {"parked": len(received.body["parked"]), "unparked": len(received.body["unparked"])})
            if received.path == "/api/v1/sites/watchdogs/":
                return self._ping(received.body)
            action = _SITE_ACTION.match(received.path)
            if action:
                notification_id, verb = action.groups()
                if notification_id not in self.stored:
                    return Reply(404, {"error": "not_found", "detail": "No notification with this id for this site."})
                (self.site_acks if verb == "ack" else self.site_clears).setdefault(notification_id, received.body)
                return Reply(200, self.status_record(notification_id))
            command_id = received.path.split("/")[-3]
            if not any(c["id"] == command_id for c in self.commands):
                return Reply(404, {"error": "not_found", "detail": "No such command for this site."})
            self.acks.setdefault(command_id, received.body)
            return Reply(200, {"id": command_id, "state": self.acks[command_id]["result"]})

    def _ping(self, body):
        missing = [name for name in ("name", "every_seconds", "list_name") if name not in body]
        if missing:
            return Reply(400, {"error": "invalid", "errors": {name: ["This field is required."] for name in missing}})
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() + self.clock_offset))
        pinged = min(body.get("pinged_at") or now, now)
        known = self.watchdogs.get(body["name"])
        last = max(pinged, known["last_ping_at"]) if known else pinged
        self.watchdogs[body["name"]] = {**body, "last_ping_at": last, "state": "ok"}
        return Reply(200, {"name": body["name"], "state": "ok", "last_ping_at": last})

    def _like_central(self, received):
        if received.method == "GET" and received.path == "/healthz":
            return Reply(200, {"status": "ok", "database": "up"})
        if received.headers.get("Authorization") != f"Api-Key {GOOD_KEY}":
            return Reply(401, {"error": "authentication_failed", "detail": "Invalid API key."})
        if received.method == "GET" and received.path.startswith("/api/v1/notifications/?"):
            return Reply(200, {"next": None, "previous": None, "results": []})
        if received.method == "GET":
            notification_id = received.path.rstrip("/").rsplit("/", 1)[-1]
            if notification_id in self.stored:
                return Reply(200, self.status_record(notification_id))
            return Reply(404, {"error": "not_found", "detail": "No notification with this id for this site."})
        items = received.body["notifications"] if received.path.endswith("/batch/") else [received.body]
        throttled = self._draw(items)
        if throttled is not None:
            return throttled
        if received.path.endswith("/batch/"):
            results = []
            for item in received.body["notifications"]:
                outcome = self._ingest(item)
                if outcome == "conflict":
                    results.append(
                        {
                            "notification_id": item["notification_id"],
                            "result": "rejected",
                            "error": "idempotency_conflict",
                            "errors": {"notification_id": ["exists with different content"]},
                        }
                    )
                else:
                    results.append(
                        {
                            "notification_id": item["notification_id"],
                            "result": outcome,
                            "status": self.status_record(item["notification_id"]),
                        }
                    )
            return Reply(200, {"results": results})
        outcome = self._ingest(received.body)
        if outcome == "conflict":
            return Reply(422, {"error": "idempotency_conflict", "detail": "exists with different content"})
        record = self.status_record(received.body["notification_id"])
        return Reply(201 if outcome == "created" else 200, record)

    def _draw(self, items):
        """Take one token per notification from each budget the request needs; a 429 (and
        nothing taken) when one lacks them."""
        needs = {"critical": 0, "other": 0}
        for item in items:
            needs["critical" if item.get("priority") == "critical" else "other"] += 1
        with self._lock:
            for budget, count in needs.items():
                left = self.budgets[budget]
                if count and left is not None and left < count:
                    return Reply(
                        429,
                        {"error": "throttled", "detail": f"Request was throttled ({budget} budget)."},
                        headers={"Retry-After": self.retry_after},
                    )
            for budget, count in needs.items():
                left = self.budgets[budget]
                if left is not None:
                    self.budgets[budget] = left - count
        return None

    def _ingest(self, item):
        with self._lock:
            known = self.stored.get(item["notification_id"])
            if known is None:
                self.stored[item["notification_id"]] = item
                return "created"
            fingerprint = {k: v for k, v in item.items() if k != "delivered_locally_at"}
            if fingerprint != {k: v for k, v in known.items() if k != "delivered_locally_at"}:
                return "conflict"
            if "delivered_locally_at" in item and "delivered_locally_at" not in known:
                self.stored[item["notification_id"]] = {**known, "delivered_locally_at": item["delivered_locally_at"]}
            return "replayed"

    def status_record(self, notification_id):
        item = self.stored[notification_id]
        acknowledged = self.site_acks.get(notification_id)
        return {
            "notification_id": notification_id,
            "type": item["type"],
            "list_name": item["list_name"],
            "status": "Pending",
            "retry_count": 0,
            "last_error": "",
            "site_enqueued_at": item["site_enqueued_at"],
            "created_at": item["site_enqueued_at"],
            "last_attempt_at": None,
            "next_attempt_at": item["site_enqueued_at"],
            "delivered_at": None,
            **({"priority": item["priority"]} if "priority" in item else {}),
            **({"delivered_locally_at": item["delivered_locally_at"]} if "delivered_locally_at" in item else {}),
            **({"acknowledged_via": "site", "acknowledged_by": acknowledged.get("by", "")} if acknowledged else {}),
            **({"cleared": True} if notification_id in self.site_clears else {}),
        }
