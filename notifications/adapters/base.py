"""The adapter contract: deliver one notification to its resolved targets.

An adapter opens a *session* for a batch (so connections are reused across it) and the session
delivers one notification at a time, from any of the dispatcher's threads. ``deliver`` either
returns a :class:`DeliveryResult` or raises :class:`DeliveryError`, which names the failure's
class (:class:`FailureClass`). Whether a class is retried or parked is not the adapter's
decision: the channel's delivery policy (notifications.policies) decides.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from notifications.backoff import RetryTiming
    from notifications.models import Notification


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


# Seconds (time.monotonic()) by which the delivery running in this thread must be over: the
# dispatcher sets it from the claim's lease, so that no wait outlives the claim (another worker
# would then send the message again).
_delivery_deadline: ContextVar[float | None] = ContextVar("delivery_deadline", default=None)


@contextmanager
def delivery_deadline(deadline: float | None) -> Iterator[None]:
    """Within the block, :func:`delivery_time_left` counts down to ``deadline`` (monotonic)."""
    token = _delivery_deadline.set(deadline)
    try:
        yield
    finally:
        _delivery_deadline.reset(token)


def delivery_time_left() -> float | None:
    """Seconds the current delivery may still take (None: no bound set, e.g. outside dispatch)."""
    deadline = _delivery_deadline.get()
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@dataclass(frozen=True)
class DeliveryResult:
    """A delivery the server accepted for at least one target.

    ``targets`` is the audit snapshot for ``resolved_targets``: one dict per target with at
    least ``target`` and ``outcome`` (a :class:`TargetOutcome`; in a result only "delivered"
    or "refused": a target still owed the message makes the attempt a DeliveryError, which
    carries the snapshot too). ``detail`` is adapter detail
    for the attempt record (e.g. the SMTP reply code). ``warning`` is set when some targets
    were refused; it becomes the row's ``last_error``.
    """

    targets: list[dict[str, Any]]
    detail: dict[str, Any] = field(default_factory=dict)
    warning: str = ""


class DeliveryError(Exception):
    """A failed (or not yet complete) delivery of the class ``failure_class`` (a
    :class:`FailureClass` value). ``targets``: the per-target snapshot when the adapter knows
    it (targets that already have the message are in it as "delivered"). ``ambiguous``: the
    message was handed over and the answer lost, so the server may hold it (the attempt is
    recorded as ambiguous). ``outcome_unknown``: nothing is left to retry but targets whose
    outcome stays unknown; the row parks with that reason whatever the policy says. ``retry_after``: seconds the receiver asked us to wait (an HTTP
    ``Retry-After``); a retry is then due no sooner than that."""

    def __init__(
        self,
        message: str,
        *,
        failure_class: str,
        detail: dict[str, Any] | None = None,
        targets: list[dict[str, Any]] | None = None,
        ambiguous: bool = False,
        outcome_unknown: bool = False,
        retry_after: float | None = None,
    ) -> None:
        if failure_class not in FailureClass.values:
            raise ValueError(f"unknown failure class {failure_class!r}")
        super().__init__(message)
        self.message = message
        self.failure_class = str(failure_class)
        self.detail = detail or {}
        self.targets = targets or []
        self.ambiguous = ambiguous
        self.outcome_unknown = outcome_unknown
        self.retry_after = retry_after


def targets_owed(notification: "Notification") -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """``(kept, owed)`` entries of the notification's earlier outcomes, or None when its
    targets are to be resolved afresh (nothing recorded, or no target has or may have it).

    ``owed`` are sent to by this attempt: the deferred and ambiguous ones; after an operator's
    Retry or Requeue (the row's failure count is back at 0 while outcomes are recorded), every
    one that did not accept it. ``kept`` stand as they are."""
    entries = notification.resolved_targets
    if not isinstance(entries, list) or not all(isinstance(entry, dict) and "target" in entry for entry in entries):
        return None
    has_it = {TargetOutcome.DELIVERED, TargetOutcome.AMBIGUOUS, TargetOutcome.UNKNOWN}
    if not any(target_outcome(entry) in has_it for entry in entries):
        return None
    reopened = notification.retry_count == 0
    kept: list[dict[str, Any]] = []
    owed: list[dict[str, Any]] = []
    for entry in entries:
        outcome = target_outcome(entry)
        if outcome in OWED_OUTCOMES or (reopened and outcome != TargetOutcome.DELIVERED):
            owed.append(entry)
        else:
            kept.append(entry)
    return kept, owed


class Adapter:
    """Base class for one notification type's delivery."""

    def default_timing(self) -> "RetryTiming":
        """The retry timing of the channel while no delivery policy is stored for it."""
        from notifications.backoff import RetryTiming

        return RetryTiming()

    def endpoint(self) -> str | None:
        """The endpoint deliveries go to now (the circuit breaker's key within the channel),
        or None when the channel is not configured."""
        raise NotImplementedError

    def resolve_targets(self, *, list_names: set[str]) -> dict[str, list[str]]:
        """``{list_name: [target, …]}`` for the lists that exist (missing ones are absent),
        resolved now, at delivery time."""
        raise NotImplementedError

    def open_session(self) -> "Session":
        """A :class:`Session` for one batch. Raises DeliveryError (class ``configuration``)
        when the type has no usable configuration."""
        raise NotImplementedError


class Session:
    """Delivers notifications of one batch, reusing connections; thread-safe."""

    def deliver(self, notification: "Notification", targets: list[str]) -> DeliveryResult:
        """Deliver ``notification`` to ``targets``; a DeliveryResult or a DeliveryError.

        ``notification.resolved_targets`` holds the outcomes of earlier attempts: once a target
        has (or may have) the message, the set of targets is the recorded one and only those
        still owed it (:data:`OWED_OUTCOMES`; after an operator's Retry, every one that did not
        accept it) are sent to. See :func:`targets_owed`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the session's connections."""
