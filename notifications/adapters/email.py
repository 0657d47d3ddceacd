"""Email over SMTP, with smtplib directly.

Django's SMTP backend reports only "sent" or an exception, and loses which recipients the
server refused; the audit snapshot (``resolved_targets``) needs every recipient's outcome, so
this adapter speaks the transaction itself: MAIL FROM, one RCPT TO per recipient, DATA.

Every recipient has an outcome of its own (docs/recipients.md): accepted, refused for good (5xx), deferred (4xx, or not reached: sent again by a later
attempt, alone), or ambiguous (the message was handed over and the answer lost: sent again once,
with the same Message-ID). A server that takes no more recipients in one transaction
(``452 4.5.3``) gets the rest in the next transaction of the same attempt.

A session keeps a small pool of open connections for a pass; each delivery takes one, uses it
for one message and gives it back, so a batch of 200 costs ``concurrency`` TCP (and TLS)
handshakes, not 200. Every call blocks the delivering thread with the configured timeout, but
the wait for the answer to the end of the message, which has its own (``data_timeout_seconds``);
none waits past the delivery's deadline (the claim's lease).

The console's "Send test email" goes through the same session (:func:`email_send_test`), so
it connects, authenticates and classifies failures exactly as delivery does.
"""

import contextlib
import re
import smtplib
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import format_datetime
from functools import partial
from typing import Any

from django.utils import timezone

from notifications.ack_links import ack_link
from notifications.adapters.base import (
    Adapter,
    DeliveryError,
    DeliveryResult,
    Session,
    delivery_deadline,
    delivery_time_left,
    targets_owed,
)
from notifications.adapters.email_compose import email_compose, email_with_ack_link, message_id_for
from notifications.adapters.oauth import oauth_token
from notifications.adapters.smtp_connect import (
    AuthGate,
    ConnectFailure,
    ConnectSettings,
    NoGreeting,
    SmtpConnection,
    connect_hint,
    smtp_open,
    tls_context,
)
from notifications.backoff import RetryTiming
from notifications.email_address import AddressNotSendable, address_ascii_domain, envelope_address, needs_smtputf8
from notifications.email_content import EmailContent, email_content_prioritised, email_content_read
from notifications.list_names import notification_lists_by_name, text_control_problem
from notifications.models import EmailRecipient, Notification, RecipientMode, SmtpConfiguration
from notifications.secret_binding import secret_binding_problem
from notifications.vocabulary import OWED_OUTCOMES, FailureClass, TargetOutcome, target_outcome

TEST_SUBJECT = "Outbox SMTP test"
TEST_BODY = "This is a test message from the Outbox administration console."
TEST_ANSWER_WAIT_SECONDS = 60


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


def smtp_credential_problem(config: SmtpConfiguration) -> str | None:
    """Why the credential ``config`` would log in with must not go where ``config`` points now
    (notifications.secret_binding), or None. XOAUTH2 uses the certificate when there is one."""
    if not config.username:
        return None
    if config.auth_method == SmtpConfiguration.AuthMethod.XOAUTH2:
        credential = "oauth_client_certificate" if config.oauth_client_certificate else "oauth_client_secret"
    else:
        credential = "password"
    return secret_binding_problem(instance=config, secret=credential)


def smtp_endpoint(*, host: str, port: int) -> str:
    """The circuit breaker's key for an SMTP relay."""
    return f"{host}:{port}"


# With PIPELINING, RCPT TOs are written this many at a time (then their replies read): far more
# than a list usually holds, few enough that the replies never fill the socket buffers.
PIPELINED_RECIPIENTS = 100


