"""Email over SMTP, with smtplib directly.

Django's SMTP backend reports only "sent" or an exception, and loses which recipients the
server refused; the audit snapshot (``resolved_targets``) needs every recipient's outcome, so
this adapter speaks the transaction itself: MAIL FROM, one RCPT TO per recipient, DATA.

A session keeps a small pool of open connections for a batch; any dispatcher thread takes one,
uses it for one message and gives it back, so a batch of 200 costs ``concurrency`` TCP (and TLS)
handshakes, not 200. Every network call has the configured timeout.
"""

import base64
import smtplib
import socket
import ssl
import threading
import time
from email.header import Header
from email.utils import format_datetime
from functools import cache

from django.db.models.functions import Lower
from django.utils import timezone

from notifications.adapters.base import Adapter, DeliveryError, DeliveryResult, RetryPolicy, Session
from notifications.models import NotificationList, SmtpConfiguration

UNSAFE_HEADER_CHARACTERS = ("\r", "\n", "\x00")
MAX_LINE_BYTES = 998  # RFC 5322 §2.1.1


def compose_message(*, from_address, to, subject, body, message_id, notification_id, date):
    """The RFC 5322 message as bytes (CRLF line ends; smtplib dot-stuffs it).

    Composed directly rather than with email.message.EmailMessage, whose header folding
    costs over a millisecond per message — most of a dispatcher's CPU at high rates. Header
    values were checked for CR/LF/NUL by the caller; a non-ASCII subject is RFC 2047-encoded;
    the body is sent as 7bit when it is ASCII with short lines, else base64 of its UTF-8.
    """
    encoded_subject = subject if subject.isascii() else Header(subject, "utf-8").encode(linesep="\r\n")
    lines = body.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if body.isascii() and all(len(line) <= MAX_LINE_BYTES for line in lines):
        encoding, payload = "7bit", "\r\n".join(lines).encode("ascii")
    else:
        encoding, payload = "base64", base64.encodebytes(body.encode("utf-8")).replace(b"\n", b"\r\n")
    recipients = ",\r\n ".join(to)  # folded: a long list must not exceed the line limit
    headers = (
        f"From: {from_address}\r\n"
        f"To: {recipients}\r\n"
        f"Subject: {encoded_subject}\r\n"
        f"Date: {date}\r\n"
        f"Message-ID: {message_id}\r\n"
        f"X-Notification-Id: {notification_id}\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: text/plain; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    )
    return headers.encode("ascii") + payload + (b"" if payload.endswith(b"\r\n") else b"\r\n")


class EmailAdapter(Adapter):
    def retry_policy(self):
        config = SmtpConfiguration.current()
        if config is None:
            return None
        return RetryPolicy(max_retries=config.max_retries, interval_seconds=config.retry_interval_seconds)

    def resolve_targets(self, *, list_names):
        """List names match case-insensitively, as the database's uniqueness rule does."""
        wanted = {name.lower() for name in list_names}
        lists = (
            NotificationList.objects.annotate(key=Lower("name"))
            .filter(key__in=wanted)
            .prefetch_related("email_recipients")
        )
        by_key = {item.key: [r.email for r in item.email_recipients.all()] for item in lists}
        return {name: by_key[name.lower()] for name in list_names if name.lower() in by_key}

    def open_session(self):
        config = SmtpConfiguration.current()
        if config is None:
            # Fail closed: with no server configured nothing can be delivered, and pretending
            # success would lose the notification silently.
            raise DeliveryError("No SMTP configuration: an administrator must configure the SMTP server.",
                                permanent=True)  # fmt: skip
        return EmailSession(config)


class EmailSession(Session):
    """Delivers a batch through one SMTP server, reusing connections across it."""

    def __init__(self, config):
        # A snapshot, so that the worker threads never touch the database.
        self.host = config.host
        self.port = config.port
        self.security = config.security
        self.username = config.username
        self.password = config.password
        self.from_address = config.from_address
        self.timeout = config.timeout_seconds
        self._idle = []
        self._lock = threading.Lock()
        self._closed = False

    # --- connections ----------------------------------------------------------------------

    def _connect(self):
        context = ssl.create_default_context() if self.security != SmtpConfiguration.Security.NONE else None
        if self.security == SmtpConfiguration.Security.TLS:
            smtp = smtplib.SMTP_SSL(self.host, self.port, local_hostname=_local_hostname(),
                                    timeout=self.timeout, context=context)  # fmt: skip
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

    def _take(self):
        """An idle connection (reused=True) or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _give_back(self, smtp):
        with self._lock:
            if not self._closed:
                self._idle.append(smtp)
                return
        _quit(smtp)

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for smtp in idle:
            _quit(smtp)

    # --- delivery -------------------------------------------------------------------------

    def deliver(self, notification, targets):
        message = self._compose(notification, targets)
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

    def _compose(self, notification, targets):
        for name, value in (("subject", notification.subject), ("From address", self.from_address),
                            *(("recipient", t) for t in targets)):  # fmt: skip
            if any(c in value for c in UNSAFE_HEADER_CHARACTERS):
                # Header injection: a line break in a header would let content add headers
                # or recipients. Never fixed by retrying.
                raise DeliveryError(f"Refused to send: the {name} contains a line break or NUL "
                                    "(header injection).", permanent=True)  # fmt: skip
        domain = self.from_address.rpartition("@")[2] or "outbox"
        return compose_message(
            from_address=self.from_address,
            to=targets,
            subject=notification.subject,
            body=notification.body,
            # The same Message-ID on every attempt lets a receiver drop a duplicate delivery.
            message_id=f"<{notification.notification_id}@{domain}>",
            notification_id=str(notification.notification_id),
            date=format_datetime(timezone.now()),
        )

    def _transaction(self, smtp, message, targets):
        """One SMTP transaction to every target; a DeliveryResult, or raises."""
        code, reply = _step(smtp.mail, "MAIL FROM", self.from_address)
        if code != 250:
            raise _staged(smtplib.SMTPSenderRefused(code, reply, self.from_address), "MAIL FROM")
        accepted, refused = [], []
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
        return DeliveryResult(targets=snapshot, warning=warning[:2000],
                              detail={"smtp_code": code, "smtp_reply": _text(reply)[:200],
                                      "accepted": len(accepted), "refused": len(refused)})  # fmt: skip

    def _reset_or_discard(self, smtp):
        """After a refused transaction the connection is still good once RSET succeeds."""
        try:
            smtp.rset()
        except (smtplib.SMTPException, OSError):
            _discard(smtp)
        else:
            self._give_back(smtp)


class _Refused(Exception):
    """Every recipient was refused; carries the classified DeliveryError."""

    def __init__(self, error):
        self.error = error


def _all_refused(refused):
    detail = "; ".join(f"{r['target']} ({r['smtp_code']} {r['error']})" for r in refused)
    codes = sorted({r["smtp_code"] for r in refused})
    # All refused with 5xx: the server definitively refuses every recipient (RFC 5321 §4.2.1).
    permanent = all(500 <= code < 600 for code in codes)
    return DeliveryError(f"Every recipient was refused: {detail}"[:2000], permanent=permanent,
                         detail={"smtp_code": codes[-1], "stage": "RCPT TO"}, targets=refused)  # fmt: skip


def classify(exc, *, stage=""):
    """The one place SMTP failures become transient or permanent DeliveryErrors."""
    where = f" at {stage}" if stage else ""
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        # Wrong credentials do not fix themselves; retrying only risks locking the account.
        return DeliveryError(
            f"SMTP authentication failed ({exc.smtp_code} {_text(exc.smtp_error)}): check the username and "
            "password in the SMTP configuration.",
            permanent=True, detail={"smtp_code": exc.smtp_code, "stage": "AUTH"},
        )  # fmt: skip
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        # The server lacks what the configuration requires (STARTTLS, AUTH): only an
        # administrator changing the configuration can fix it.
        return DeliveryError(f"SMTP server does not support what the configuration requires: {exc}",
                             permanent=True, detail={"stage": stage})  # fmt: skip
    if isinstance(exc, ssl.SSLCertVerificationError):
        # An untrusted or mismatched certificate is a configuration problem, not an outage.
        return DeliveryError(f"TLS certificate of the SMTP server is not trusted: {exc.verify_message}",
                             permanent=True, detail={"stage": stage})  # fmt: skip
    if isinstance(exc, smtplib.SMTPResponseException):
        code, text = exc.smtp_code, _text(exc.smtp_error)
        detail = {"smtp_code": code, "smtp_reply": text[:200], "stage": stage}
        if 500 <= code <= 599:
            # 5xx is the server's definitive refusal (RFC 5321 §4.2.1): the same message will
            # be refused again.
            return DeliveryError(f"SMTP server refused the message{where}: {code} {text}", permanent=True,
                                 detail=detail)  # fmt: skip
        return DeliveryError(f"SMTP server deferred the message{where}: {code} {text}", permanent=False,
                             detail=detail)  # fmt: skip
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return DeliveryError(f"SMTP server timed out{where}", permanent=False, detail={"stage": stage})
    if isinstance(exc, ConnectionRefusedError):
        return DeliveryError(f"SMTP connection refused{where}", permanent=False, detail={"stage": stage})
    if isinstance(exc, (smtplib.SMTPServerDisconnected, ConnectionError)):
        return DeliveryError(f"SMTP connection lost{where}: {exc or type(exc).__name__}", permanent=False,
                             detail={"stage": stage})  # fmt: skip
    # Anything else on the network (DNS failure, TLS handshake error, …) may pass.
    return DeliveryError(f"SMTP error{where}: {type(exc).__name__}: {exc}", permanent=False, detail={"stage": stage})


def _step(method, stage, *args):
    """Call one SMTP command; a failure is tagged with the stage it happened at."""
    try:
        return method(*args)
    except (smtplib.SMTPException, OSError) as exc:
        raise _staged(exc, stage)


def _staged(exc, stage):
    exc.stage = stage
    return exc


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _quit(smtp):
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        _discard(smtp)


def _discard(smtp):
    try:
        smtp.close()
    except OSError:
        pass


@cache
def _local_hostname():
    """Our EHLO name, looked up once: smtplib would resolve it again on every connection."""
    started = time.monotonic()
    name = socket.getfqdn()
    if time.monotonic() - started > 1 or not name:
        return "localhost"
    return name
