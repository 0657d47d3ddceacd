"""Email over SMTP, with smtplib directly.

Django's SMTP backend reports only "sent" or an exception, and loses which recipients the
server refused; the audit snapshot (``resolved_targets``) needs every recipient's outcome, so
this adapter speaks the transaction itself: MAIL FROM, one RCPT TO per recipient, DATA.

A session keeps a small pool of open connections for a batch; any dispatcher thread takes one,
uses it for one message and gives it back, so a batch of 200 costs ``concurrency`` TCP (and TLS)
handshakes, not 200. Every network call has the configured timeout.

The console's "Send test email" goes through the same session (:func:`email_send_test`), so
it connects, authenticates and classifies failures exactly as delivery does.
"""

import contextlib
import re
import smtplib
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from email.utils import format_datetime
from functools import cache
from typing import Any

from django.utils import timezone

from notifications.adapters.base import Adapter, DeliveryError, DeliveryResult, FailureClass, Session
from notifications.adapters.email_compose import email_compose, message_id_for
from notifications.backoff import RetryTiming
from notifications.email_content import EmailContent, email_content_read
from notifications.list_names import notification_lists_by_name, text_control_problem
from notifications.models import EmailRecipient, Notification, RecipientMode, SmtpConfiguration

TEST_SUBJECT = "Outbox SMTP test"
TEST_BODY = "This is a test message from the Outbox administration console."


class EmailTargets(list[str]):
    """The members of one list as resolved for a delivery, with the list's ``recipient_mode``.

    A plain list to everything between resolving and delivering; a plain list handed to the
    session (no mode) is addressed as ``bcc``, the mode that shows no member to another.
    """

    def __init__(self, addresses: Iterable[str] = (), *, recipient_mode: str = RecipientMode.BCC) -> None:
        super().__init__(addresses)
        self.recipient_mode = recipient_mode


class EmailAdapter(Adapter):
    def default_timing(self) -> RetryTiming:
        """Email's timing while no delivery policy is stored: the SMTP configuration's fixed
        interval and attempt count (``max_retries`` 0 has always meant one attempt; in a
        policy 0 means unlimited, so it becomes 1)."""
        config = SmtpConfiguration.current() or SmtpConfiguration()
        return RetryTiming(
            strategy="fixed",
            interval_seconds=config.retry_interval_seconds,
            max_attempts=max(1, config.max_retries),
        )

    def endpoint(self) -> str | None:
        """The SMTP relay, ``host:port``."""
        config = SmtpConfiguration.current()
        return None if config is None else smtp_endpoint(host=config.host, port=config.port)

    def resolve_targets(self, *, list_names: set[str]) -> dict[str, list[str]]:
        """List names match as notifications.list_names compares them (case-insensitively).
        Each list's members come as :class:`EmailTargets`, carrying the list's recipient mode."""
        found = notification_lists_by_name(names=list_names)
        recipients: dict[int, list[str]] = {pk: [] for pk in {item.pk for item in found.values()}}
        for list_id, email in EmailRecipient.objects.filter(notification_list__in=list(recipients)).values_list(
            "notification_list_id", "email"
        ):
            recipients[list_id].append(email)
        return {
            name: EmailTargets(recipients[item.pk], recipient_mode=item.recipient_mode) for name, item in found.items()
        }

    def open_session(self) -> "EmailSession":
        config = SmtpConfiguration.current()
        if config is None:
            # Fail closed: with no server configured nothing can be delivered, and pretending
            # success would lose the notification silently.
            raise DeliveryError(
                "No SMTP configuration: an administrator must configure the SMTP server.",
                failure_class=FailureClass.CONFIGURATION,
            )
        return EmailSession(config)


def smtp_endpoint(*, host: str, port: int) -> str:
    """The circuit breaker's key for an SMTP relay."""
    return f"{host}:{port}"


