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

from notifications.backoff import RetryTiming
from notifications.vocabulary import OWED_OUTCOMES, FailureClass, TargetOutcome, target_outcome

if TYPE_CHECKING:
    from notifications.models import Notification


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
    ``Retry-After``); a retry is then due no sooner than that. ``code``: a
    :class:`FailureCode` value when the failure has a stable name (kept on the row)."""

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
        code: str = "",
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
        self.code = code


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

    def default_timing(self) -> RetryTiming:
        """The retry timing of the channel while no delivery policy is stored for it."""
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
    """Delivers notifications of one batch, reusing connections; thread-safe. Every network
    call blocks the calling thread at most ``timeout`` seconds (and never past the delivery's
    deadline, :func:`delivery_time_left`)."""

    timeout: float = 10.0

    def deliver(self, notification: "Notification", targets: list[str]) -> DeliveryResult:
        """Deliver ``notification`` to ``targets``; a DeliveryResult or a DeliveryError.

        ``notification.resolved_targets`` holds the outcomes of earlier attempts: once a target
        has (or may have) the message, the set of targets is the recorded one and only those
        still owed it (:data:`OWED_OUTCOMES`; after an operator's Retry, every one that did not
        accept it) are sent to. See :func:`targets_owed`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the session's connections."""
