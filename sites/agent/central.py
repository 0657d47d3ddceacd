"""The one seam through which the agent talks HTTP to central (standard library only).

Owns the base URL, the ``Authorization: Api-Key`` header, the timeout on every network call,
TLS (a private CA for central, a client certificate for mutual TLS), the route (direct or
through an HTTP proxy) and a keep-alive connection per thread. A request that fails on a reused
keep-alive connection before any answer arrives is sent once more on a fresh connection:
central (or the proxy) may have closed the idle connection, and every request the agent makes
is idempotent (the notification id is the idempotency key), so a resend is safe.

Proxies: ``https://`` central is reached through an ``HTTPS_PROXY`` with a ``CONNECT`` tunnel
(TLS runs end to end, the proxy sees only the host name); ``http://`` central through an
``HTTP_PROXY`` with absolute-form requests. ``NO_PROXY`` lists hosts reached directly. Only
``http://`` proxy URLs are supported; credentials in the proxy URL are sent as
``Proxy-Authorization: Basic``.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Union
from urllib.parse import quote, unquote, urlsplit

NOTIFICATIONS_PATH = "/api/v1/notifications/"
BATCH_PATH = "/api/v1/notifications/batch/"
HEALTH_PATH = "/healthz"
HEARTBEAT_PATH = "/api/v1/sites/heartbeat/"
PARKED_PATH = "/api/v1/sites/parked/"
COMMANDS_PATH = "/api/v1/sites/commands/"
WATCHDOGS_PATH = "/api/v1/sites/watchdogs/"

_MAX_ERROR_TEXT = 2000
# last_error is shown on one line in status, doctor and central's console.
MAX_LINE = 300


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` with every run of whitespace (line breaks included) made one space, cut to
    ``limit`` characters with an ellipsis."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


# How a connection that central (or a proxy) closed shows up; on a reused keep-alive connection
# it means "stale", not "central is down".
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

Connection = Union[http.client.HTTPConnection, http.client.HTTPSConnection]


class CentralUnreachable(Exception):
    """No HTTP answer: connection refused or reset, DNS failure, timeout, TLS failure, a proxy
    that refused the tunnel."""


@dataclass(frozen=True)
class CentralResponse:
    """Central's answer: status, headers (lower-cased names) and the raw body."""

    status: int
    headers: dict[str, str]
    body: bytes
    reason: str = ""

    def json(self) -> Any:
        """The decoded JSON body, or None when there is none or it is not JSON."""
        try:
            return json.loads(self.body) if self.body else None
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to decode
            return None

    def date(self) -> datetime | None:
        """Central's clock from the ``Date`` header (an aware datetime), or None without one."""
        value = self.headers.get("date")
        if not value:
            return None
        try:
            return parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None

    def describe(self) -> str:
        """Central's answer as one short human-readable line, for ``last_error`` and logs. An
        HTML page (a proxy's or load balancer's error page) is named, not quoted."""
        data = self.json()
        parts = [f"HTTP {self.status}"]
        if isinstance(data, dict):
            if data.get("error"):
                parts.append(str(data["error"]))
            if data.get("detail"):
                parts.append(str(data["detail"]))
            if data.get("errors"):
                parts.append(describe_errors(data["errors"]))
        elif self._is_html():
            reason = f" {self.reason}" if self.reason else ""
            return f"HTTP {self.status}{reason} from a proxy or web server (HTML page), not from central's API"
        elif self.body:
            parts.append(self.body[:MAX_LINE].decode("utf-8", "replace"))
        if len(parts) == 1 and self.reason:
            return f"HTTP {self.status} {one_line(self.reason, 80)}"
        return one_line(": ".join(parts))

    def _is_html(self) -> bool:
        if "html" in self.headers.get("content-type", "").lower():
            return True
        # Central's API answers JSON; a body starting with a tag is some proxy's page.
        return self.body[:200].lstrip().startswith(b"<")


def describe_errors(errors: object) -> str:
    """Per-field errors ``{"subject": ["…"]}`` as ``subject: …; body: …``."""
    if not isinstance(errors, dict):
        return str(errors)[:_MAX_ERROR_TEXT]
    lines = []
    for field, messages in errors.items():
        if isinstance(messages, list):
            messages = " ".join(str(message) for message in messages)
        lines.append(f"{field}: {messages}")
    return "; ".join(lines)[:_MAX_ERROR_TEXT]


# --- proxies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it listens and the ``Proxy-Authorization`` value, if any."""

    host: str
    port: int
    authorization: str | None = None

    @property
    def display(self) -> str:
        """``http://host:port`` without credentials, for messages."""
        return f"http://{self.host}:{self.port}"


