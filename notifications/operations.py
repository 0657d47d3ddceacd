"""Operator actions on the outbox (docs/operations.md) and the SMTP "send test email" check
(through the email adapter, so the check and delivery cannot disagree).

| action    | from                        | to                                      |
|-----------|-----------------------------|-----------------------------------------|
| Retry     | Parked                      | Pending, counters reset, due now        |
| Retry now | Retrying                    | Retrying, due now                       |
| Discard   | Pending, Retrying or Parked | Discarded, with who, when and why       |
| Requeue   | Discarded                   | Pending, counters reset, due now        |
| Release   | Suppressed, or Pending held for a digest | Pending, not held, due now (Deliver anyway) |

Each is one transaction: lock the selected rows that are still in a status the action applies
to and not under a live claim (a row being delivered right now is skipped, never changed
under the worker's feet), then change them with an update that repeats both conditions, so a
dispatcher finishing a row or a second operator acting at the same moment is never
overwritten (the loser sees the row as skipped). Every changed row gets an admin history entry
naming the user; Retry, Retry now and Requeue then ask for a dispatch at once.
"""

import ipaddress
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Q

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import email_connect_test, email_send_test
from notifications.clock import database_now
from notifications.health import channel_health_prune, channel_health_reset
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    EmailRecipient,
    Notification,
    SmsTarget,
    SmtpConfiguration,
    TeamsTarget,
    WebhookTarget,
)
from notifications.policies import delivery_policy_for
from notifications.suppression import notifications_released_escalation_start
from notifications.trigger import dispatch_request
from notifications.vocabulary import CHANNEL_FAILURES

Status = Notification.Status
User = AbstractBaseUser | AnonymousUser | None
DISCARDABLE = (Status.PENDING, Status.RETRYING, Status.PARKED)
MAX_REASON_LENGTH = 2000


class ActionResult(NamedTuple):
    """``changed``: rows the action changed; ``skipped``: the other ids given (in another
    status, under a live claim, or unknown)."""

    changed: int
    skipped: int


def _transition(
    *,
    notification_ids: Iterable[Any],
    user: User,
    from_statuses: tuple[str, ...],
    changes: dict[str, Any],
    message: Callable[[str], str],
    dispatch: bool,
    also: Q | None = None,
    changed_hook: Callable[[list[Any], Any], None] | None = None,
) -> ActionResult:
    """Apply ``changes`` to those of ``notification_ids`` that are in ``from_statuses`` (or match
    ``also``) and not under a live claim. ``message(status before)`` goes to the admin history;
    ``dispatch``: ask for a dispatch once committed; ``changed_hook(ids, now)`` runs in the
    transaction for the rows changed."""
    notification_ids = list(dict.fromkeys(notification_ids))
    with transaction.atomic():
        now = database_now()
        in_status = Q(status__in=from_statuses) if also is None else Q(status__in=from_statuses) | also
        applies = in_status & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        # FOR UPDATE (PostgreSQL) makes a concurrent dispatcher or operator wait for us, then
        # see the new status; on SQLite the IMMEDIATE transaction already serialises writers.
        rows = list(
            Notification.objects.select_for_update()
            .filter(applies, pk__in=notification_ids)
            .only("notification_id", "status", "subject")
        )
        values = {name: (now if value is _NOW else value) for name, value in changes.items()}
        changed = Notification.objects.filter(applies, pk__in=[row.pk for row in rows]).update(**values)
        if rows and user is not None and user.is_authenticated:
            by_status: dict[str, list[Notification]] = {}
            for row in rows:
                by_status.setdefault(row.status, []).append(row)
            for status, group in by_status.items():
                LogEntry.objects.log_actions(
                    user_id=user.pk,
                    queryset=group,
                    action_flag=CHANGE,
                    change_message=message(status),
                )
        if changed and changed_hook is not None:
            changed_hook([row.pk for row in rows], now)
        if changed and dispatch:
            transaction.on_commit(dispatch_request)
    return ActionResult(changed=changed, skipped=len(notification_ids) - changed)


