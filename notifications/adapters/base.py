"""The adapter contract: deliver one notification to its resolved targets.

An adapter opens a *session* for a batch (so connections are reused across it) and the session
delivers one notification at a time, from any of the dispatcher's threads. ``deliver`` either
returns a :class:`DeliveryResult` or raises :class:`DeliveryError`, which names the failure's
class (:class:`FailureClass`). Whether a class is retried or parked is not the adapter's
decision: the channel's delivery policy (notifications.policies) decides.
"""

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


@dataclass(frozen=True)
class DeliveryResult:
    """A delivery the server accepted for at least one target.

    ``targets`` is the audit snapshot for ``resolved_targets``: one dict per target with at
    least ``target`` and ``outcome`` ("delivered" or "refused"). ``detail`` is adapter detail
    for the attempt record (e.g. the SMTP reply code). ``warning`` is set when some targets
    were refused; it becomes the row's ``last_error``.
    """

    targets: list[dict[str, Any]]
    detail: dict[str, Any] = field(default_factory=dict)
    warning: str = ""


class DeliveryError(Exception):
    """A failed delivery of the class ``failure_class`` (a :class:`FailureClass` value).
    ``retry_after``: seconds the receiver asked us to wait (an HTTP ``Retry-After``); a retry
    is then due no sooner than that."""

    def __init__(
        self,
        message: str,
        *,
        failure_class: str,
        detail: dict[str, Any] | None = None,
        targets: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        if failure_class not in FailureClass.values:
            raise ValueError(f"unknown failure class {failure_class!r}")
        super().__init__(message)
        self.message = message
        self.failure_class = str(failure_class)
        self.detail = detail or {}
        self.targets = targets or []
        self.retry_after = retry_after


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
        """Deliver ``notification`` to ``targets``; a DeliveryResult or a DeliveryError."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the session's connections."""