def parse_proxy(url: str) -> Proxy:
    """A :class:`Proxy` from ``http://[user:password@]host[:port]`` (``host:port`` alone means
    http). ValueError for another scheme or a URL without a host."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme.lower() != "http":
        raise ValueError(f"only http:// proxies are supported (got {parts.scheme}://…)")
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError(f"the proxy URL {url!r} has an invalid port") from None
    if not parts.hostname:
        raise ValueError(f"the proxy URL {url!r} has no host")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode("utf-8")).decode("ascii")
    return Proxy(host=parts.hostname, port=port, authorization=authorization)


def proxy_from_environment(scheme: str) -> str | None:
    """The proxy URL for ``scheme`` from ``https_proxy``/``HTTPS_PROXY`` or
    ``http_proxy``/``HTTP_PROXY`` (lower case first, as curl and urllib read them), or None."""
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def no_proxy_from_environment() -> str:
    """``no_proxy`` / ``NO_PROXY`` (lower case first), or an empty string."""
    for name in ("no_proxy", "NO_PROXY"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return ""


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """True when ``host:port`` is listed in ``no_proxy``.

    Entries are separated by commas or spaces: ``*`` (everything), a host name that matches
    itself and its subdomains (``example.com`` and ``.example.com`` both match
    ``central.example.com``), an IP address or CIDR range (``10.0.0.0/8``), each optionally with
    ``:port``.
    """
    host = host.strip("[]").rstrip(".").lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy.replace(",", " ").split():
        entry = entry.strip().lower()
        if entry == "*":
            return True
        entry_host, entry_port = _split_host_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry_host, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry_host.lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:8000
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, int(port) if port.isdigit() else None
    return entry, None  # a name, or a bare IPv6 address/range


# --- TLS -------------------------------------------------------------------------------------


def tls_context(
    *, ca_file: str | None = None, client_cert: str | None = None, client_key: str | None = None
) -> ssl.SSLContext:
    """The TLS settings for central: certificate and host name always verified.

    ``ca_file`` (PEM): when given, only the CAs in it are trusted for central (a private CA);
    otherwise the system's trust store. ``client_cert`` (PEM, may hold the key too) and
    ``client_key``: the certificate this site presents for mutual TLS. ValueError naming the
    file when one cannot be loaded.
    """
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load the CA file {ca_file!r} (OUTBOX_CA_FILE / --ca-file): {error}") from None
    if client_key and not client_cert:
        raise ValueError("a client key (OUTBOX_CLIENT_KEY) needs a client certificate (OUTBOX_CLIENT_CERT)")
    if client_cert:
        try:
            context.load_cert_chain(client_cert, client_key or None)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(
                f"cannot load the client certificate {client_cert!r}"
                f"{f' with key {client_key!r}' if client_key else ''} (OUTBOX_CLIENT_CERT / OUTBOX_CLIENT_KEY): "
                f"{error}"
            ) from None
    return context


# --- the client ------------------------------------------------------------------------------


class CentralClient:
    """HTTP(S) client for central's ingest and status API.

    ``proxy``: None takes ``HTTPS_PROXY``/``HTTP_PROXY`` from the environment; ``""`` means
    no proxy; otherwise an ``http://[user:password@]host:port`` URL. ``no_proxy``: None takes
    ``NO_PROXY`` from the environment; otherwise a list as :func:`bypasses_proxy` reads it.
    ``ca_file``, ``client_cert``, ``client_key``: see :func:`tls_context` (https only).
    Raises ValueError for a malformed URL, an empty key or a TLS file that cannot be loaded.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        proxy: str | None = None,
        no_proxy: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ValueError(f"central URL must look like http(s)://host[:port][/prefix], got {base_url!r}")
        if not api_key:
            raise ValueError("the site API key is empty")
        self.base_url = base_url
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = float(timeout)
        self._tls: ssl.SSLContext | None = None
        if self._scheme == "https":
            self._tls = tls_context(ca_file=ca_file, client_cert=client_cert, client_key=client_key)
        elif ca_file or client_cert or client_key:
            raise ValueError(f"a CA file or client certificate is set, but central's URL {base_url!r} is not https://")
        proxy_url = proxy_from_environment(self._scheme) if proxy is None else proxy.strip()
        no_proxy_list = no_proxy_from_environment() if no_proxy is None else no_proxy
        self.proxy: Proxy | None = None
        if proxy_url and not bypasses_proxy(self._host, self._port, no_proxy_list):
            self.proxy = parse_proxy(proxy_url)
        self._local = threading.local()
        self._connections: set[Connection] = set()  # every thread's, so close() can close them all
        self._connections_lock = threading.Lock()

    @property
    def route(self) -> str:
        """How central is reached, for logs and ``doctor``: ``direct`` or ``via proxy http://…``."""
        return f"via proxy {self.proxy.display}" if self.proxy is not None else "direct"

    def _new_connection(self) -> Connection:
        connection: Connection
        if self.proxy is None:
            if self._tls is not None:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout, context=self._tls
                )
            else:
                connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        elif self._tls is not None:
            # CONNECT tunnel; http.client verifies the certificate against the tunnel's host.
            connection = http.client.HTTPSConnection(
                self.proxy.host, self.proxy.port, timeout=self.timeout, context=self._tls
            )
            tunnel_headers = {"Proxy-Authorization": self.proxy.authorization} if self.proxy.authorization else None
            connection.set_tunnel(self._host, self._port, headers=tunnel_headers)
        else:
            connection = http.client.HTTPConnection(self.proxy.host, self.proxy.port, timeout=self.timeout)
        with self._connections_lock:
            self._connections.add(connection)
        return connection

    def close(self) -> None:
        """Close every thread's connection; the next request opens a new one."""
        with self._connections_lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            connection.close()
        self._local = threading.local()

    def __enter__(self) -> CentralClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(
        self, method: str, path: str, payload: str | None = None, *, authenticated: bool = True
    ) -> CentralResponse:
        """Send one request; return the answer whatever its status.

        ``payload`` is a str of JSON (already encoded, so the stored bytes are sent as they
        are) or None. Raises :class:`CentralUnreachable` when there is no answer.
        """
        body = payload.encode("utf-8") if payload is not None else None
        headers = {"Accept": "application/json"}
        if authenticated:
            headers["Authorization"] = f"Api-Key {self._api_key}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        url = self._prefix + path
        if self.proxy is not None and self._tls is None:
            # A plain-HTTP proxy forwards absolute-form requests.
            url = f"http://{self._host}:{self._port}{url}"
            if self.proxy.authorization:
                headers["Proxy-Authorization"] = self.proxy.authorization
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
            raise CentralUnreachable(self._network_error_text(error)) from error
        except BaseException:
            self._drop(connection)
            raise

    def _drop(self, connection: Connection) -> None:
        connection.close()
        self._local.connection = None
        with self._connections_lock:
            self._connections.discard(connection)

    def _exchange(
        self, connection: Connection, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> CentralResponse:
        try:
            connection.request(method, url, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except _DROPPED:
            raise
        except (OSError, http.client.HTTPException) as error:
            raise CentralUnreachable(self._network_error_text(error)) from error
        answer = CentralResponse(
            status=response.status,
            headers={name.lower(): value for name, value in response.getheaders()},
            body=data,
            reason=response.reason or "",
        )
        if response.will_close:
            self._drop(connection)
        return answer

    def _network_error_text(self, error: BaseException) -> str:
        where = self.base_url if self.proxy is None else f"{self.base_url} via proxy {self.proxy.display}"
        if isinstance(error, (TimeoutError, socket.timeout)):  # distinct classes before Python 3.10
            return f"central did not answer within the timeout ({where})"
        text = str(error) or type(error).__name__
        hint = ""
        if isinstance(error, ssl.SSLCertVerificationError):
            hint = " — if central's certificate comes from a private CA, set OUTBOX_CA_FILE (--ca-file)"
        return one_line(f"central unreachable ({where}): {type(error).__name__}: {text}{hint}", 2 * MAX_LINE)

    # --- the API ----------------------------------------------------------------------------

    def post_notification(self, payload: str) -> CentralResponse:
        """POST one stored payload to the ingest endpoint."""
        return self.request("POST", NOTIFICATIONS_PATH, payload)

    def post_batch(self, payloads: list[str]) -> CentralResponse:
        """POST stored payload strings as one batch, splicing the JSON text unchanged."""
        return self.request("POST", BATCH_PATH, '{"notifications": [' + ", ".join(payloads) + "]}")

    def get_status(self, notification_id: str) -> CentralResponse:
        """GET one notification's status record."""
        return self.request("GET", f"{NOTIFICATIONS_PATH}{quote(str(notification_id))}/")

    def get_health(self) -> CentralResponse:
        """GET central's health check (no key needed): 200 when its database answers."""
        return self.request("GET", HEALTH_PATH, authenticated=False)

    def post_heartbeat(self, report: dict[str, Any]) -> CentralResponse:
        """POST the site's state; central answers with the operator commands waiting for it."""
        return self.request("POST", HEARTBEAT_PATH, json.dumps(report, separators=(",", ":")))

    def post_parked(self, report: dict[str, Any]) -> CentralResponse:
        """POST rows that became parked at the site and rows that left that state."""
        return self.request("POST", PARKED_PATH, json.dumps(report, ensure_ascii=False, separators=(",", ":")))

    def post_command_ack(self, command_id: str, *, result: str, detail: str) -> CentralResponse:
        """POST the result of one executed operator command."""
        body = json.dumps({"result": result, "detail": detail}, ensure_ascii=False, separators=(",", ":"))
        return self.request("POST", f"{COMMANDS_PATH}{quote(str(command_id))}/ack/", body)

    def post_watchdog(self, ping: dict[str, Any]) -> CentralResponse:
        """POST one watchdog's latest ping."""
        return self.request("POST", WATCHDOGS_PATH, json.dumps(ping, ensure_ascii=False, separators=(",", ":")))

    def post_site_action(self, notification_id: str, action: str, body: str) -> CentralResponse:
        """POST the site's acknowledgement (``action`` ``ack``) or clearing (``clear``) of one
        of its notifications; ``body`` is the stored JSON text."""
        return self.request("POST", f"{NOTIFICATIONS_PATH}{quote(str(notification_id))}/{action}/", body)

    def check_key(self) -> CentralResponse:
        """An authenticated read that changes nothing: the site's newest notification."""
        return self.request("GET", NOTIFICATIONS_PATH + "?page_size=1")