class _Now:
    """Stands for the database's "now" of the action's transaction in a changes mapping."""


_NOW = _Now()


def notification_retry(*, notification_ids: Iterable[Any], user: User) -> ActionResult:
    """Retry: Parked → Pending for the given ids, due now, with the retry counters reset and the
    maximum age counted from now. Rows that are not Parked are skipped, never changed."""
    return _transition(
        notification_ids=notification_ids,
        user=user,
        from_statuses=(Status.PARKED,),
        changes={
            "status": Status.PENDING,
            "retry_count": 0,
            "channel_failures": 0,
            "next_attempt_at": _NOW,
            "requeued_at": _NOW,
            "expired_at": None,
            "claimed_by": "",
            "claimed_until": None,
        },
        message=lambda status: "Retried by operator: Parked → Pending (retry count and next attempt reset).",
        dispatch=True,
    )


def notification_retry_now(*, notification_ids: Iterable[Any], user: User) -> ActionResult:
    """Retry now: a Retrying row's next attempt is due now (its counters stay). Rows that are not
    Retrying, or are being delivered right now, are skipped. While the row's channel is open
    the row still waits for the channel's probe."""
    return _transition(
        notification_ids=notification_ids,
        user=user,
        from_statuses=(Status.RETRYING,),
        changes={"next_attempt_at": _NOW},
        message=lambda status: "Retried now by operator: the next attempt of a Retrying notification is due now.",
        dispatch=True,
    )


