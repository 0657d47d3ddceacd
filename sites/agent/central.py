"""The one seam through which the agent talks HTTP to central (standard library only).

Owns the base URL, the ``Authorization: Api-Key`` header, the timeout on every network call and
a keep-alive connection per thread. A request that fails on a reused keep-alive connection
before any answer arrives is sent once more on a fresh connection: central may have closed the
idle connection, and every request the agent makes is idempotent (the notification id is the
idempotency key), so a resend is safe.
"""

import http.client
import json
import threading
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

NOTIFICATIONS_PATH = "/api/v1/notifications/"
BATCH_PATH = "/api/v1/notifications/batch/"

_MAX_ERROR_TEXT = 2000


# How a connection that central (or a proxy) closed shows up; on a reused keep-alive connection
# it means "stale", not "central is down".
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class CentralUnreachable(Exception):
    """No HTTP answer: connection refused or reset, DNS failure, timeout, TLS failure."""


@dataclass(frozen=True)
class CentralResponse:
    status: int
    headers: dict  # lower-cased header names
    body: bytes

    def json(self):
        """The decoded JSON body, or None when there is none or it is not JSON."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def describe(self):
        """Central's answer as one human-readable line, for ``last_error`` and logs."""
        data = self.json()
        parts = [f"HTTP {self.status}"]
        if isinstance(data, dict):
            if data.get("error"):
                parts.append(str(data["error"]))
            if data.get("detail"):
                parts.append(str(data["detail"]))
            if data.get("errors"):
                parts.append(describe_errors(data["errors"]))
        elif self.body:
            parts.append(self.body[:300].decode("utf-8", "replace").strip())
        return ": ".join(parts)[:_MAX_ERROR_TEXT]


def describe_errors(errors):
    """Per-field errors ``{"subject": ["…"]}`` as ``subject: …; body: …``."""
    if not isinstance(errors, dict):
        return str(errors)[:_MAX_ERROR_TEXT]
    lines = []
    for field, messages in errors.items():
        if isinstance(messages, list):
            messages = " ".join(str(message) for message in messages)
        lines.append(f"{field}: {messages}")
    return "; ".join(lines)[:_MAX_ERROR_TEXT]


class CentralClient:
    """HTTP(S) client for central's ingest and status API."""

    def __init__(self, base_url, api_key, *, timeout=10.0):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"central URL must look like http(s)://host[:port][/prefix], got {base_url!r}")
        if not api_key:
            raise ValueError("the site API key is empty")
        self.base_url = base_url
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = float(timeout)
        self._local = threading.local()
        self._connections = set()  # every thread's, so close() can close them all
        self._connections_lock = threading.Lock()

    def _new_connection(self):
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        connection = cls(self._host, self._port, timeout=self.timeout)
        with self._connections_lock:
            self._connections.add(connection)
        return connection

    def close(self):
        """Close every thread's connection; the next request opens a new one."""
        with self._connections_lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            connection.close()
        self._local = threading.local()

    def request(self, method, path, payload=None):
        """Send one request; return the answer whatever its status.

        ``payload`` is a str of JSON (already encoded, so the stored bytes are sent as they
        are) or None. Raises :class:`CentralUnreachable` when there is no answer.
        """
        body = payload.encode("utf-8") if payload is not None else None
        headers = {"Authorization": f"Api-Key {self._api_key}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        url = self._prefix + path
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            try:
                return self._exchange(connection, method, url, body, headers)
            except _DROPPED:
                self._drop(connection)  # central closed the idle keep-alive connection: one fresh try
            except BaseException:
                self._drop(connection)
                raise
        connection = self._local.connection = self._new_connection()
        try:
            return self._exchange(connection, method, url, body, headers)
        except _DROPPED as error:
            self._drop(connection)
            raise CentralUnreachable(_network_error_text(error, self.base_url)) from error
        except BaseException:
            self._drop(connection)
            raise

    def _drop(self, connection):
        connection.close()
        self._local.connection = None
        with self._connections_lock:
            self._connections.discard(connection)

    def _exchange(self, connection, method, url, body, headers):
        try:
            connection.request(method, url, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except _DROPPED:
            raise
        except (OSError, http.client.HTTPException) as error:
            raise CentralUnreachable(_network_error_text(error, self.base_url)) from error
        answer = CentralResponse(
            status=response.status,
            headers={name.lower(): value for name, value in response.getheaders()},
            body=data,
        )
        if response.will_close:
            self._drop(connection)
        return answer

    # --- the API ----------------------------------------------------------------------------

    def post_notification(self, payload):
        return self.request("POST", NOTIFICATIONS_PATH, payload)

    def post_batch(self, payloads):
        """POST stored payload strings as one batch, splicing the JSON text unchanged."""
        return self.request("POST", BATCH_PATH, '{"notifications": [' + ", ".join(payloads) + "]}")

    def get_status(self, notification_id):
        return self.request("GET", f"{NOTIFICATIONS_PATH}{quote(str(notification_id))}/")


def _network_error_text(error, base_url):
    if isinstance(error, TimeoutError):
        return f"central did not answer within the timeout ({base_url})"
    text = str(error) or type(error).__name__
    return f"central unreachable ({base_url}): {type(error).__name__}: {text}"[:_MAX_ERROR_TEXT]
