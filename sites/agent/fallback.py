"""The local fallback: when central has been unreachable for a while, the site's urgent
notifications go out through a local SMTP relay — a Postfix on the agent's machine, the plant's
Exchange — once each, and stay buffered until central has them.

Configuration (``SiteOutbox(..., fallback={...})`` or ``"fallback"`` in the agent's
configuration file), checked when the agent starts::

    {"after_seconds": 300, "min_priority": "high",
     "smtp": {"host": "127.0.0.1", "port": 25, "security": "none", "username": "", "password": "",
              "from_address": "outbox-agent@plant-a.example.com", "to": ["control-room@plant-a.example.com"],
              "timeout_seconds": 30, "ca_file": null}}

Central counts as unreachable when every attempt for ``after_seconds`` failed to connect, timed
out, got a 5xx or had the key refused (a 429 is an answer, not an outage; see
:mod:`sites.agent.state`). Then every buffered row at or above ``min_priority`` is sent to the
relay's recipients, plain text, subject ``[sent locally by site <site>] <subject>``, with its
id in ``X-Notification-Id``. The row stays in the buffer; when central is back it is forwarded
with ``delivered_locally_at`` so central knows.

**At most one local copy per notification**, even when the agent is killed mid-delivery and
even when several processes forward from one buffer:

1. A row is *claimed* in the buffer (an atomic update with a token unique to the attempt and a
   lease) before the relay is contacted; only the claimant talks to the relay about it.
2. The agent sends ``DATA`` and the message's content, then commits ``ending`` for the row —
   still under its claim — and only then sends the final ``.`` that makes the relay take the
   message. If the commit fails (the row was forwarded to central meanwhile, or another process
   took it over after the lease ran out), the final dot is never sent and the relay drops the
   unfinished message.
3. From ``ending`` on the row is never sent locally again: the relay's answer records
   ``delivered`` (or ``failed`` for an explicit refusal, which is retried); no answer (a
   timeout, the agent killed) leaves it ``unknown``. An unknown row is forwarded to central
   without ``delivered_locally_at``, so central delivers it too: a possible second copy through
   central rather than a possible loss.

A relay that cannot be reached or refuses is tried again every ``retry_interval`` (the
forwarder's), on a thread of its own, so it never holds up forwarding to central.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import re
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from email.utils import format_datetime
from typing import TYPE_CHECKING, Any, Callable, Mapping

from sites.agent.buffer import (
    LOCAL_DELIVERED,
    LOCAL_FAILED,
    LOCAL_UNKNOWN,
    Buffer,
    BufferedRow,
    iso_utc,
)
from sites.agent.central import one_line
from sites.agent.contract import PRIORITIES, priority_rank
from sites.agent.state import LinkSnapshot, LinkState

if TYPE_CHECKING:
    from sites.agent.stopping import StopEvent

logger = logging.getLogger("sites.agent")

SECURITY_MODES = ("none", "starttls", "tls")
DEFAULT_PORTS = {"none": 25, "starttls": 587, "tls": 465}
DEFAULT_AFTER_SECONDS = 300.0
DEFAULT_MIN_PRIORITY = "high"
DEFAULT_TIMEOUT_SECONDS = 30.0
# Rows handed to the relay per pass; the next pass (one sweep later) takes the rest.
PASS_LIMIT = 100

_TOP_KEYS = ("after_seconds", "min_priority", "smtp")
_SMTP_KEYS = ("host", "port", "security", "username", "password", "from_address", "to", "timeout_seconds", "ca_file")
_ADDRESS = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
_LINE_START_DOT = re.compile(rb"(?m)^\.")


class FallbackConfigError(ValueError):
    """The fallback configuration is wrong; the message names the setting."""


@dataclass(frozen=True)
class RelaySettings:
    """How to reach the local relay and whom to send to."""

    host: str
    port: int
    security: str
    username: str
    password: str
    from_address: str
    to: tuple[str, ...]
    timeout: float
    ca_file: str | None

    @property
    def display(self) -> str:
        """``host:port (security)`` for messages; never the password."""
        return f"{self.host}:{self.port} ({self.security})"


@dataclass(frozen=True)
class FallbackConfig:
    """A checked fallback configuration."""

    after_seconds: float
    min_priority: str
    smtp: RelaySettings

    @property
    def max_rank(self) -> int:
        """Rows of this rank (0 critical … 3 low) or more urgent go to the relay."""
        return priority_rank(self.min_priority)


def _number(value: object, name: str, *, minimum: float, strictly: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FallbackConfigError(f"{name} must be a number of seconds, got {value!r}")
    if value < minimum or (strictly and value == minimum):
        raise FallbackConfigError(
            f"{name} must be {'more than' if strictly else 'at least'} {minimum:g}, got {value!r}"
        )
    return float(value)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise FallbackConfigError(f"{name} must be a string, got {value!r}")
    if "\r" in value or "\n" in value or "\x00" in value:
        raise FallbackConfigError(f"{name} must be one line")
    return value


def _address(value: object, name: str) -> str:
    text = _text(value, name).strip()
    if not _ADDRESS.match(text):
        raise FallbackConfigError(f"{name} is not an email address: {text!r}")
    return text


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def fallback_config(value: Mapping[str, Any] | None) -> FallbackConfig | None:
    """A :class:`FallbackConfig` from the ``fallback`` object (None: no fallback).
    :class:`FallbackConfigError` (a ValueError) naming the setting that is wrong."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise FallbackConfigError(f"fallback must be an object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(_TOP_KEYS))
    if unknown:
        raise FallbackConfigError(f"fallback: unknown setting {unknown[0]!r} (known: {', '.join(_TOP_KEYS)})")
    after = _number(value.get("after_seconds", DEFAULT_AFTER_SECONDS), "fallback.after_seconds", minimum=0)
    min_priority = value.get("min_priority", DEFAULT_MIN_PRIORITY)
    if min_priority not in PRIORITIES:
        raise FallbackConfigError(f"fallback.min_priority must be one of {', '.join(PRIORITIES)}, got {min_priority!r}")
    smtp = value.get("smtp")
    if not isinstance(smtp, Mapping):
        raise FallbackConfigError("fallback.smtp is required: the local relay's host, from_address and to")
    unknown = sorted(set(smtp) - set(_SMTP_KEYS))
    if unknown:
        raise FallbackConfigError(f"fallback.smtp: unknown setting {unknown[0]!r} (known: {', '.join(_SMTP_KEYS)})")
    host = _text(smtp.get("host", ""), "fallback.smtp.host").strip()
    if not host or " " in host:
        raise FallbackConfigError(f"fallback.smtp.host must be a host name or address, got {host!r}")
    security = smtp.get("security", "none")
    if security not in SECURITY_MODES:
        raise FallbackConfigError(
            f"fallback.smtp.security must be one of {', '.join(SECURITY_MODES)}, got {security!r}"
        )
    port = smtp.get("port", DEFAULT_PORTS[security])
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise FallbackConfigError(f"fallback.smtp.port must be a port number (1–65535), got {port!r}")
    username = _text(smtp.get("username", ""), "fallback.smtp.username")
    password = _text(smtp.get("password", ""), "fallback.smtp.password")
    if bool(username) != bool(password):
        raise FallbackConfigError("fallback.smtp.username and fallback.smtp.password go together: set both or neither")
    if username and security == "none" and not _is_loopback(host):
        raise FallbackConfigError(
            "fallback.smtp.security is 'none' but a username is set: the password would cross the network in "
            "clear; use 'starttls' or 'tls'"
        )
    from_address = _address(smtp.get("from_address", ""), "fallback.smtp.from_address")
    recipients = smtp.get("to")
    if not isinstance(recipients, list) or not recipients:
        raise FallbackConfigError("fallback.smtp.to must be a non-empty list of email addresses")
    to = tuple(_address(item, f"fallback.smtp.to[{index}]") for index, item in enumerate(recipients))
    timeout = _number(
        smtp.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS), "fallback.smtp.timeout_seconds", minimum=0, strictly=True
    )
    ca_file = smtp.get("ca_file")
    if ca_file is not None:
        ca_file = _text(ca_file, "fallback.smtp.ca_file")
        if security == "none":
            raise FallbackConfigError("fallback.smtp.ca_file is set but security is 'none'")
        _tls_context(ca_file)  # fails now, naming the file, rather than at the first outage
    return FallbackConfig(
        after_seconds=after,
        min_priority=min_priority,
        smtp=RelaySettings(
            host=host,
            port=port,
            security=security,
            username=username,
            password=password,
            from_address=from_address,
            to=to,
            timeout=timeout,
            ca_file=ca_file or None,
        ),
    )


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise FallbackConfigError(f"fallback.smtp.ca_file {ca_file!r} cannot be loaded: {error}") from None