class EmailSession(Session):
    """Delivers a batch through one SMTP server, reusing connections across it."""

    def __init__(self, config: SmtpConfiguration) -> None:
        problem = smtp_credential_problem(config)
        if problem:
            # Fail closed: never log in to a server the credential was not entered for.
            raise DeliveryError(
                f"SMTP configuration: {problem}", failure_class=FailureClass.CONFIGURATION, detail={"stage": "AUTH"}
            )
        # A snapshot, so that the worker threads never touch the database.
        self.host = config.host
        self.port = config.port
        self.security = config.security
        self.username = config.username
        self.password = config.password
        self.from_address = config.from_address
        self.timeout = config.timeout_seconds
        self.data_timeout = config.data_timeout_seconds
        self.connect_settings = ConnectSettings.of(config)
        # What every message's headers take from the From address, written once.
        self._from_header = _header_address(self.from_address)
        self._domain = self.from_address.rpartition("@")[2] or "outbox"
        self._auth_gate = AuthGate()  # one failed AUTH per session (pass) at most
        self._tls_context: ssl.SSLContext | None = None
        self._idle: list[SmtpConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    # --- connections ----------------------------------------------------------------------

    def _connect(self) -> SmtpConnection:
        """A new connection, set up by notifications.adapters.smtp_connect (EHLO name, TLS
        trust, one AUTH per session after a failure). Raises ConnectFailure carrying the
        classified error with a hint for a port/security mismatch."""
        settings = self.connect_settings
        try:
            if self._tls_context is None and self.security != SmtpConfiguration.Security.NONE:
                self._tls_context = tls_context(settings)
            return smtp_open(
                settings,
                context=self._tls_context,
                gate=self._auth_gate,
                classify=lambda exc: classify(exc, stage="AUTH"),
                token=(lambda: oauth_token(settings)) if settings.auth_method == "xoauth2" else None,
            )
        except DeliveryError as config_error:
            raise ConnectFailure(config_error) from config_error
        except ConnectFailure:
            raise
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage=getattr(exc, "stage", "connect"))
            hint = connect_hint(exc, settings)
            if hint:
                failure = DeliveryError(
                    f"{failure.message}. {hint}",
                    failure_class=failure.failure_class,
                    detail={**failure.detail, "hint": hint},
                )
            raise ConnectFailure(failure) from exc

    def _idle_take(self) -> SmtpConnection | None:
        """An idle connection, if there is one."""
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, smtp: SmtpConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(smtp)
                return
        smtp.quit_quietly()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for smtp in idle:
            smtp.quit_quietly()

    # --- delivery -------------------------------------------------------------------------

    def deliver(self, notification: Notification, targets: list[str]) -> DeliveryResult:
        """Deliver as the list's recipient mode says (see :class:`EmailTargets`): ``bcc`` and
        ``to`` as one message to the members and the Cc addresses (in as many transactions as
        the server takes recipients), ``individual`` as one message per member (and one for the
        Cc addresses). Only recipients still owed the message are sent to (``targets_owed``);
        the result, or the DeliveryError, carries every recipient's outcome."""
        mode = getattr(targets, "recipient_mode", RecipientMode.BCC)
        content = self._content(notification)
        plan = _Plan.make(notification, list(targets), content)
        # Every recipient goes into an SMTP command, shown in a header or not.
        _refuse_line_breaks(("recipient", target) for target in [*plan.members, *plan.cc_only])
        line = _Line(self)
        entries: list[dict[str, Any]] = []
        failures: list[DeliveryError] = []
        reply: tuple[int, str] | None = None
        messages = 0
        try:
            batches: list[tuple[list[str], Callable[[], bytes]]]
            if mode == RecipientMode.INDIVIDUAL:
                batches = [
                    (
                        [member],
                        partial(
                            self._compose, notification, to=[member], content=content, recipient=member, one_person=True
                        ),
                    )
                    for member in plan.members
                ]
                if plan.cc_only:
                    # The Message-ID comes from every Cc address of the notification, so that a
                    # retry to some of them carries the first attempt's.
                    seed = ", ".join(plan.cc_all)
                    batches.append(
                        (plan.cc_only, partial(self._compose, notification, to=[], content=content, recipient=seed))
                    )
            else:
                shown = plan.all_members if mode == RecipientMode.TO else []
                batches = [
                    (
                        _without_repeats([*plan.members, *plan.cc_only]),
                        partial(self._compose, notification, to=shown, content=content),
                    )
                ]
            for recipients, compose in batches:
                if not recipients:
                    continue
                message = compose()
                messages += 1
                sent, failure, answer = self._send_message(line, message, recipients, plan.unanswered)
                entries += sent
                reply = answer or reply
                if failure is not None:
                    failures.append(failure)
        except BaseException:
            line.abandon()
            raise
        line.release()
        _mark_cc(entries, {address.lower() for address in plan.cc_only})
        return _shape(
            snapshot=plan.merge(entries),
            new=entries,
            failures=failures,
            detail={"recipient_mode": str(mode), "messages": messages, "connection_reused": line.first_reused},
            reply=reply,
        )

    def _send_message(
        self, line: "_Line", message: bytes, recipients: list[str], unanswered: dict[str, int]
    ) -> tuple[list[dict[str, Any]], DeliveryError | None, tuple[int, str] | None]:
        """One message to ``recipients``, in as many transactions as the server takes
        recipients in (a ``452 4.5.3`` "too many recipients" sends the rest in the next one,
        RFC 5321 §4.5.3.1.10). Returns every recipient's entry and the failure that kept any
        of them from having it (the last one), if any, and the server's last acceptance. A lost
        connection ends the message: its remaining recipients are deferred (retried by a later
        attempt), never sent twice within one attempt."""
        entries: list[dict[str, Any]] = []
        failure: DeliveryError | None = None
        reply: tuple[int, str] | None = None
        remaining = list(recipients)
        while remaining:
            try:
                smtp = line.get()
            except DeliveryError as error:
                entries += [_entry(target, TargetOutcome.DEFERRED, error=error.message) for target in remaining]
                return entries, error, reply
            done = self._transaction(smtp, message, remaining, unanswered)
            if done.broken and done.stale and line.reused:
                # The server closed an idle pooled connection before we spoke: nothing was
                # sent, so a fresh connection is safe to try.
                line.lose(replace_free=True)
                continue
            entries += done.entries
            failure = done.failure or failure
            reply = done.reply or reply
            if done.broken:
                line.lose(done.failure)
                return entries, failure, reply
            if done.needs_reset:
                line.reset()
            remaining = done.leftover
        return entries, failure, reply

    def _transaction(
        self, smtp: SmtpConnection, message: bytes, targets: list[str], unanswered: dict[str, int]
    ) -> "_Transaction":
        """One SMTP transaction: MAIL FROM, RCPT TO for each target until the server takes no
        more (those are ``leftover``), DATA to the accepted ones. Never raises for what the
        server answers or for a lost connection: every target handled gets its entry."""
        try:
            smtputf8, sender, options = _mail_from(smtp, self.from_address, message, targets)
        except ConnectFailure as exc:  # the From address cannot be written for this server
            return _Transaction(entries=_failed(targets, exc.error), failure=exc.error)
        if smtp.has_extn("pipelining"):
            return self._transaction_pipelined(smtp, message, targets, unanswered, sender, options, smtputf8)
        try:
            ((code, reply),) = smtp.exchange(smtp.mail_command(sender, options), 1)
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage="MAIL FROM")
            return _Transaction(
                entries=_failed(targets, failure),
                failure=failure,
                broken=True,
                stale=isinstance(exc, (smtplib.SMTPServerDisconnected, ConnectionError)),
            )
        if code != 250:
            failure = classify(smtplib.SMTPSenderRefused(code, reply, self.from_address), stage="MAIL FROM")
            # The sender is refused, not the recipients: they are still owed the message.
            return _Transaction(entries=_failed(targets, failure), failure=failure, needs_reset=True)
        accepted: list[str] = []
        entries: list[dict[str, Any]] = []
        leftover: list[str] = []
        for index, target in enumerate(targets):
            try:
                address = envelope_address(target, smtputf8=smtputf8)
            except AddressNotSendable as exc:
                entries.append(_not_sendable(target, exc))
                continue
            try:
                ((code, reply),) = smtp.exchange(smtp.rcpt_command(address), 1)
            except (smtplib.SMTPException, OSError) as exc:
                failure = classify(exc, stage="RCPT TO")
                return _Transaction(
                    entries=entries + _failed([*accepted, *targets[index:]], failure), failure=failure, broken=True
                )
            if code in (250, 251):
                accepted.append(target)
            elif _too_many_recipients(code, _text(reply)) and accepted:
                # RFC 5321 §4.5.3.1.10: the server's recipient limit; the rest go in the next
                # transaction (a 552 here is such a limit too, and temporary, says the RFC).
                leftover = targets[index:]
                break
            elif 500 <= code < 600 and not _too_many_recipients(code, _text(reply)):
                entries.append(_entry(target, TargetOutcome.REFUSED, code=code, error=_text(reply)))
            else:
                entries.append(_entry(target, TargetOutcome.DEFERRED, code=code, error=_text(reply)))
        if not accepted:
            return _Transaction(entries=entries, needs_reset=True)
        done = self._data(smtp, message, accepted, unanswered)
        done.entries = entries + done.entries
        done.leftover = leftover
        done.accepted = len(accepted)
        return done

    def _transaction_pipelined(
        self,
        smtp: SmtpConnection,
        message: bytes,
        targets: list[str],
        unanswered: dict[str, int],
        sender: str,
        options: list[str],
        smtputf8: bool,
    ) -> "_Transaction":
        """The transaction of :meth:`_transaction` for a server that advertises PIPELINING
        (RFC 2920), as real relays do: MAIL FROM, the RCPT TOs and DATA are written together
        (RCPT TOs in groups of PIPELINED_RECIPIENTS) and their replies read in order, so a
        message costs two round trips instead of one per command. The replies are judged as
        the one-by-one transaction judges them. The message itself is sent only after DATA's
        354 with a recipient accepted; a server that answers 354 without one (it should not)
        loses the connection before any content, so it has nothing to deliver."""
        entries: list[dict[str, Any]] = []
        sendable: list[tuple[str, str]] = []  # (target, address as written)
        for target in targets:
            try:
                sendable.append((target, envelope_address(target, smtputf8=smtputf8)))
            except AddressNotSendable as exc:
                entries.append(_not_sendable(target, exc))
        if not sendable:
            return _Transaction(entries=entries)
        every = [target for target, _ in sendable]
        rcpt = [smtp.rcpt_command(address) for _, address in sendable]
        groups = [rcpt[start : start + PIPELINED_RECIPIENTS] for start in range(0, len(rcpt), PIPELINED_RECIPIENTS)]
        try:
            first = [smtp.mail_command(sender, options), *groups[0]]
            replies = _commands(smtp, first + (["DATA\r\n"] if len(groups) == 1 else []))
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage="MAIL FROM")
            return _Transaction(
                entries=entries + _failed(every, failure),
                failure=failure,
                broken=True,
                # Lost before the server answered anything: nothing was taken.
                stale=isinstance(exc, (smtplib.SMTPServerDisconnected, ConnectionError)),
            )
        code, reply = replies.pop(0)
        if code != 250:
            failure = classify(smtplib.SMTPSenderRefused(code, reply, self.from_address), stage="MAIL FROM")
            # The server refused every later command of the transaction; a 354 to DATA would
            # leave it waiting for content: the connection is not reused then.
            data_open = len(groups) == 1 and replies[-1][0] == 354
            return _Transaction(
                entries=entries + _failed(every, failure), failure=failure, needs_reset=not data_open, broken=data_open
            )
        try:
            for group in groups[1:-1]:
                replies += _commands(smtp, group)
            if len(groups) > 1:
                replies += _commands(smtp, [*groups[-1], "DATA\r\n"])
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage="RCPT TO")
            return _Transaction(entries=entries + _failed(every, failure), failure=failure, broken=True)
        data = replies.pop()
        return self._pipelined_judged(smtp, message, unanswered, entries, zip(every, replies, strict=True), data)

    def _pipelined_judged(
        self,
        smtp: SmtpConnection,
        message: bytes,
        unanswered: dict[str, int],
        entries: list[dict[str, Any]],
        rcpt_replies: Iterable[tuple[str, tuple[int, bytes]]],
        data: tuple[int, bytes],
    ) -> "_Transaction":
        """The pipelined transaction after its replies are in: each RCPT TO's reply judged
        (accepted, refused, deferred, or over the server's recipient limit: ``leftover``, sent
        in the next transaction), then the message to the accepted recipients after DATA's
        354."""
        accepted: list[str] = []
        too_many: list[tuple[str, int, str]] = []
        for target, (code, reply) in rcpt_replies:
            if code in (250, 251):
                accepted.append(target)
            elif _too_many_recipients(code, _text(reply)):
                too_many.append((target, code, _text(reply)))
            else:
                entries.append(_refused_or_deferred(target, code, reply))
        data_code, data_reply = data
        if not accepted:
            # RFC 5321 §4.5.3.1.10: over the server's recipient limit with none taken is deferral.
            entries += [
                _entry(target, TargetOutcome.DEFERRED, code=code, error=text) for target, code, text in too_many
            ]
            if data_code == 354:
                return _Transaction(entries=entries, broken=True)
            return _Transaction(entries=entries, needs_reset=True)
        leftover = [target for target, _, _ in too_many]
        if data_code != 354:
            failure = classify(smtplib.SMTPDataError(data_code, data_reply), stage="DATA")
            return _Transaction(
                entries=entries + _answered(accepted, data_code, data_reply),
                failure=failure,
                needs_reset=True,
                leftover=leftover,
            )
        done = self._message_send(smtp, message, accepted, unanswered)
        done.entries = entries + done.entries
        done.leftover = leftover
        done.accepted = len(accepted)
        return done

    def _data(
        self, smtp: SmtpConnection, message: bytes, accepted: list[str], unanswered: dict[str, int]
    ) -> "_Transaction":
        """DATA, the message and the final dot. Until the final dot is sent a failure leaves
        the recipients deferred (the server cannot have the message); a failure while waiting
        for the answer to it leaves them ambiguous (it may). That wait has its own, longer
        timeout (``data_timeout_seconds``), bounded by the claim's lease."""
        try:
            ((code, reply),) = smtp.exchange("DATA\r\n", 1)
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage="DATA")
            return _Transaction(entries=_failed(accepted, failure), failure=failure, broken=True)
        if code != 354:
            failure = classify(smtplib.SMTPDataError(code, reply), stage="DATA")
            return _Transaction(entries=_answered(accepted, code, reply), failure=failure, needs_reset=True)
        return self._message_send(smtp, message, accepted, unanswered)

    def _message_send(
        self, smtp: SmtpConnection, message: bytes, accepted: list[str], unanswered: dict[str, int]
    ) -> "_Transaction":
        """After DATA's 354: the message and the final dot, and the answer to it."""
        try:
            smtp.exchange(_dot_stuffed(message))
        except (smtplib.SMTPException, OSError) as exc:
            failure = classify(exc, stage="DATA")
            return _Transaction(entries=_failed(accepted, failure), failure=failure, broken=True)
        try:
            ((code, reply),) = smtp.exchange(None, 1, wait=self._data_wait())
        except (smtplib.SMTPException, OSError) as exc:
            lost = classify(exc, stage="end of data")
            failure = DeliveryError(
                f"{lost.message}, after the whole message was sent: the server may have accepted it "
                "(retried with the same Message-ID)",
                failure_class=lost.failure_class,
                detail=lost.detail,
                ambiguous=True,
            )
            return _Transaction(entries=_unanswered(accepted, failure, unanswered), failure=failure, broken=True)
        if not 200 <= code < 600:
            failure = DeliveryError(
                f"SMTP server answered the end of the message with an unreadable reply: {_text(reply)[:200]}",
                failure_class=FailureClass.PROVIDER_ERROR,
                detail={"stage": "end of data"},
                ambiguous=True,
            )
            return _Transaction(entries=_unanswered(accepted, failure, unanswered), failure=failure, broken=True)
        if 200 <= code < 300:
            delivered = [_entry(target, TargetOutcome.DELIVERED, code=code) for target in accepted]
            for entry in delivered:
                if unanswered.get(entry["target"].lower()):
                    entry["unanswered"] = unanswered[entry["target"].lower()]
            return _Transaction(entries=delivered, reply=(code, _text(reply)[:200]))
        failure = classify(smtplib.SMTPDataError(code, reply), stage="DATA")
        return _Transaction(entries=_answered(accepted, code, reply), failure=failure, needs_reset=True)

    def _data_wait(self) -> float:
        """Seconds to wait for the answer to the final dot: ``data_timeout_seconds``, but never
        past the delivery's deadline (the claim's lease), and never below ``timeout_seconds``."""
        left = delivery_time_left()
        wait = float(self.data_timeout)
        if left is not None:
            wait = min(wait, left)
        return max(wait, float(self.timeout))

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
        return email_content_prioritised(content, priority=notification.priority)

    def _compose(
        self,
        notification: Notification,
        *,
        to: list[str],
        content: EmailContent,
        recipient: str | None = None,
        one_person: bool = False,
    ) -> bytes:
        """The message showing ``to`` in To: (empty: undisclosed recipients). ``recipient``
        names the one member an individual message goes to (it has its own Message-ID), or the
        Cc addresses of theirs. A notification that asks for acknowledgement carries its link,
        bound to ``recipient`` when ``one_person``, else to the list (the page asks for a name)."""
        _refuse_line_breaks(
            (
                ("subject", notification.subject),
                ("From address", self.from_address),
                *(("recipient", t) for t in to),
                *(("Cc address", t) for t in content.cc),
                *(("Reply-To address", t) for t in content.reply_to),
            )
        )
        notification_id = str(notification.notification_id)
        body = notification.body
        link = ack_link(notification=notification, recipient=recipient if one_person else None)
        if link:
            body, content = email_with_ack_link(body=body, content=content, link=link)
        return email_compose(
            from_address=self._from_header,
            to=[_header_address(address) for address in to],
            subject=notification.subject,
            body=body,
            message_id=message_id_for(notification_id=notification_id, domain=self._domain, recipient=recipient),
            notification_id=notification_id,
            date=_date_header(),
            content=content,
        )


