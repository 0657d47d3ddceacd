"""Real HTTP receivers on loopback for the channels beyond email: a Teams-like Workflows
endpoint, a webhook receiver that verifies signatures with ``standardwebhooks``, and a fake of
Twilio's Messages API that follows its documented request and answer shapes (and calls the
status callback with a correct signature when asked).

Each receiver is a ThreadingHTTPServer in a background thread. Behaviour is scripted per path:
``receiver.script(path, [Reply(...), …])`` answers the next requests in turn (the last reply
repeats); unscripted paths answer 200 (Teams: 202, like Workflows).
"""

import base64
import collections
import json
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import httpx
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from twilio.request_validator import RequestValidator


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict → JSON; str → text
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (a slow receiver; > the timeout: a timeout)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool | None = None  # webhook receivers: did the signature verify?
    query: str = ""  # the request target's query string, as sent
    status: int | None = None  # the status it was answered with

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        return {key: values[-1] for key, values in urllib.parse.parse_qs(self.body.decode()).items()}


class Receiver:
    """A scripted HTTP server on 127.0.0.1; ``received`` lists every request in order."""

    default_status = 200

    def __init__(self, port: int = 0) -> None:
        self.received: list[Received] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self.arrived = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                target = urllib.parse.urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                record = Received("POST", target.path, headers, body, query=target.query)
                reply = receiver.handle(record)
                record.status = reply.status
                with receiver.arrived:
                    receiver.received.append(record)
                    receiver.arrived.notify_all()
                if reply.delay:
                    time.sleep(reply.delay)
                payload = (
                    json.dumps(reply.body).encode()
                    if isinstance(reply.body, (dict, list))
                    else (reply.body or "").encode()
                )
                try:
                    self.send_response(reply.status)
                    content_type = "application/json" if isinstance(reply.body, (dict, list)) else "text/plain"
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self._handler = Handler
        self.port = port
        self.server: ThreadingHTTPServer | None = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, replies: list[Reply]) -> None:
        with self._lock:
            self._scripts[path] = list(replies)

    def next_reply(self, path: str) -> Reply:
        with self._lock:
            replies = self._scripts.get(path)
            if not replies:
                return Reply(self.default_status)
            return replies.pop(0) if len(replies) > 1 else replies[0]

    def handle(self, record: Received) -> Reply:
        return self.next_reply(record.path)

    def wait_for(self, count: int, timeout: float = 10) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.received) >= count, timeout=timeout):
                raise AssertionError(f"expected {count} requests, got {len(self.received)}")

    def to(self, path: str) -> list[Received]:
        return [record for record in self.received if record.path == path]

    def start(self) -> Self:
        """Listen (again: a stopped receiver comes back on the same port)."""
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening: new connections are refused until :meth:`start`."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def count_by_notification_id(self) -> "collections.Counter[str | None]":
        """Requests received per ``webhook-id`` header (only those that verified, where the
        receiver verifies signatures)."""
        with self._lock:
            return collections.Counter(
                record.headers.get("webhook-id") for record in self.received if record.verified is not False
            )

    def accepted_by_notification_id(self, path: str | None = None) -> "collections.Counter[str | None]":
        """Requests answered 2xx per ``webhook-id`` header (to ``path`` only, if given): what a
        receiver that refused some requests (5xx, a scripted outage) actually took."""
        with self._lock:
            return collections.Counter(
                record.headers.get("webhook-id")
                for record in self.received
                if record.verified is not False
                and record.status is not None
                and 200 <= record.status < 300
                and (path is None or record.path == path)
            )

    def reset(self) -> None:
        with self._lock:
            self.received.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TeamsReceiver(Receiver):
    """A Teams-like Workflows endpoint: accepts a message with an Adaptive Card (202)."""

    default_status = 202

    def handle(self, record: Received) -> Reply:
        reply = self.next_reply(record.path)
        if reply.status < 300:
            try:
                message = record.json()
                card = message["attachments"][0]
                assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
                assert card["content"]["type"] == "AdaptiveCard"
            except (ValueError, KeyError, IndexError, AssertionError):
                return Reply(400, {"error": {"code": "InvalidRequestContent"}})
        return reply


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookReceiver(Receiver):
    """Verifies every request with ``standardwebhooks`` under the path's secret, as a real
    receiver does; a request that does not verify is answered 401."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(port)
        self.secrets: dict[str, str] = {}

    def handle(self, record: Received) -> Reply:
        secret = self.secrets.get(record.path)
        if secret is not None:
            try:
                Webhook(secret).verify(record.body, record.headers)
                record.verified = True
            except WebhookVerificationError:
                record.verified = False
                return Reply(401, {"error": "bad signature"})
        return self.next_reply(record.path)


class TwilioFake(Receiver):
    """Twilio's Messages API as documented: ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json``
    with HTTP basic auth (account SID, auth token) and a form (To, From, Body, StatusCallback);
    answers 201 with the message resource (``sid`` "SM…", ``status`` "queued"), or an error
    object ``{"code", "message", "more_info", "status"}``.

    Numbers with scripted answers (like Twilio's magic test numbers):
    ``INVALID`` → 400 / 21211; ``THROTTLED`` → 429 / 20429 with Retry-After; ``DOWN`` → 503.
    """

    INVALID = "+15005550001"
    THROTTLED = "+15005550429"
    DOWN = "+15005550503"

    def __init__(self, *, account_sid: str, auth_token: str) -> None:
        super().__init__()
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.messages: dict[str, dict[str, str]] = {}  # sid → form

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _error(self, status: int, code: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        body = {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        }
        return Reply(status, body, headers or {})

    def handle(self, record: Received) -> Reply:
        expected_path = f"/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        if record.path != expected_path:
            return self._error(404, 20404, "The requested resource was not found")
        auth = record.headers.get("authorization", "")
        expected = "Basic " + base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if auth != expected:
            return self._error(401, 20003, "Authenticate")
        form = record.form()
        for name in ("To", "From", "Body"):
            if not form.get(name):
                return self._error(
                    400, 21604 if name == "To" else 21603 if name == "From" else 21602, f"'{name}' is required"
                )
        if form["To"] == self.INVALID:
            return self._error(400, 21211, f"Invalid 'To' Phone Number: {form['To']}")
        if form["To"] == self.THROTTLED:
            return self._error(429, 20429, "Too Many Requests", {"Retry-After": "120"})
        if form["To"] == self.DOWN:
            return Reply(503, "Service Unavailable")
        sid = "SM" + secrets.token_hex(16)
        with self._lock:
            self.messages[sid] = form
        return Reply(
            201,
            {
                "sid": sid,
                "account_sid": self.account_sid,
                "to": form["To"],
                "from": form["From"],
                "body": form["Body"],
                "status": "queued",
                "num_segments": "1",
                "direction": "outbound-api",
                "error_code": None,
                "error_message": None,
                "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json",
            },
        )

    def callback(self, sid: str, status: str, *, signature: str | None = None, error_code: str = "") -> httpx.Response:
        """POST the status callback Twilio would send for message ``sid``, signed as Twilio
        signs (or with ``signature`` instead, to test refusals)."""
        form = self.messages[sid]
        url = form["StatusCallback"]
        params = {
            "AccountSid": self.account_sid,
            "From": form["From"],
            "To": form["To"],
            "MessageSid": sid,
            "SmsSid": sid,
            "MessageStatus": status,
            "SmsStatus": status,
            "ApiVersion": "2010-04-01",
        }
        if error_code:
            params["ErrorCode"] = error_code
        headers = {}
        if signature is None:
            signature = RequestValidator(self.auth_token).compute_signature(url, params)
        if signature:
            headers["X-Twilio-Signature"] = signature
        return httpx.post(url, data=params, headers=headers, timeout=10)


def twilio_inbound(
    url: str, *, auth_token: str, from_number: str, body: str, to: str = "+15005550006", signature: str | None = None
) -> httpx.Response:
    """POST the incoming-message webhook Twilio would send to ``url`` for an SMS ``body`` from
    ``from_number``, signed as Twilio signs under ``auth_token`` (or with ``signature``)."""
    params = {
        "AccountSid": "AC" + "0123456789abcdef" * 2,
        "MessageSid": "SM" + secrets.token_hex(16),
        "From": from_number,
        "To": to,
        "Body": body,
        "NumMedia": "0",
        "ApiVersion": "2010-04-01",
    }
    if signature is None:
        signature = RequestValidator(auth_token).compute_signature(url, params)
    headers = {"X-Twilio-Signature": signature} if signature else {}
    return httpx.post(url, data=params, headers=headers, timeout=10)
