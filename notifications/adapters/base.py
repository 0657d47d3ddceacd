"""The adapter contract: deliver one notification to its resolved targets.

An adapter opens a *session* for a batch (so connections are reused across it) and the session
delivers one notification at a time, from any of the dispatcher's threads. ``deliver`` either
returns a :class:`DeliveryResult` or raises :class:`DeliveryError`, which says whether the
failure is permanent (park now) or transient (retry later).
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RetryPolicy:
    """How a type's transient failures are retried: a fixed interval, at most ``max_retries``
    failed attempts before the notification is parked."""

    max_retries: int
    interval_seconds: int


@dataclass(frozen=True)
class DeliveryResult:
    """A delivery the server accepted for at least one target.

    ``targets`` is the audit snapshot for ``resolved_targets``: one dict per target with at
    least ``target`` and ``outcome`` ("delivered" or "refused"). ``detail`` is adapter detail
    for the attempt record (e.g. the SMTP reply code). ``warning`` is set when some targets
    were refused; it becomes the row's ``last_error``.
    """

    targets: list
    detail: dict = field(default_factory=dict)
    warning: str = ""


class DeliveryError(Exception):
    """A failed delivery. ``permanent`` failures are parked at once; others are retried."""

    def __init__(self, message, *, permanent, detail=None, targets=None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.detail = detail or {}
        self.targets = targets or []


class Adapter:
    """Base class for one notification type's delivery."""

    def retry_policy(self):
        """The type's :class:`RetryPolicy`, or None when the type is not configured (then
        every failure is permanent)."""
        return None

    def resolve_targets(self, *, list_names):
        """``{list_name: [target, …]}`` for the lists that exist (missing ones are absent),
        resolved now, at delivery time."""
        raise NotImplementedError

    def open_session(self):
        """A :class:`Session` for one batch. Raises DeliveryError(permanent=True) when the
        type has no usable configuration."""
        raise NotImplementedError


class Session:
    """Delivers notifications of one batch, reusing connections; thread-safe."""

    def deliver(self, notification, targets):
        """Deliver ``notification`` to ``targets``; a DeliveryResult or a DeliveryError."""
        raise NotImplementedError

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