def relay_connect(settings: RelaySettings) -> smtplib.SMTP:
    """An open, greeted (and, as configured, encrypted and logged-in) connection to the relay.
    Raises OSError or smtplib.SMTPException."""
    context = _tls_context(settings.ca_file) if settings.security != "none" else None
    smtp: smtplib.SMTP
    if settings.security == "tls":
        smtp = smtplib.SMTP_SSL(settings.host, settings.port, timeout=settings.timeout, context=context)
    else:
        smtp = smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout)
    try:
        smtp.ehlo()
        if settings.security == "starttls":
            smtp.starttls(context=context)
            smtp.ehlo()
        if settings.username:
            smtp.login(settings.username, settings.password)
    except BaseException:
        smtp.close()
        raise
    return smtp


def relay_check(settings: RelaySettings) -> str:
    """Connect, greet, encrypt and log in as configured, then quit: nothing is sent. Returns the
    relay's greeting name; raises OSError or smtplib.SMTPException."""
    smtp = relay_connect(settings)
    try:
        name = (smtp.ehlo_resp or b"").split(b"\n", 1)[0].decode("ascii", "replace").strip()
        smtp.quit()
    finally:
        smtp.close()
    return name


def local_message(
    *,
    row: BufferedRow,
    payload: Mapping[str, Any],
    settings: RelaySettings,
    site: str,
    central_url: str,
    snapshot: LinkSnapshot,
    now: datetime,
) -> EmailMessage:
    """The plain-text email the relay gets for ``row``."""
    since = iso_utc(snapshot.unreachable_since) if snapshot.unreachable_since is not None else "a while"
    message = EmailMessage(policy=SMTP_POLICY)
    subject = one_line(str(payload.get("subject") or ""), 900)
    message["Subject"] = f"[sent locally by site {site}] {subject}"
    message["From"] = settings.from_address
    message["To"] = ", ".join(settings.to)
    message["Date"] = format_datetime(now)
    message["Message-ID"] = f"<{row.notification_id}.local@{_id_domain(site)}>"
    message["X-Notification-Id"] = row.notification_id
    if row.priority in ("critical", "high"):
        message["Importance"] = "high"
        message["X-Priority"] = "1 (Highest)"
    source = " / ".join(part for part in (payload.get("source_instance_id"), payload.get("source_script")) if part)
    lines = [
        f"Central ({central_url}) has been unreachable from site {site} since {since}"
        + (f" (last error: {snapshot.last_error})." if snapshot.last_error else "."),
        "The site agent sent this notification through the local relay. Central receives it when it is back",
        "and is told it was delivered here.",
        "",
        f"Priority: {row.priority}",
        f"List: {payload.get('list_name') or ''}",
        f"Raised at the site: {payload.get('site_enqueued_at') or row.created_at}",
    ]
    if source:
        lines.append(f"Source: {source}")
    lines += [f"Notification id: {row.notification_id}", "", str(payload.get("body") or "")]
    message.set_content("\n".join(lines) + "\n", charset="utf-8")
    return message