class EmailSession(Session):
    """Delivers a batch through one SMTP server, reusing connections across it."""

    def __init__(self, config: SmtpConfiguration) -> None:
        # A snapshot, so that the worker threads never touch the database.
        self.host = config.host
        self.port = config.port
        self.security = config.security
        self.username = config.username
        self.password = config.password
        self.from_address = config.from_address
        self.timeout = config.timeout_seconds
        self._idle: list[smtplib.SMTP] = []
        self._lock = threading.Lock()
        self._closed = False

    # --- connections ----------------------------------------------------------------------

    def _connect(self) -> smtplib.SMTP:
        context = ssl.create_default_context() if self.security != SmtpConfiguration.Security.NONE else None
        smtp: smtplib.SMTP
        if self.security == SmtpConfiguration.Security.TLS:
            smtp = smtplib.SMTP_SSL(
                self.host, self.port, local_hostname=_local_hostname(), timeout=self.timeout, context=context
            )
        else:
            smtp = smtplib.SMTP(self.host, self.port, local_hostname=_local_hostname(), timeout=self.timeout)
        try:
            smtp.ehlo()
            if self.security == SmtpConfiguration.Security.STARTTLS:
                smtp.starttls(context=context)
                smtp.ehlo()
            if self.username:
                smtp.login(self.username, self.password)
        except BaseException:
            _discard(smtp)
            raise
        return smtp

    def _take(self) -> tuple[smtplib.SMTP, bool]:
        """An idle connection (reused=True) or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _give_back(self, smtp: smtplib.SMTP) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(smtp)
                return
        _quit(smtp)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for smtp in idle:
            _quit(smtp)

    # --- delivery -------------------------------------------------------------------------

    def deliver(self, notification: Notification, targets: list[str]) -> DeliveryResult:
        """Deliver as the list's recipient mode says (see :class:`EmailTargets`): ``bcc`` and
        ``to`` in one transaction to the members and the Cc addresses, ``individual`` as one
        message per member (and one for the Cc addresses)."""
        mode = getattr(targets, "recipient_mode", RecipientMode.BCC)
        content = self._content(notification)
        # Every recipient goes into an SMTP command, shown in a header or not.
        _refuse_line_breaks(("recipient", target) for target in targets)
        if mode == RecipientMode.INDIVIDUAL:
            return self._deliver_individually(notification, list(targets), content)
        message = self._compose(notification, to=list(targets) if mode == RecipientMode.TO else [], content=content)
        recipients = _without_repeats([*targets, *content.cc]) if content.cc else list(targets)
        cc_only = (
            {address.lower() for address in content.cc} - {address.lower() for address in targets}
            if content.cc
            else set()
        )
        try:
            result = self._send(message, recipients)
        except DeliveryError as error:
            _mark_cc(error.targets, cc_only)
            raise
        _mark_cc(result.targets, cc_only)
        result.detail["recipient_mode"] = str(mode)
        return result

    def _send(self, message: bytes, targets: list[str]) -> DeliveryResult:
        """One message in one transaction to ``targets``, on a pooled connection."""
        try:
            smtp, reused = self._take()
        except (smtplib.SMTPException, OSError) as exc:
            raise classify(exc, stage="connect") from exc
        try:
            try:
                result = self._transaction(smtp, message, targets)
            except (smtplib.SMTPServerDisconnected, ConnectionError) as exc:
                if not (reused and getattr(exc, "stage", None) == "MAIL FROM"):
                    raise
                # The server closed an idle pooled connection before we spoke: nothing was
                # sent, so a fresh connection is safe to try once.
                _discard(smtp)
                smtp, reused = self._connect(), False
                result = self._transaction(smtp, message, targets)
        except _Refused as refused:
            self._reset_or_discard(smtp)
            raise refused.error from None
        except smtplib.SMTPResponseException as exc:
            self._reset_or_discard(smtp)
            raise classify(exc, stage=getattr(exc, "stage", "")) from exc
        except (smtplib.SMTPException, OSError) as exc:
            _discard(smtp)
            raise classify(exc, stage=getattr(exc, "stage", "")) from exc
        except BaseException:
            _discard(smtp)
            raise
        self._give_back(smtp)
        result.detail["connection_reused"] = reused
        return result

    def _content(self, notification: Notification) -> EmailContent:
        """The email fields of the notification's type_data; a permanent DeliveryError when
        they do not read cleanly (ingest checked them, but a setting may have changed since)."""
        content, errors = email_content_read(notification.type_data or {})
        if errors:
            problems = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
            # The stored content no longer reads cleanly (e.g. the attachment allow-list was narrowed
            # since ingest): the same content would be refused again.
            raise DeliveryError(
                f"Refused to send: invalid type_data: {problems}"[:2000], failure_class=FailureClass.CONTENT_REJECTED
            )
        return content

    def _compose(
        self, notification: Notification, *, to: list[str], content: EmailContent, recipient: str | None = None
    ) -> bytes:
        """The message showing ``to`` in To: (empty: undisclosed recipients). ``recipient``
        names the one member an individual message goes to (it has its own Message-ID)."""
        _refuse_line_breaks(
            (
                ("subject", notification.subject),
                ("From address", self.from_address),
                *(("recipient", t) for t in to),
                *(("Cc address", t) for t in content.cc),
                *(("Reply-To address", t) for t in content.reply_to),
            )
        )
        domain = self.from_address.rpartition("@")[2] or "outbox"
        return email_compose(
            from_address=self.from_address,
            to=to,
            subject=notification.subject,
            body=notification.body,
            message_id=message_id_for(
                notification_id=str(notification.notification_id), domain=domain, recipient=recipient
            ),
            notification_id=str(notification.notification_id),
            date=format_datetime(timezone.now()),
            content=content,
        )

    def _deliver_individually(
        self, notification: Notification, members: list[str], content: EmailContent
    ) -> DeliveryResult:
        """One message per member, each addressed to that member alone and sent in its own
        transaction over one connection, so that each member has an outcome of its own. The
        Cc addresses get one message of their own (To: undisclosed recipients), so they are
        sent one copy and see no member.

        A refusal (at RCPT TO or DATA) is that member's outcome and the loop goes on. A lost
        connection is replaced once: a member whose message was being handed over (DATA) when
        it was lost is reported "failed" (the server may have it), the others are tried on the
        new connection. Members never reached are "not sent". Nothing is retried once any
        member has the message, since a retry would send it to them again: the notification is
        Delivered with the failed members in ``resolved_targets`` and the warning. When no
        member has it, it fails as a whole (and is retried unless every refusal was 5xx).
        """
        messages: list[tuple[list[str], bytes]] = [
            ([member], self._compose(notification, to=[member], content=content, recipient=member))
            for member in _without_repeats(members)
        ]
        member_keys = {member.lower() for member in members}
        cc_only = [address for address in content.cc if address.lower() not in member_keys]
        if cc_only:
            cc_message = self._compose(notification, to=[], content=content, recipient=", ".join(cc_only))
            messages.append((cc_only, cc_message))

        snapshot: list[dict[str, Any]] = []
        smtp: smtplib.SMTP | None = None
        reused = False
        pooled = True  # the first connection comes from the pool, any later one is new
        replacements = 1
        stopped_by: DeliveryError | None = None
        position = 0
        while position < len(messages):
            recipients, message = messages[position]
            if smtp is None:
                try:
                    smtp, reused = self._take() if pooled else (self._connect(), False)
                except (smtplib.SMTPException, OSError) as exc:
                    stopped_by = classify(exc, stage="connect")
                    break
                pooled = False
            try:
                result = self._transaction(smtp, message, recipients)
            except _Refused as refused:
                snapshot += refused.error.targets
                smtp = self._reset_kept(smtp)
            except smtplib.SMTPResponseException as exc:
                reply = {"outcome": "refused", "smtp_code": exc.smtp_code, "error": _text(exc.smtp_error)}
                snapshot += [{"target": target, **reply} for target in recipients]
                smtp = self._reset_kept(smtp)
            except (smtplib.SMTPException, OSError) as exc:
                _discard(smtp)
                smtp = None
                stage = getattr(exc, "stage", "")
                if (
                    reused
                    and stage == "MAIL FROM"
                    and isinstance(exc, (smtplib.SMTPServerDisconnected, ConnectionError))
                ):
                    reused = False  # a pooled connection the server had closed: nothing was sent
                    continue
                failure = classify(exc, stage=stage)
                if stage == "DATA":
                    lost = {"outcome": "failed", "error": f"{failure.message} (the server may have accepted it)"}
                    snapshot += [{"target": target, **lost} for target in recipients]
                    position += 1
                if replacements == 0:
                    stopped_by = failure
                    break
                replacements -= 1
                continue
            except BaseException:
                _discard(smtp)
                raise
            else:
                snapshot += result.targets
            reused = False
            position += 1
        if smtp is not None:
            self._give_back(smtp)
        if position < len(messages):
            reason = stopped_by.message if stopped_by else "not sent"
            for recipients, _ in messages[position:]:
                snapshot += [{"target": target, "outcome": "not sent", "error": reason} for target in recipients]
        _mark_cc(snapshot, {address.lower() for address in cc_only})

        delivered = [entry for entry in snapshot if entry["outcome"] == "delivered"]
        if not delivered:
            if stopped_by is not None:
                raise DeliveryError(
                    stopped_by.message,
                    failure_class=stopped_by.failure_class,
                    detail=stopped_by.detail,
                    targets=snapshot,
                )
            if all("smtp_code" in entry for entry in snapshot):
                raise _all_refused(snapshot)
            raise DeliveryError(
                "No recipient received the message: "
                + "; ".join(f"{entry['target']} ({entry['outcome']}: {entry.get('error', '')})" for entry in snapshot)[
                    :2000
                ],
                failure_class=FailureClass.PROVIDER_ERROR,
                targets=snapshot,
            )
        warning = ""
        if len(delivered) < len(snapshot):
            warning = f"Delivered to {len(delivered)} of {len(snapshot)} recipients; not delivered: " + "; ".join(
                f"{entry['target']} ({entry.get('smtp_code') or entry['outcome']} {entry.get('error', '')})"
                for entry in snapshot
                if entry["outcome"] != "delivered"
            )
        return DeliveryResult(
            targets=snapshot,
            warning=warning[:2000],
            detail={
                "recipient_mode": RecipientMode.INDIVIDUAL.value,
                "messages": len(messages),
                "accepted": len(delivered),
                "refused": len(snapshot) - len(delivered),
            },
        )

    def _transaction(self, smtp: smtplib.SMTP, message: bytes, targets: list[str]) -> DeliveryResult:
        """One SMTP transaction to every target; a DeliveryResult, or raises."""
        code, reply = _step(smtp.mail, "MAIL FROM", self.from_address)
        if code != 250:
            raise _staged(smtplib.SMTPSenderRefused(code, reply, self.from_address), "MAIL FROM")
        accepted: list[str] = []
        refused: list[dict[str, Any]] = []
        for target in targets:
            code, reply = _step(smtp.rcpt, "RCPT TO", target)
            if code in (250, 251):
                accepted.append(target)
            else:
                refused.append({"target": target, "outcome": "refused", "smtp_code": code, "error": _text(reply)})
        if not accepted:
            raise _Refused(_all_refused(refused))
        code, reply = _step(smtp.data, "DATA", message)
        if code != 250:
            raise _staged(smtplib.SMTPDataError(code, reply), "DATA")
        snapshot = [{"target": t, "outcome": "delivered", "smtp_code": code} for t in accepted] + refused
        warning = ""
        if refused:
            warning = f"Delivered to {len(accepted)} of {len(targets)} recipients; refused: " + "; ".join(
                f"{r['target']} ({r['smtp_code']} {r['error']})" for r in refused
            )
        return DeliveryResult(
            targets=snapshot,
            warning=warning[:2000],
            detail={
                "smtp_code": code,
                "smtp_reply": _text(reply)[:200],
                "accepted": len(accepted),
                "refused": len(refused),
            },
        )

    def _reset_kept(self, smtp: smtplib.SMTP) -> smtplib.SMTP | None:
        """After a refused transaction: the connection, still good once RSET succeeds, else
        None (discarded)."""
        try:
            smtp.rset()
        except (smtplib.SMTPException, OSError):
            _discard(smtp)
            return None
        return smtp

    def _reset_or_discard(self, smtp: smtplib.SMTP) -> None:
        """After a refused transaction the connection is still good once RSET succeeds."""
        try:
            smtp.rset()
        except (smtplib.SMTPException, OSError):
            _discard(smtp)
        else:
            self._give_back(smtp)


def _refuse_line_breaks(values: Iterable[tuple[str, str]]) -> None:
    """Raise a permanent DeliveryError naming the first ``(name, value)`` that holds a control
    character: header (or SMTP command) injection. Never fixed by retrying."""
    for name, value in values:
        if text_control_problem(value):
            # A line break (or a VT/FF that a downstream re-serialisation turns into one) would
            # let content add headers or recipients. Ingest refuses these; rows stored before it
            # did still get here.
            raise DeliveryError(
                f"Refused to send: the {name} contains a line break or another control character (header injection).",
                failure_class=FailureClass.CONTENT_REJECTED,
            )


def _without_repeats(addresses: Iterable[str]) -> list[str]:
    """``addresses`` in order, each once (ignoring case, as list membership does)."""
    seen: set[str] = set()
    unique = []
    for address in addresses:
        if address.lower() not in seen:
            seen.add(address.lower())
            unique.append(address)
    return unique


def _mark_cc(snapshot: list[dict[str, Any]], cc_only: set[str]) -> None:
    """Tag the outcomes of Cc addresses that are not list members, so the audit tells them apart."""
    if not cc_only:
        return
    for entry in snapshot:
        if entry["target"].lower() in cc_only:
            entry["role"] = "cc"


class _Refused(Exception):
    """Every recipient was refused; carries the classified DeliveryError."""

    def __init__(self, error: DeliveryError) -> None:
        self.error = error


def _all_refused(refused: list[dict[str, Any]]) -> DeliveryError:
    """Every recipient was refused at RCPT TO: the class of the refusal. All with 5xx is the
    server's definitive refusal of every recipient (RFC 5321 §4.2.1); otherwise the first 4xx
    reply decides (a rate limit, a greylisting, a temporary problem), so the message is retried."""
    detail = "; ".join(f"{r['target']} ({r['smtp_code']} {r['error']})" for r in refused)
    codes = sorted({r["smtp_code"] for r in refused})
    temporary = [r for r in refused if not 500 <= r["smtp_code"] < 600]
    if temporary:
        failure_class = _reply_class(temporary[0]["smtp_code"], temporary[0]["error"], stage="RCPT TO")
    else:
        failure_class = FailureClass.RECIPIENT_REJECTED
    return DeliveryError(
        f"Every recipient was refused: {detail}"[:2000],
        failure_class=failure_class,
        detail={"smtp_code": codes[-1], "stage": "RCPT TO"},
        targets=refused,
    )


# An enhanced status code (RFC 3463) at the start of a reply's text, e.g. "4.7.0".
_ENHANCED_STATUS = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})\b")
# Words relays use when they defer because of how much or how fast we send.
_THROTTLE_WORDS = ("rate", "too many", "throttl", "slow down")
# Authentication required (530), credentials invalid (535), mechanism too weak (534),
# encryption required for the mechanism (538).
_AUTH_CODES = frozenset({530, 534, 535, 538})


def _reply_class(code: int, text: str, *, stage: str) -> str:
    """The failure class of an SMTP reply ``code`` with ``text`` at ``stage``."""
    lowered = text.lower()
    enhanced = _ENHANCED_STATUS.match(text)
    if 400 <= code <= 499:
        if code == 421:
            # "Service not available, closing transmission channel": the relay sheds load or
            # limits us; the channel, not this message, is the problem.
            return FailureClass.THROTTLED
        if code == 454:
            # A temporary authentication failure, or TLS temporarily unavailable.
            return FailureClass.AUTH if "auth" in lowered or stage == "AUTH" else FailureClass.CONNECTION
        if (enhanced and enhanced.group(2) == "7") or any(word in lowered for word in _THROTTLE_WORDS):
            # 4.7.x is policy (rate limits, greylisting): wait rather than hammer the relay.
            return FailureClass.THROTTLED
        # Any other 4xx: the server says "not now" about this message; retried per policy.
        return FailureClass.PROVIDER_ERROR
    if code in _AUTH_CODES:
        # The relay wants (other) credentials: nothing is deliverable until they are fixed.
        return FailureClass.AUTH
    if stage == "RCPT TO":
        # 550/551/553 …: the server definitively refuses this recipient; retrying changes nothing.
        return FailureClass.RECIPIENT_REJECTED
    if stage == "DATA" or code == 552:
        # 552/554 … after the content was seen (or its declared size): this message is refused.
        return FailureClass.CONTENT_REJECTED
    # 5xx at MAIL FROM (the From address is not allowed to send), at the greeting or at EHLO
    # (the server will not serve us): only an administrator can fix it.
    return FailureClass.CONFIGURATION


def classify(exc: BaseException, *, stage: str = "") -> DeliveryError:
    """The one place SMTP failures become DeliveryErrors with their failure class (the mapping
    is tabulated in docs/architecture.md)."""
    where = f" at {stage}" if stage else ""
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        # Wrong or expired credentials: every message would fail the same way, so the channel
        # waits (circuit breaker) until they are fixed, instead of hammering the account.
        return DeliveryError(
            f"SMTP authentication failed ({exc.smtp_code} {_text(exc.smtp_error)}): check the username and "
            "password in the SMTP configuration.",
            failure_class=FailureClass.AUTH,
            detail={"smtp_code": exc.smtp_code, "stage": "AUTH"},
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError) or (
        type(exc) is smtplib.SMTPException and "authentication method" in str(exc).lower()
    ):
        # The server lacks what the configuration requires (STARTTLS, AUTH, a usable
        # mechanism): only an administrator changing the configuration can fix it.
        return DeliveryError(
            f"SMTP server does not support what the configuration requires: {exc}",
            failure_class=FailureClass.CONFIGURATION,
            detail={"stage": stage},
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        # An untrusted or mismatched certificate is a configuration problem, not an outage.
        return DeliveryError(
            f"TLS certificate of the SMTP server is not trusted: {exc.verify_message}",
            failure_class=FailureClass.CONFIGURATION,
            detail={"stage": stage},
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        code, text = exc.smtp_code, _text(exc.smtp_error)
        failure_class = _reply_class(code, text, stage=stage)
        verb = "deferred" if 400 <= code <= 499 else "refused"
        return DeliveryError(
            f"SMTP server {verb} the message{where}: {code} {text}",
            failure_class=failure_class,
            detail={"smtp_code": code, "smtp_reply": text[:200], "stage": stage},
        )
    if _timed_out(exc):
        return DeliveryError(
            f"SMTP server timed out{where}", failure_class=FailureClass.TIMEOUT, detail={"stage": stage}
        )
    if isinstance(exc, ConnectionRefusedError):
        return DeliveryError(
            f"SMTP connection refused{where}", failure_class=FailureClass.CONNECTION, detail={"stage": stage}
        )
    if isinstance(exc, (smtplib.SMTPServerDisconnected, OSError)):
        # Reset, dropped, unreachable, DNS failure, a TLS handshake that broke off: the
        # network or the server is down, which time (and the breaker) sorts out.
        return DeliveryError(
            f"SMTP connection failed{where}: {type(exc).__name__}: {exc or 'connection lost'}",
            failure_class=FailureClass.CONNECTION,
            detail={"stage": stage},
        )
    if isinstance(exc, smtplib.SMTPException):
        # The server answered something smtplib could not use.
        return DeliveryError(
            f"SMTP error{where}: {type(exc).__name__}: {exc}",
            failure_class=FailureClass.PROVIDER_ERROR,
            detail={"stage": stage},
        )
    return DeliveryError(
        f"Unexpected error{where}: {type(exc).__name__}: {exc}",
        failure_class=FailureClass.UNKNOWN,
        detail={"stage": stage},
    )


def _timed_out(exc: BaseException) -> bool:
    """True when ``exc`` is a timeout or was raised because of one (smtplib turns a timed-out
    read into SMTPServerDisconnected, keeping the timeout as its context)."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, TimeoutError):  # socket.timeout is TimeoutError
            return True
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
    return False


