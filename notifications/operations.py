"""Operator actions on the outbox (Retry, Discard) and the SMTP "send test email" check.

Retry and Discard touch only Parked rows. Each is one transaction: lock the selected rows that
are still Parked, then change them with an update that repeats the status condition, so a
dispatcher finishing a row or a second operator acting at the same moment can never be
overwritten (the loser sees the row as skipped). Every changed row gets an admin history entry
naming the user.
"""

import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction

from notifications.clock import database_now
from notifications.models import Notification

Status = Notification.Status


def _parked_transition(*, notification_ids, user, changes, message):
    """Apply ``changes`` to those of ``notification_ids`` that are Parked; returns
    ``(changed, skipped)`` where skipped counts every other id (not Parked, or not found)."""
    notification_ids = list(dict.fromkeys(notification_ids))
    with transaction.atomic():
        # FOR UPDATE (PostgreSQL) makes a concurrent dispatcher or operator wait for us, then
        # see the new status; on SQLite the IMMEDIATE transaction already serialises writers.
        parked = list(
            Notification.objects.select_for_update()
            .filter(pk__in=notification_ids, status=Status.PARKED)
            .only("notification_id", "status", "subject")
        )
        changed = Notification.objects.filter(
            pk__in=[n.pk for n in parked], status=Status.PARKED
        ).update(**changes)
        if parked and user is not None:
            LogEntry.objects.log_actions(user_id=user.pk, queryset=parked, action_flag=CHANGE, change_message=message)
    return changed, len(notification_ids) - changed


def notification_retry(*, notification_ids, user):
    """Parked → Pending for the given ids, with retry count reset and the next attempt due now.
    Returns ``(changed, skipped)``; rows that are not Parked are skipped, never changed."""
    return _parked_transition(
        notification_ids=notification_ids,
        user=user,
        changes={
            "status": Status.PENDING,
            "retry_count": 0,
            "next_attempt_at": database_now(),
            "claimed_by": "",
            "claimed_until": None,
        },
        message="Retried by operator: Parked → Pending (retry count and next attempt reset).",
    )


def notification_discard(*, notification_ids, user):
    """Parked → Discarded for the given ids; the rows are kept for audit. Returns
    ``(changed, skipped)``; rows that are not Parked are skipped, never changed."""
    return _parked_transition(
        notification_ids=notification_ids,
        user=user,
        changes={"status": Status.DISCARDED, "next_attempt_at": None, "claimed_by": "", "claimed_until": None},
        message="Discarded by operator: Parked → Discarded.",
    )


@dataclass(frozen=True)
class SmtpTestResult:
    ok: bool
    reply: str  # the server's answer (code and text), or the error that stopped the exchange


def smtp_configuration_send_test(*, config, to):
    """Send one test message through ``config`` to ``to``; returns an :class:`SmtpTestResult`
    carrying the server's final reply to the message, or the failure that prevented it."""
    message = EmailMessage()
    message["From"] = config.from_address
    message["To"] = to
    message["Subject"] = "Outbox SMTP test"
    message["Message-ID"] = make_msgid(domain="outbox")
    message.set_content("This is a test message from the Outbox administration console.")
    smtp_class = smtplib.SMTP_SSL if config.security == config.Security.TLS else smtplib.SMTP
    kwargs = {"context": ssl.create_default_context()} if config.security == config.Security.TLS else {}
    try:
        with smtp_class(config.host, config.port, timeout=config.timeout_seconds, **kwargs) as smtp:
            smtp.ehlo_or_helo_if_needed()
            if config.security == config.Security.STARTTLS:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if config.username:
                smtp.login(config.username, config.password)
            code, text = smtp.mail(config.from_address)
            if code != 250:
                return SmtpTestResult(False, f"MAIL FROM refused: {code} {_text(text)}")
            code, text = smtp.rcpt(to)
            if code not in (250, 251):
                return SmtpTestResult(False, f"RCPT TO refused: {code} {_text(text)}")
            code, text = smtp.data(message.as_bytes())
            return SmtpTestResult(code == 250, f"{code} {_text(text)}")
    except smtplib.SMTPResponseException as exc:
        return SmtpTestResult(False, f"{exc.smtp_code} {_text(exc.smtp_error)}")
    except (smtplib.SMTPException, OSError) as exc:
        return SmtpTestResult(False, f"{type(exc).__name__}: {exc}")


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