_date_cache: tuple[int, str] = (0, "")


def _date_header() -> str:
    """The Date: header's value for now (RFC 5322, whole seconds), written once a second."""
    global _date_cache
    now = timezone.now()
    second = int(now.timestamp())
    cached = _date_cache  # one read: another thread may replace it meanwhile
    if cached[0] != second:
        cached = (second, format_datetime(now.replace(microsecond=0)))
        _date_cache = cached
    return cached[1]


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


def _commands(smtp: SmtpConnection, commands: list[str]) -> list[tuple[int, bytes]]:
    """Write ``commands`` (lines ending in CRLF) in one piece, then read one reply for each,
    in order (RFC 2920; only for a server that advertises PIPELINING). Every reply is read
    even when an early one refuses, so the connection stays in step."""
    return smtp.exchange("".join(commands), len(commands))


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


def _all_refused(refused: list[dict[str, Any]]) -> DeliveryError:
    """Every recipient was refused at RCPT TO: the class of the refusal. All with 5xx is the
    server's definitive refusal of every recipient (RFC 5321 §4.2.1); otherwise the first 4xx
    reply decides (a rate limit, a greylisting, a temporary problem), so the message is retried."""
    detail = "; ".join(f"{r['target']} ({r.get('smtp_code')} {r.get('error', '')})" for r in refused)
    codes = sorted({r.get("smtp_code") or 0 for r in refused})
    temporary = [r for r in refused if not 500 <= (r.get("smtp_code") or 0) < 600]
    if temporary:
        failure_class = _reply_class(temporary[0].get("smtp_code") or 0, temporary[0].get("error", ""), stage="RCPT TO")
    else:
        failure_class = FailureClass.RECIPIENT_REJECTED
    hint = ""
    if any(_helo_refused(r["error"]) for r in refused):
        # The relay refuses our EHLO name (reported at RCPT TO, as Postfix does by default):
        # no recipient is at fault, the configuration is.
        failure_class, hint = FailureClass.CONFIGURATION, f" {HELO_HINT}"
    return DeliveryError(
        f"Every recipient was refused: {detail}{hint}"[:2000],
        failure_class=failure_class,
        detail={"smtp_code": codes[-1], "stage": "RCPT TO"},
        targets=refused,
    )