_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def smtp_setting_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be the SMTP configuration's ``name`` (local_hostname, ca_file,
    client_cert, client_key, oauth_client_certificate or oauth_authority), in words, or None."""
    if name == "local_hostname":
        if value.startswith("[") and value.endswith("]"):
            try:
                ipaddress.ip_address(value[1:-1].removeprefix("IPv6:"))
            except ValueError:
                return f"{value!r} is not an address literal such as [192.0.2.1]."
            return None
        labels = value.rstrip(".").split(".")
        if len(value) > 253 or not all(_HOSTNAME_LABEL.match(label) for label in labels):
            return f"{value!r} is not a host name (letters, digits and hyphens in dot-separated labels)."
        if len(labels) < 2:
            return f"{value!r} is not fully qualified: relays expect a name such as outbox.example.com."
        return None
    if name in ("ca_file", "client_cert", "client_key", "oauth_client_certificate"):
        if not os.path.isabs(value):
            return f"{value!r} must be an absolute path (the same on every web and worker host)."
        return None
    if name == "oauth_authority":
        parsed = urlsplit(value)
        if parsed.scheme != "https" or not parsed.hostname:
            return f"{value!r} must be an https URL such as https://login.microsoftonline.com."
        return None
    return None


def notification_discard(*, notification_ids: Iterable[Any], user: User, reason: str) -> ActionResult:
    """Discard: Pending, Retrying or Parked → Discarded, with who, when and ``reason`` stored on
    the row (which is kept for audit). Rows in another status, or being delivered right now,
    are skipped. ValueError when ``reason`` is blank."""
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("A reason is required to discard notifications.")
    username = user.get_username() if user is not None and user.is_authenticated else ""
    return _transition(
        notification_ids=notification_ids,
        user=user,
        from_statuses=DISCARDABLE,
        changes={
            "status": Status.DISCARDED,
            "next_attempt_at": None,
            "escalation_due_at": None,  # a discarded notification does not escalate
            "claimed_by": "",
            "claimed_until": None,
            "discarded_at": _NOW,
            "discarded_by": username[:150],
            "discard_reason": reason[:MAX_REASON_LENGTH],
        },
        message=lambda status: f"Discarded by operator: {status} → Discarded. Reason: {reason[:MAX_REASON_LENGTH]}",
        dispatch=False,
    )


def notification_requeue(*, notification_ids: Iterable[Any], user: User) -> ActionResult:
    """Requeue: Discarded → Pending for the given ids, due now, with the retry counters reset and
    the discard record cleared (the history keeps it). Other rows are skipped."""
    return _transition(
        notification_ids=notification_ids,
        user=user,
        from_statuses=(Status.DISCARDED,),
        changes={
            "status": Status.PENDING,
            "retry_count": 0,
            "channel_failures": 0,
            "next_attempt_at": _NOW,
            "requeued_at": _NOW,
            "expired_at": None,
            "discarded_at": None,
            "discarded_by": "",
            "discard_reason": "",
            "claimed_by": "",
            "claimed_until": None,
        },
        message=lambda status: "Requeued by operator: Discarded → Pending (retry count and next attempt reset).",
        dispatch=True,
    )


def notification_release(*, notification_ids: Iterable[Any], user: User) -> ActionResult:
    """Deliver anyway: a Suppressed row, or a Pending one held for a flood digest, → Pending,
    not held, due now, counters reset; it is then delivered on its own. ``suppressed_by`` stays
    (why it had been held back: the audit keeps it; a digest keeps its own record). Other rows
    are skipped."""
    return _transition(
        notification_ids=notification_ids,
        user=user,
        from_statuses=(Status.SUPPRESSED,),
        also=Q(status=Status.PENDING, held_for_digest__isnull=False),
        changes={
            "status": Status.PENDING,
            "held_for_digest": None,
            "retry_count": 0,
            "channel_failures": 0,
            "next_attempt_at": _NOW,
            "requeued_at": _NOW,
            "claimed_by": "",
            "claimed_until": None,
        },
        message=lambda status: f"Delivered anyway by operator: {status} → Pending (released from suppression).",
        dispatch=True,
        changed_hook=lambda ids, now: notifications_released_escalation_start(notification_ids=ids, released_at=now),
    )


# --- the SMTP configuration ------------------------------------------------------------------


def channel_configuration_changed(*, channels: Iterable[str] | None = None, endpoints_moved: bool = False) -> None:
    """A configuration delivery depends on was saved (the SMTP configuration, a channel's
    configuration, a delivery policy, a list and its targets): the affected endpoints start
    afresh and an open one is probed at once (notifications.health.channel_health_reset), the
    health of endpoints no longer configured is dropped when the change may have moved one
    (``endpoints_moved``), and a dispatch is asked for once the change is committed — so the
    first delivery with the new configuration starts within a second or two, whatever the
    breaker's cool-down. ``channels``: the channels concerned (default: all)."""
    if endpoints_moved:
        channel_health_prune()
    channel_health_reset(channels=channels)
    transaction.on_commit(dispatch_request)


def smtp_configuration_changed(**kwargs: Any) -> None:
    """``post_save`` handler of the SMTP configuration (a fixed password, another relay)."""
    channel_configuration_changed(channels=["email"], endpoints_moved=True)


def channel_settings_changed(*, instance: Any, **kwargs: Any) -> None:
    """``post_save``/``post_delete`` handler of a channel's configuration (the SMS account and
    API base: its endpoint) and of a delivery policy."""
    channel_configuration_changed(
        channels=[instance.channel], endpoints_moved=isinstance(instance, ChannelConfiguration)
    )


def list_targets_changed(*, sender: Any, **kwargs: Any) -> None:
    """``post_save`` handler of a notification list (whose targets of any channel the same
    change may have touched) and of one list target (its channel)."""
    channel = LIST_TARGET_CHANNELS.get(sender)
    channel_configuration_changed(channels=None if channel is None else [channel])


# The list targets (and recipients) of each channel, for list_targets_changed.
LIST_TARGET_CHANNELS: dict[type, str] = {
    EmailRecipient: "email",
    TeamsTarget: "teams",
    WebhookTarget: "webhook",
    SmsTarget: "sms",
    AppriseTarget: "apprise",
}


@dataclass(frozen=True)
class SmtpTestResult:
    """``ok``: the server accepted the test message. ``reply``: its answer (code and text), or
    the failure as delivery would classify it, saying what delivery would then do."""

    ok: bool
    reply: str