def _step(method: Callable[..., tuple[int, bytes]], stage: str, *args: Any) -> tuple[int, bytes]:
    """Call one SMTP command; a failure is tagged with the stage it happened at."""
    try:
        return method(*args)
    except (smtplib.SMTPException, OSError) as exc:
        raise _staged(exc, stage) from exc


def _staged(exc: Exception, stage: str) -> Exception:
    exc.stage = stage  # type: ignore[attr-defined]  # smtplib's exceptions have no slot for it
    return exc


def _text(value: bytes | str) -> str:
    """A server's reply as text fit to store and show: undecodable bytes replaced, and control
    characters other than TAB and LF (a NUL, an escape sequence) written as ``\\xNN``. A remote
    server's reply must never make the attempt's record unstorable or rewrite a terminal."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text.translate(_CONTROL_ESCAPES)


# TAB and LF stay (smtplib joins the lines of a multi-line reply with LF).
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F) if chr(code) not in "\t\n"}


def _quit(smtp: smtplib.SMTP) -> None:
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        _discard(smtp)


def _discard(smtp: smtplib.SMTP) -> None:
    with contextlib.suppress(OSError):
        smtp.close()


@cache
def _local_hostname() -> str:
    """Our EHLO name, looked up once: smtplib would resolve it again on every connection."""
    started = time.monotonic()
    name = socket.getfqdn()
    if time.monotonic() - started > 1 or not name:
        return "localhost"
    return name


def email_send_test(*, config: SmtpConfiguration, to: str) -> DeliveryResult:
    """Send one test message to ``to`` through ``config`` as a delivery would go: the same
    connection code, the same SMTP transaction, the same failure classification. Returns the
    server's acceptance; raises DeliveryError with the failure class delivery would see."""
    message = Notification(notification_id=uuid.uuid4(), subject=TEST_SUBJECT, body=TEST_BODY)
    session = EmailSession(config)
    try:
        return session.deliver(message, EmailTargets([to], recipient_mode=RecipientMode.TO))
    finally:
        session.close()


def email_connect_test(*, config: SmtpConfiguration) -> str:
    """Connect to ``config``'s server exactly as delivery does (TLS or STARTTLS, EHLO, login when
    a username is set) and hang up without sending anything. Returns the server's EHLO answer's
    first line; raises DeliveryError with the failure class delivery would see."""
    session = EmailSession(config)
    try:
        smtp = session._connect()
    except (smtplib.SMTPException, OSError) as exc:
        raise classify(exc, stage="connect") from exc
    try:
        if smtp.ehlo_resp:
            code, reply = 250, smtp.ehlo_resp
        else:
            code, reply = _step(smtp.noop, "NOOP")
        lines = _text(reply).splitlines()
        return f"{code} {lines[0] if lines else ''}".strip()
    except (smtplib.SMTPException, OSError) as exc:
        raise classify(exc, stage=getattr(exc, "stage", "")) from exc
    finally:
        _quit(smtp)
        session.close()
