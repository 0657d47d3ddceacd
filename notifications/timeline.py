"""A notification's history in words, oldest first (the console's notification page): when the
site sent it and central stored it, each delivery attempt, each target's outcome, its escalation
steps, operator actions recorded on the row, its acknowledgement and its clearing."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from notifications.models import AcknowledgedVia, DeliveryAttempt, Notification
from notifications.vocabulary import target_outcome

ATTEMPT_WORDS: dict[str, str] = {
    DeliveryAttempt.Outcome.SUCCESS: "delivered",
    DeliveryAttempt.Outcome.TRANSIENT: "failed; to be retried",
    DeliveryAttempt.Outcome.PERMANENT: "failed for good",
    DeliveryAttempt.Outcome.AMBIGUOUS: "handed over without an answer (the receiver may have it)",
    DeliveryAttempt.Outcome.IN_PROGRESS: "in progress",
}
TARGET_WORDS = {
    "delivered": "has it",
    "refused": "refused it for good",
    "deferred": "is still owed it (retried)",
    "ambiguous": "may have it (handed over without an answer)",
    "unknown": "may have it (not retried)",
}
MAX_ERROR_SHOWN = 300
MAX_STEPS_SHOWN = 50


@dataclass(frozen=True)
class TimelineEvent:
    """One moment of the history: ``at`` (None: no time known, shown last), what happened in
    words, a ``kind`` for the page's styling, and optionally the id of another notification it
    names (an escalation step, the escalated parent)."""

    at: datetime | None
    text: str
    kind: str = "info"
    details: tuple[str, ...] = ()
    notification_id: Any = None


def notification_timeline(notification: Notification) -> list[TimelineEvent]:
    """The events of ``notification``'s history, oldest first."""
    events = [*_arrival(notification), *_attempts(notification), *_escalation(notification)]
    events += _outcomes(notification)
    events.sort(key=lambda event: (event.at is None, event.at or datetime.min))
    return events


def _arrival(notification: Notification) -> list[TimelineEvent]:
    site = notification.source_site_id
    events = [
        TimelineEvent(notification.site_enqueued_at, f"Sent by site {site}", "site"),
        TimelineEvent(
            notification.created_at,
            f"Stored at central for list {notification.list_name!r} by {notification.type}, priority "
            f"{Notification.Priority(notification.priority).label}"
            + ("; asks for acknowledgement" if notification.asks_ack else ""),
            "created",
        ),
    ]
    if notification.delivered_locally_at:
        events.append(
            TimelineEvent(notification.delivered_locally_at, f"Delivered by site {site} through its own relay", "site")
        )
    return events


def _attempts(notification: Notification) -> list[TimelineEvent]:
    events = []
    attempts = list(notification.attempts.order_by("started_at"))
    for number, attempt in enumerate(attempts, start=1):
        words = ATTEMPT_WORDS.get(attempt.outcome, attempt.outcome)
        text = f"Attempt {number}: {words}"
        if attempt.duration_ms is not None:
            text += f" in {attempt.duration_ms} ms"
        if attempt.failure_class:
            text += f" ({attempt.failure_class.replace('_', ' ')})"
        details = (attempt.error[:MAX_ERROR_SHOWN],) if attempt.error else ()
        kind = "delivered" if attempt.outcome == DeliveryAttempt.Outcome.SUCCESS else "attempt"
        events.append(TimelineEvent(attempt.started_at, text, kind, details))
    targets = notification.resolved_targets if isinstance(notification.resolved_targets, list) else []
    if targets:
        lines = tuple(_target_line(entry) for entry in targets if isinstance(entry, dict))
        at = notification.delivered_at or notification.last_attempt_at
        events.append(TimelineEvent(at, f"Targets after the latest attempt ({len(lines)})", "targets", lines))
    return events


def _target_line(entry: dict[str, Any]) -> str:
    outcome = target_outcome(entry)
    line = f"{entry.get('target', '?')} {TARGET_WORDS.get(outcome, outcome)}"
    code = entry.get("smtp_code") or entry.get("http_status") or entry.get("provider_code")
    if code:
        line += f" ({code})"
    if entry.get("provider_status"):
        line += f"; provider: {entry['provider_status']}"
    return line


def _escalation(notification: Notification) -> list[TimelineEvent]:
    events = []
    if notification.escalation_of:
        events.append(
            TimelineEvent(
                notification.created_at,
                f"Escalation step {notification.escalation_step} of another notification",
                "escalation",
                notification_id=notification.escalation_of,
            )
        )
    steps = Notification.objects.filter(escalation_of=notification.pk).order_by("created_at")[:MAX_STEPS_SHOWN]
    for step in steps.only("notification_id", "escalation_step", "list_name", "type", "status", "created_at"):
        events.append(
            TimelineEvent(
                step.created_at,
                f"Escalated: step {step.escalation_step} to list {step.list_name!r} by {step.type} ({step.status})",
                "escalation",
                notification_id=step.pk,
            )
        )
    return events


def _outcomes(notification: Notification) -> list[TimelineEvent]:
    events = []
    if notification.delivered_at:
        events.append(TimelineEvent(notification.delivered_at, "Delivered", "delivered"))
    if notification.expired_at:
        events.append(TimelineEvent(notification.expired_at, "Parked: too old to deliver", "parked"))
    if notification.discarded_at:
        reason = (notification.discard_reason,) if notification.discard_reason else ()
        by = f" by {notification.discarded_by}" if notification.discarded_by else ""
        events.append(TimelineEvent(notification.discarded_at, f"Discarded{by}", "discarded", reason))
    if notification.acknowledged_at:
        via = notification.acknowledged_via
        how = AcknowledgedVia(via).label if via in AcknowledgedVia.values else via
        note = (f"Note: {notification.acknowledged_note}",) if notification.acknowledged_note else ()
        events.append(
            TimelineEvent(
                notification.acknowledged_at, f"Acknowledged by {notification.acknowledged_by} via {how}", "ack", note
            )
        )
    if notification.cleared_at:
        note = (f"Note: {notification.cleared_note}",) if notification.cleared_note else ()
        events.append(
            TimelineEvent(notification.cleared_at, "Cleared: the alarm returned to normal at the site", "cleared", note)
        )
    return events