def smtp_configuration_send_test(*, config: SmtpConfiguration, to: str) -> SmtpTestResult:
    """Send one test message through ``config`` to ``to`` with the email adapter, exactly as a
    delivery goes; returns an :class:`SmtpTestResult`. ``config`` may be unsaved (the values
    of a form not yet submitted)."""
    try:
        result = email_send_test(config=config, to=to)
    except DeliveryError as error:
        return _smtp_test_failed(error)
    return SmtpTestResult(ok=True, reply=f"{result.detail['smtp_code']} {result.detail['smtp_reply']}")


def smtp_configuration_connect_test(*, config: SmtpConfiguration) -> SmtpTestResult:
    """Connect and log in to ``config``'s server as delivery would, sending nothing; ``config``
    may be unsaved. ``reply``: the server's greeting answer, or the classified failure."""
    try:
        reply = email_connect_test(config=config)
    except DeliveryError as error:
        return _smtp_test_failed(error)
    return SmtpTestResult(ok=True, reply=reply)


def _smtp_test_failed(error: DeliveryError) -> SmtpTestResult:
    """The failed test's answer: the classified failure and what delivery would then do."""
    policy = delivery_policy_for(channel="email")
    if error.failure_class not in policy.retry_on:
        consequence = "parked at once"
    elif error.failure_class in CHANNEL_FAILURES:
        consequence = "kept waiting while the channel is retried"
    else:
        consequence = "retried"
    return SmtpTestResult(
        ok=False,
        reply=f"{error.message} (failure class {error.failure_class}: a notification failing like this "
        f"would be {consequence})",
    )


# --- one notification, by action name (the staff API) ------------------------------------------

ACTIONS = ("retry", "discard", "requeue", "release")


@dataclass(frozen=True)
class ActOutcome:
    """What :func:`notification_act` did to one notification: ``applied`` names the action
    taken ("retry", "retry_now", "discard", "requeue") or is None when it did not apply;
    ``busy``: it would have applied but the row is being delivered right now; ``notification``
    is the row afterwards (None: no such notification)."""

    notification: Notification | None
    applied: str | None = None
    busy: bool = False


def notification_act(*, notification_id: Any, action: str, user: User, reason: str = "") -> ActOutcome:
    """Apply the operator ``action`` to one notification: "retry" is Retry on a Parked row and
    Retry now on a Retrying one; "discard" (needs ``reason``; ValueError if blank), "requeue"
    and "release" (Deliver anyway) as their functions above. Conditional like them: the outcome says whether it
    applied."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if action == "discard" and not (reason or "").strip():
        raise ValueError("A reason is required to discard notifications.")
    row = Notification.objects.filter(pk=notification_id).only("status", "held_for_digest").first()
    if row is None:
        return ActOutcome(notification=None)
    applicable: dict[str, tuple[str, Callable[..., ActionResult]]] = {}
    if action == "retry":
        applicable = {
            Status.PARKED: ("retry", notification_retry),
            Status.RETRYING: ("retry_now", notification_retry_now),
        }
    elif action == "requeue":
        applicable = {Status.DISCARDED: ("requeue", notification_requeue)}
    elif action == "release":
        # A held row is Pending: the release's own condition tells a held one from another.
        held = row.held_for_digest is not None
        releasable = (Status.SUPPRESSED, Status.PENDING) if held else (Status.SUPPRESSED,)
        applicable = dict.fromkeys(releasable, ("release", notification_release))
    else:
        applicable = {
            status: ("discard", lambda **kw: notification_discard(**kw, reason=reason)) for status in DISCARDABLE
        }
    applied, busy = None, False
    if row.status in applicable:
        name, function = applicable[row.status]
        if function(notification_ids=[notification_id], user=user).changed:
            applied = name
        else:
            busy = True  # under a live claim, or changed by someone else meanwhile
    return ActOutcome(notification=Notification.objects.filter(pk=notification_id).first(), applied=applied, busy=busy)
