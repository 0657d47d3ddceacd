"""The words every part of the outbox shares about delivery: the channels (and the adapter that
delivers each), why an attempt failed, and what happened to each target.

A leaf module: it imports no model and no adapter, so that models, adapters, dispatch, the
console and the API can all import it without an arrow pointing back up. The registry holds
dotted paths, not classes: model choices come from it without loading adapter code
(``notifications.adapters.adapter_for`` loads them).
"""

from typing import Any

from django.db import models

# Each channel (a notification's ``type``) and the dotted path of the adapter that delivers it.
ADAPTER_PATHS = {
    "email": "notifications.adapters.email.EmailAdapter",
    "teams": "notifications.adapters.teams.TeamsAdapter",
    "webhook": "notifications.adapters.webhook.WebhookAdapter",
    "sms": "notifications.adapters.sms.SmsAdapter",
    "apprise": "notifications.adapters.apprise.AppriseAdapter",
}

TYPE_CHOICES = [(name, name) for name in ADAPTER_PATHS]


class FailureClass(models.TextChoices):
    """Why an attempt failed, as one adapter-independent word (docs/architecture.md)."""

    CONNECTION = "connection", "connection"
    TIMEOUT = "timeout", "timeout"
    AUTH = "auth", "authentication"
    THROTTLED = "throttled", "throttled"
    RECIPIENT_REJECTED = "recipient_rejected", "recipient rejected"
    CONTENT_REJECTED = "content_rejected", "content rejected"
    CONFIGURATION = "configuration", "configuration"
    PROVIDER_ERROR = "provider_error", "provider error"
    UNKNOWN = "unknown", "unknown"


class FailureCode(models.TextChoices):
    """A stable name for a failure the console acts on, independent of its wording: the row's
    ``failure_code`` (empty for every other failure). The message may change; the code not."""

    UNKNOWN_LIST = "unknown_list", "the notification's list does not exist"
    NO_RECIPIENTS = "no_recipients", "the list has no recipients on the channel"


# The channel's fault, not the row's: they feed the channel's circuit breaker and never use up
# a row's attempts (only its maximum age can park it for them).
CHANNEL_FAILURES = frozenset({FailureClass.CONNECTION, FailureClass.TIMEOUT, FailureClass.AUTH, FailureClass.THROTTLED})
# Answers that prove the channel works although this message failed: they close the breaker
# like a success. (``configuration`` and ``unknown`` say nothing about the channel's health.)
HEALTHY_FAILURES = frozenset(
    {FailureClass.RECIPIENT_REJECTED, FailureClass.CONTENT_REJECTED, FailureClass.PROVIDER_ERROR}
)


class TargetOutcome(models.TextChoices):
    """What happened to one target, as ``resolved_targets`` records it (docs/recipients.md)."""

    DELIVERED = "delivered", "delivered"  # accepted by the server: never sent again
    REFUSED = "refused", "refused"  # refused for good (e.g. SMTP 5xx): never sent again
    DEFERRED = "deferred", "deferred"  # refused for now (4xx) or not reached: owed, retried
    # Handed over, but the server's answer never came: it may have it. Retried once, with the
    # same Message-ID so that a receiver can drop a second copy.
    AMBIGUOUS = "ambiguous", "ambiguous"
    # Ambiguous again on its retry: not sent again without an operator's Retry.
    UNKNOWN = "unknown", "unknown"


# Outcomes that a later attempt sends to again without anyone asking.
OWED_OUTCOMES = frozenset({TargetOutcome.DEFERRED, TargetOutcome.AMBIGUOUS})
# Outcomes written before per-target state existed, read as their present meaning.
LEGACY_OUTCOMES = {"failed": TargetOutcome.UNKNOWN, "not sent": TargetOutcome.DEFERRED}


def target_outcome(entry: dict[str, Any]) -> str:
    """The outcome of one ``resolved_targets`` entry in today's words."""
    outcome = str(entry.get("outcome", ""))
    return LEGACY_OUTCOMES.get(outcome, outcome)


def targets_summary(entries: Any) -> dict[str, Any] | None:
    """Counts of ``resolved_targets`` by outcome, the refusal codes and one line for people
    ("delivered to 118 of 120, 2 refused (550)"); None when nothing is recorded yet."""
    if not isinstance(entries, list) or not entries:
        return None
    counts = dict.fromkeys(TargetOutcome.values, 0)
    codes: set[int] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        outcome = target_outcome(entry)
        if outcome in counts:
            counts[outcome] += 1
        if outcome == TargetOutcome.REFUSED and isinstance(entry.get("smtp_code"), int):
            codes.add(entry["smtp_code"])
    total = len(entries)
    parts = [f"delivered to {counts[TargetOutcome.DELIVERED]} of {total}"]
    if counts[TargetOutcome.REFUSED]:
        refused = f"{counts[TargetOutcome.REFUSED]} refused"
        parts.append(f"{refused} ({', '.join(str(code) for code in sorted(codes))})" if codes else refused)
    if counts[TargetOutcome.DEFERRED]:
        parts.append(f"{counts[TargetOutcome.DEFERRED]} deferred (retried)")
    if counts[TargetOutcome.AMBIGUOUS]:
        parts.append(f"{counts[TargetOutcome.AMBIGUOUS]} not confirmed (retried with the same Message-ID)")
    if counts[TargetOutcome.UNKNOWN]:
        parts.append(f"{counts[TargetOutcome.UNKNOWN]} unknown (the server may have it)")
    return {"total": total, **counts, "refused_codes": sorted(codes), "text": ", ".join(parts)}