def _id_domain(site: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9.-]+", "-", site).strip(".-")
    return (cleaned or "site") + ".outbox-agent"


def _data_bytes(message: EmailMessage) -> bytes:
    """The message as DATA content: CRLF lines, dot-stuffed, ending with CRLF (the final ``.``
    is sent apart)."""
    data = message.as_bytes(policy=SMTP_POLICY)
    data = _LINE_START_DOT.sub(b"..", data)
    return data if data.endswith(b"\r\n") else data + b"\r\n"


@dataclass
class FallbackResult:
    """What one pass did."""

    active: bool = False
    delivered: int = 0
    failed: int = 0
    unknown: int = 0
    relay_unreachable: bool = False


class _RelayDown(Exception):
    """The relay could not be reached or would not let us in: stop the pass."""


class LocalFallback:
    """Delivers urgent buffered notifications through the local relay while central is
    unreachable (see the module docstring). ``run_pass`` is called after forwarding sweeps; it
    does nothing unless the fallback is active and the relay is not being waited out."""

    def __init__(
        self,
        *,
        config: FallbackConfig,
        buffer: Buffer,
        state: LinkState,
        clock: Callable[[], datetime],
        site: str,
        central_url: str,
        retry_interval: float,
    ) -> None:
        self.config = config
        self.buffer = buffer
        self.state = state
        self.clock = clock
        self.site = site
        self.central_url = central_url
        self.retry_interval = float(retry_interval)
        self._relay_wait_until: datetime | None = None
        # Long enough for every step before the final dot to time out once.
        self.lease_seconds = max(60.0, 8 * config.smtp.timeout)

    def active(self, snapshot: LinkSnapshot | None = None) -> bool:
        """True when central has been unreachable for ``after_seconds``."""
        snapshot = snapshot or self.state.snapshot()
        return snapshot.unreachable_since is not None and snapshot.unreachable_for() >= self.config.after_seconds

    def report(self) -> dict[str, Any]:
        """The heartbeat's ``fallback`` object."""
        snapshot = self.state.snapshot()
        return {
            "configured": True,
            "active": self.active(snapshot),
            "delivered": snapshot.fallback["delivered"],
            "failing": self.buffer.local_counts()[LOCAL_FAILED],
            "last_error": snapshot.fallback["last_error"],
            "last_error_at": snapshot.fallback["last_error_at"],
        }

    def run_pass(self, *, stop_event: StopEvent | None = None) -> FallbackResult:
        """Hand each eligible row to the relay once (see the module docstring)."""
        result = FallbackResult()
        now = self.clock()
        self.buffer.local_expire_endings(now=iso_utc(now))
        snapshot = self.state.snapshot()
        if not self.active(snapshot):
            return result
        result.active = True
        if self._relay_wait_until is not None and now < self._relay_wait_until:
            return result
        self._relay_wait_until = None
        rows = self.buffer.local_candidates(now=iso_utc(now), max_rank=self.config.max_rank, limit=PASS_LIMIT)
        for row in rows:
            if stop_event is not None and stop_event.is_set():
                break
            try:
                outcome = self._deliver(row, snapshot)
            except _RelayDown:
                result.relay_unreachable = True
                result.failed += 1
                self._relay_wait_until = self.clock() + timedelta(seconds=self.retry_interval)
                break
            if outcome == LOCAL_DELIVERED:
                result.delivered += 1
            elif outcome == LOCAL_FAILED:
                result.failed += 1
            elif outcome == LOCAL_UNKNOWN:
                result.unknown += 1
        return result

    def _retry_at(self) -> str:
        return iso_utc(self.clock() + timedelta(seconds=self.retry_interval))

    def _fail(self, row: BufferedRow, claim: str, error: str) -> None:
        error = one_line(f"local relay {self.config.smtp.display}: {error}")
        self.buffer.local_finish(
            row.notification_id,
            claim=claim,
            state=LOCAL_FAILED,
            now=iso_utc(self.clock()),
            error=error,
            retry_at=self._retry_at(),
        )
        self.state.fallback_failed(error)
        logger.warning("Local fallback: notification %s not delivered, retrying later: %s", row.notification_id, error)

    def _deliver(self, row: BufferedRow, snapshot: LinkSnapshot) -> str | None:
        """One attempt for one row. Returns the local state it ended in, None when another
        process holds the row or it went to central meanwhile."""
        claim = uuid.uuid4().hex
        now = self.clock()
        lease_until = iso_utc(now + timedelta(seconds=self.lease_seconds))
        if not self.buffer.local_claim(row.notification_id, claim=claim, now=iso_utc(now), until=lease_until):
            return None
        try:
            payload = json.loads(row.payload)
        except (ValueError, RecursionError):
            payload = None
        if not isinstance(payload, dict):
            self._fail(row, claim, "the buffered payload cannot be decoded")
            return LOCAL_FAILED
        message = local_message(
            row=row,
            payload=payload,
            settings=self.config.smtp,
            site=self.site,
            central_url=self.central_url,
            snapshot=snapshot,
            now=now,
        )
        settings = self.config.smtp
        try:
            smtp = relay_connect(settings)
        except (OSError, smtplib.SMTPException) as error:
            self._fail(row, claim, f"cannot connect: {type(error).__name__}: {error}")
            raise _RelayDown() from None
        try:
            return self._transaction(smtp, row, claim, message)
        finally:
            smtp.close()

    def _transaction(self, smtp: smtplib.SMTP, row: BufferedRow, claim: str, message: EmailMessage) -> str | None:
        settings = self.config.smtp
        try:
            code, reply = smtp.mail(settings.from_address)
            if code != 250:
                self._fail(row, claim, f"MAIL FROM refused: {code} {_text_of(reply)}")
                return LOCAL_FAILED
            refused = []
            for recipient in settings.to:
                code, reply = smtp.rcpt(recipient)
                if code not in (250, 251):
                    refused.append(f"{recipient}: {code} {_text_of(reply)}")
            if len(refused) == len(settings.to):
                smtp.rset()
                self._fail(row, claim, "every recipient refused: " + "; ".join(refused))
                return LOCAL_FAILED
            code, reply = smtp.docmd("DATA")
            if code != 354:
                self._fail(row, claim, f"DATA refused: {code} {_text_of(reply)}")
                return LOCAL_FAILED
            smtp.send(_data_bytes(message))
        except (OSError, smtplib.SMTPException) as error:
            self._fail(row, claim, f"{type(error).__name__}: {error}")
            raise _RelayDown() from None
        # The point of no return: recorded on disk before the relay can take the message.
        lease_until = iso_utc(self.clock() + timedelta(seconds=self.lease_seconds))
        if not self.buffer.local_ending(row.notification_id, claim=claim, until=lease_until):
            # Forwarded to central meanwhile, or taken over after our lease ran out: the
            # relay never sees the message's end and drops it.
            logger.info("Local fallback: %s was taken by central or another process; not sent", row.notification_id)
            return None
        try:
            smtp.send(b".\r\n")
            code, reply = smtp.getreply()
        except (OSError, smtplib.SMTPException) as error:
            self.buffer.local_finish(
                row.notification_id,
                claim=claim,
                state=LOCAL_UNKNOWN,
                now=iso_utc(self.clock()),
                error=one_line(
                    f"local relay {settings.display} did not answer the message's end ({type(error).__name__}: "
                    f"{error}); it may have it, so it is not sent again"
                ),
            )
            logger.warning("Local fallback: no answer from the relay for %s; not sent again", row.notification_id)
            return LOCAL_UNKNOWN
        if code == 250:
            self.buffer.local_finish(row.notification_id, claim=claim, state=LOCAL_DELIVERED, now=iso_utc(self.clock()))
            self.state.fallback_delivered()
            if refused:
                logger.warning("Local fallback: %s refused by some recipients: %s", row.notification_id, refused)
            logger.warning(
                "Local fallback: notification %s delivered through %s to %s",
                row.notification_id,
                settings.display,
                ", ".join(settings.to),
            )
            with contextlib.suppress(OSError, smtplib.SMTPException):  # a polite goodbye, nothing more
                smtp.quit()
            return LOCAL_DELIVERED
        self._fail(row, claim, f"message refused: {code} {_text_of(reply)}")
        return LOCAL_FAILED


def _text_of(reply: bytes | str) -> str:
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    return str(reply)