HELO_HINT = (
    "The relay refuses the EHLO name: set local_hostname in the SMTP configuration to this host's fully "
    "qualified domain name."
)


def _helo_refused(text: str) -> bool:
    """True when a reply's ``text`` says the relay refuses our HELO/EHLO name."""
    lowered = text.lower()
    return "helo command rejected" in lowered or ("helo" in lowered and "fully" in lowered)


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
    if isinstance(exc, ConnectFailure):
        return exc.error  # classified (with its hint) while connecting
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
        # An untrusted or mismatched certificate: nothing is deliverable until it (or ca_file)
        # is fixed, so the channel holds its rows (a channel failure) rather than parking each.
        return DeliveryError(
            f"TLS certificate of the SMTP server is not trusted: {exc.verify_message}",
            failure_class=FailureClass.CONNECTION,
            detail={"stage": stage, "certificate": True},
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        code, text = exc.smtp_code, _text(exc.smtp_error)
        failure_class = _reply_class(code, text, stage=stage)
        verb = "deferred" if 400 <= code <= 499 else "refused"
        hint = ""
        if 500 <= code <= 599 and (stage in ("EHLO", "HELO") or _helo_refused(text)):
            failure_class, hint = FailureClass.CONFIGURATION, f" {HELO_HINT}"
        return DeliveryError(
            f"SMTP server {verb} the message{where}: {code} {text}{hint}",
            failure_class=failure_class,
            detail={"smtp_code": code, "smtp_reply": text[:200], "stage": stage},
        )
    if isinstance(exc, NoGreeting):
        return DeliveryError(
            f"SMTP server timed out{where}: {exc}", failure_class=FailureClass.TIMEOUT, detail={"stage": stage}
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


def _text(value: bytes | str) -> str:
    """A server's reply as text fit to store and show: undecodable bytes replaced, and control
    characters other than TAB and LF (a NUL, an escape sequence) written as ``\\xNN``. A remote
    server's reply must never make the attempt's record unstorable or rewrite a terminal."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text.translate(_CONTROL_ESCAPES)


# TAB and LF stay (smtplib joins the lines of a multi-line reply with LF).
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F) if chr(code) not in "\t\n"}


def _discard(smtp: SmtpConnection) -> None:
    with contextlib.suppress(OSError):
        smtp.close()


def _mail_from(smtp: SmtpConnection, sender: str, message: bytes, targets: list[str]) -> tuple[bool, str, list[str]]:
    """For MAIL FROM: whether SMTPUTF8 is used, the sender as written, and the parameters:
    ``SIZE=`` when the server advertises SIZE (an oversize message is refused before it is
    sent), ``SMTPUTF8`` when an address needs it and the server offers it."""
    smtputf8 = smtp.has_extn("smtputf8") and needs_smtputf8([sender, *targets])
    options = [f"SIZE={len(message)}"] if smtp.has_extn("size") else []
    if smtputf8:
        options.append("SMTPUTF8")
    try:
        written = envelope_address(sender, smtputf8=smtputf8)
    except AddressNotSendable as exc:
        raise ConnectFailure(
            DeliveryError(
                f"Refused to send: the From address: {exc}. Use an ASCII local part, or a relay that offers SMTPUTF8.",
                failure_class=FailureClass.CONFIGURATION,
                detail={"stage": "MAIL FROM"},
            )
        ) from exc
    return smtputf8, written, options


def _header_address(address: str) -> str:
    """``address`` as shown in a header: its domain in ASCII (punycode). An address whose
    domain IDNA 2008 refuses is shown as it is (its envelope recipient fails on its own)."""
    try:
        return address_ascii_domain(address)
    except AddressNotSendable:
        return address


def _not_sendable(target: str, exc: AddressNotSendable) -> dict[str, Any]:
    """The outcome of a recipient that cannot be written for this server: refused by Outbox
    itself (553, "mailbox name not allowed", as a server would say), never retried."""
    return {"target": target, "outcome": "refused", "smtp_code": 553, "error": f"not sent: {exc}", "local": True}


# A recipient whose message was handed over this many times without an answer is not sent it
# again without an operator's Retry: at most this many copies from unanswered hand-overs.
UNANSWERED_HANDOVERS_MAX = 2


@dataclass
class _Plan:
    """Who one delivery sends to, and how the earlier outcomes stand (``targets_owed``)."""

    members: list[str]  # list members this attempt sends to
    cc_only: list[str]  # Cc addresses (not members) this attempt sends to
    all_members: list[str]  # every member the notification goes to (the To: of mode "to")
    cc_all: list[str]  # every Cc address that is not a member
    kept: list[dict[str, Any]] = field(default_factory=list)  # earlier outcomes that stand
    order: list[str] | None = None  # every target in recorded order (None: as sent, members first)
    unanswered: dict[str, int] = field(default_factory=dict)  # earlier unanswered hand-overs, by target

    @classmethod
    def make(cls, notification: Notification, targets: list[str], content: EmailContent) -> "_Plan":
        earlier = targets_owed(notification)
        if earlier is None:
            members = _without_repeats(targets)
            keys = {member.lower() for member in members}
            cc_all = [address for address in content.cc if address.lower() not in keys] if content.cc else []
            return cls(members=members, cc_only=_without_repeats(cc_all), all_members=members, cc_all=cc_all)
        kept, owed = earlier
        recorded = notification.resolved_targets
        return cls(
            members=[entry["target"] for entry in owed if entry.get("role") != "cc"],
            cc_only=[entry["target"] for entry in owed if entry.get("role") == "cc"],
            all_members=[entry["target"] for entry in recorded if entry.get("role") != "cc"],
            cc_all=[entry["target"] for entry in recorded if entry.get("role") == "cc"],
            kept=kept,
            order=[entry["target"] for entry in recorded],
            unanswered={entry["target"].lower(): int(entry.get("unanswered") or 0) for entry in owed},
        )

    def merge(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The complete snapshot: the kept outcomes and this attempt's, in the recorded order
        (or, on a first delivery, members then Cc addresses, as sent)."""
        if self.order is None and all(entry["outcome"] == TargetOutcome.DELIVERED for entry in entries):
            return entries  # the common case: every recipient accepted, in the order sent
        order = self.order if self.order is not None else [*self.members, *self.cc_only]
        position = {target.lower(): index for index, target in enumerate(order)}
        merged = [*self.kept, *entries]
        return sorted(merged, key=lambda entry: position.get(entry["target"].lower(), len(position)))


class _Line:
    """The connection one delivery uses: taken from the pool, replaced at most once when lost
    (a pooled connection the server had closed before we spoke is replaced freely), given back
    at the end."""

    def __init__(self, session: EmailSession) -> None:
        self.session = session
        self.smtp: SmtpConnection | None = None
        self.reused = False
        self.first_reused = False
        self._pooled = True
        self._replacements = 1
        self._stopped: DeliveryError | None = None

    def get(self) -> SmtpConnection:
        """The connection; a DeliveryError when none can be had."""
        if self.smtp is not None:
            return self.smtp
        if self._stopped is not None:
            raise self._stopped
        try:
            idle = None
            if self._pooled:
                self._pooled = False
                idle = self.session._idle_take()
                self.first_reused = idle is not None
            if idle is not None:
                self.smtp, self.reused = idle, True
            else:
                self.smtp, self.reused = self.session._connect(), False
        except (smtplib.SMTPException, OSError) as exc:
            self._stopped = classify(exc, stage="connect")
            raise self._stopped from exc
        return self.smtp

    def lose(self, failure: DeliveryError | None = None, *, replace_free: bool = False) -> None:
        if self.smtp is not None:
            _discard(self.smtp)
            self.smtp = None
        self.reused = False
        if replace_free:
            return
        if self._replacements == 0:
            self._stopped = DeliveryError(
                f"not sent: the connection was lost twice ({failure.message if failure else 'connection lost'})",
                failure_class=failure.failure_class if failure else FailureClass.CONNECTION,
                detail=failure.detail if failure else {},
            )
        else:
            self._replacements -= 1

    def reset(self) -> None:
        """After a refused or failed transaction: RSET, or a new connection next time."""
        if self.smtp is None:
            return
        try:
            self.smtp.command_encoding = "ascii"  # as smtplib's rset()
            self.smtp.exchange("rset\r\n", 1)
        except (smtplib.SMTPException, OSError):
            _discard(self.smtp)
            self.smtp = None

    def release(self) -> None:
        if self.smtp is not None:
            self.session._give_back(self.smtp)
            self.smtp = None

    def abandon(self) -> None:
        if self.smtp is not None:
            _discard(self.smtp)
            self.smtp = None


@dataclass
class _Transaction:
    """What one SMTP transaction did: an entry per target it handled, the targets the server
    took no more of (``leftover``), the failure that kept any from having it, and the state of
    the connection (``broken``: lost; ``stale``: lost before the server heard a command;
    ``needs_reset``: usable after RSET)."""

    entries: list[dict[str, Any]]
    failure: DeliveryError | None = None
    broken: bool = False
    stale: bool = False
    needs_reset: bool = False
    leftover: list[str] = field(default_factory=list)
    accepted: int = 0
    reply: tuple[int, str] | None = None


def _entry(target: str, outcome: str, *, code: int | None = None, error: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"target": target, "outcome": str(outcome)}
    if code is not None:
        entry["smtp_code"] = code
    if error:
        entry["error"] = error
    return entry


def _failed(targets: Iterable[str], failure: DeliveryError) -> list[dict[str, Any]]:
    """Targets a transaction failure kept from the message before it was handed over: owed."""
    code = failure.detail.get("smtp_code")
    return [_entry(target, TargetOutcome.DEFERRED, code=code, error=failure.message) for target in targets]


def _refused_or_deferred(target: str, code: int, reply: bytes | str) -> dict[str, Any]:
    """The entry of a recipient the server did not take at RCPT TO: 5xx refuses it for good,
    anything else defers it."""
    outcome = TargetOutcome.REFUSED if 500 <= code < 600 else TargetOutcome.DEFERRED
    return _entry(target, outcome, code=code, error=_text(reply))


def _answered(targets: Iterable[str], code: int, reply: bytes | str) -> list[dict[str, Any]]:
    """Targets whose message the server answered with ``code`` at DATA: 5xx refuses it for
    good, anything else defers it."""
    outcome = TargetOutcome.REFUSED if 500 <= code < 600 else TargetOutcome.DEFERRED
    return [_entry(target, outcome, code=code, error=_text(reply)) for target in targets]


def _unanswered(targets: Iterable[str], failure: DeliveryError, earlier: dict[str, int]) -> list[dict[str, Any]]:
    """Targets whose message was handed over without an answer: ambiguous, or unknown once it
    happened UNANSWERED_HANDOVERS_MAX times."""
    entries = []
    for target in targets:
        count = earlier.get(target.lower(), 0) + 1
        outcome = TargetOutcome.UNKNOWN if count >= UNANSWERED_HANDOVERS_MAX else TargetOutcome.AMBIGUOUS
        entry = _entry(target, outcome, error=failure.message)
        entry["unanswered"] = count
        entries.append(entry)
    return entries


def _too_many_recipients(code: int, text: str) -> bool:
    """The server's recipient limit for one transaction (RFC 5321 §4.5.3.1.10: 452, or a 552
    from older servers, e.g. Postfix's ``452 4.5.3 Error: too many recipients``)."""
    if code not in (452, 552):
        return False
    enhanced = _ENHANCED_STATUS.match(text)
    if enhanced and (enhanced.group(2), enhanced.group(3)) == ("5", "3"):
        return True
    return "too many recipients" in text.lower()


_LEADING_DOT = re.compile(rb"(?m)^\.")


def _dot_stuffed(message: bytes) -> bytes:
    """The message as sent after DATA: leading dots doubled, CRLF-terminated, then the final dot."""
    # Searched for first: a message with no line starting with a dot is left as it is.
    dotted = message.startswith(b".") or b"\n." in message
    stuffed = _LEADING_DOT.sub(b"..", message) if dotted else message
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"


def _recipients_text(entries: Iterable[dict[str, Any]]) -> str:
    return "; ".join(
        f"{entry['target']} ({entry.get('smtp_code') or entry['outcome']} {entry.get('error', '')})".replace(" )", ")")
        for entry in entries
    )


_OUTCOMES = tuple(TargetOutcome.values)  # computed by the enum on every access: once here


def _counts(entries: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many of ``entries`` have each outcome (in today's words)."""
    counts = dict.fromkeys(_OUTCOMES, 0)
    for entry in entries:
        outcome = target_outcome(entry)
        if outcome in counts:
            counts[outcome] += 1
    return counts


def _shape(
    *,
    snapshot: list[dict[str, Any]],
    new: list[dict[str, Any]],
    failures: list[DeliveryError],
    detail: dict[str, Any],
    reply: tuple[int, str] | None,
) -> DeliveryResult:
    """The attempt's result from every recipient's outcome (raises DeliveryError unless every
    recipient has accepted or refused it for good, and one has accepted it). ``new``: this
    attempt's outcomes; ``failures``: what kept any recipient from having it."""
    counts, new_counts = _counts(snapshot), _counts(new)
    delivered, total = counts[TargetOutcome.DELIVERED], len(snapshot)
    detail.update(
        accepted=new_counts[TargetOutcome.DELIVERED],
        refused=new_counts[TargetOutcome.REFUSED],
        deferred=new_counts[TargetOutcome.DEFERRED],
        unanswered=new_counts[TargetOutcome.AMBIGUOUS] + new_counts[TargetOutcome.UNKNOWN],
    )
    if reply is not None:
        detail["smtp_code"], detail["smtp_reply"] = reply
    if total and delivered == total:
        # The common case: every recipient accepted it.
        warning = _warning(snapshot) if any("unanswered" in entry for entry in snapshot) else ""
        return DeliveryResult(targets=snapshot, warning=warning[:2000], detail=detail)
    ambiguous = [failure for failure in failures if failure.ambiguous]
    lead = ambiguous[0] if ambiguous else (failures[0] if failures else None)
    owed = [entry for entry in snapshot if target_outcome(entry) in OWED_OUTCOMES]
    if owed:
        raise _owed(snapshot, owed=owed, lead=lead, detail=detail, accepted_now=new_counts[TargetOutcome.DELIVERED] > 0)
    if counts[TargetOutcome.UNKNOWN]:
        raise _unknown(snapshot, lead=lead, detail=detail, ambiguous=bool(ambiguous))
    if delivered:
        return DeliveryResult(targets=snapshot, warning=_warning(snapshot)[:2000], detail=detail)
    # Every recipient refused it for good.
    if lead is not None:
        raise DeliveryError(
            lead.message, failure_class=lead.failure_class, detail={**detail, **lead.detail}, targets=snapshot
        )
    error = _all_refused(snapshot)
    error.detail = {**detail, **error.detail}
    raise error


def _unknown(
    snapshot: list[dict[str, Any]], *, lead: DeliveryError | None, detail: dict[str, Any], ambiguous: bool
) -> DeliveryError:
    """Nothing is owed, but some recipients' outcome stays unknown (handed over, never answered,
    UNANSWERED_HANDOVERS_MAX times): the row parks with that reason."""
    unknown = [entry for entry in snapshot if target_outcome(entry) == TargetOutcome.UNKNOWN]
    delivered = sum(1 for entry in snapshot if target_outcome(entry) == TargetOutcome.DELIVERED)
    times = max(int(entry.get("unanswered") or UNANSWERED_HANDOVERS_MAX) for entry in unknown)
    return DeliveryError(
        (
            f"Delivered to {delivered} of {len(snapshot)} recipients; {len(unknown)} may have it: the server never "
            f"answered after the whole message was sent, {times} times (the same Message-ID "
            f"each time). Check the relay's log before a Retry. Last: {lead.message if lead else 'no answer'}"
        )[:2000],
        failure_class=lead.failure_class if lead else FailureClass.CONNECTION,
        detail={**detail, **(lead.detail if lead else {})},
        targets=snapshot,
        ambiguous=ambiguous,
        outcome_unknown=True,
    )


def _owed(
    snapshot: list[dict[str, Any]],
    *,
    owed: list[dict[str, Any]],
    lead: DeliveryError | None,
    detail: dict[str, Any],
    accepted_now: bool,
) -> DeliveryError:
    """Some recipients are still owed the message (retried): why, in the words and class of
    the failure that kept them from it, or of their refusals for now."""
    delivered = sum(1 for entry in snapshot if target_outcome(entry) == TargetOutcome.DELIVERED)
    if lead is not None:
        failure_class, reason, extra = lead.failure_class, lead.message, lead.detail
    elif delivered == 0:
        error = _all_refused(owed)
        error.detail = {**detail, **error.detail}
        error.targets = snapshot
        return error
    else:
        # Some recipients have it, so the channel works; the rest were refused for now.
        deferred = [entry for entry in owed if entry.get("smtp_code")]
        failure_class = (
            FailureClass.PROVIDER_ERROR
            if accepted_now or not deferred
            else _reply_class(int(deferred[0]["smtp_code"]), str(deferred[0].get("error", "")), stage="RCPT TO")
        )
        reason, extra = f"refused for now: {_recipients_text(owed)}", {"stage": "RCPT TO"}
    message = reason
    if delivered:
        message = (
            f"Delivered to {delivered} of {len(snapshot)} recipients; {len(owed)} still owed it (retried): {reason}"
        )
    return DeliveryError(
        message[:2000],
        failure_class=failure_class,
        detail={**detail, **extra},
        targets=snapshot,
        ambiguous=bool(lead is not None and lead.ambiguous),
    )


def _warning(snapshot: list[dict[str, Any]]) -> str:
    """The ``last_error`` of a delivered notification: who refused it, and who may have a
    second copy."""
    parts = []
    refused = [entry for entry in snapshot if target_outcome(entry) == TargetOutcome.REFUSED]
    if refused:
        delivered = len(snapshot) - len(refused)
        parts.append(f"Delivered to {delivered} of {len(snapshot)} recipients; refused: {_recipients_text(refused)}")
    twice = [
        entry for entry in snapshot if target_outcome(entry) == TargetOutcome.DELIVERED and entry.get("unanswered")
    ]
    if twice:
        parts.append(
            f"{len(twice)} recipient(s) may have a second copy (same Message-ID): an earlier attempt got no answer "
            "after the whole message was sent"
        )
    return "; ".join(parts)


def email_send_test(*, config: SmtpConfiguration, to: str) -> DeliveryResult:
    """Send one test message to ``to`` through ``config`` as a delivery would go: the same
    connection code, the same SMTP transaction, the same failure classification. Returns the
    server's acceptance; raises DeliveryError with the failure class delivery would see."""
    message = Notification(notification_id=uuid.uuid4(), subject=TEST_SUBJECT, body=TEST_BODY)
    session = EmailSession(config)
    try:
        # A person waits for the answer in the console: the wait after the message is bounded
        # by TEST_ANSWER_WAIT_SECONDS rather than data_timeout_seconds.
        with delivery_deadline(time.monotonic() + TEST_ANSWER_WAIT_SECONDS):
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
            code, reply = smtp.noop()
        lines = _text(reply).splitlines()
        return f"{code} {lines[0] if lines else ''}".strip()
    except (smtplib.SMTPException, OSError) as exc:
        raise classify(exc, stage="NOOP") from exc
    finally:
        smtp.quit_quietly()
        session.close()
