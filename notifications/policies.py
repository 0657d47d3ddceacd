"""Delivery policies (docs/architecture.md): the effective policy of a channel, its validation,
and what one failed attempt leads to.

A channel's policy is its stored :class:`~notifications.models.DeliveryPolicy` row or, while
there is none, the default: the adapter's retry timing (for email, the SMTP configuration's
fixed interval and attempt count) with the default ``retry_on`` and breaker settings.

The rule for a failed attempt, in order:

0. an attempt that leaves nothing to retry but recipients whose outcome is unknown (the
   message was handed over twice without an answer: the relay may hold it) parks as "Outcome
   unknown (…)": never "retries exhausted", and never sent again without an operator;
1. a class not in ``retry_on`` parks at once ("Permanent failure (<class>): …");
2. a row older than ``max_age_seconds`` parks as expired ("Expired: not delivered within …");
3. a channel failure (connection, timeout, auth, throttled, or an answer the endpoint gives
   every recipient alike: relay-wide, notifications.failure_shape) is retried after the
   strategy's first delay and never uses up the attempts: the circuit breaker paces the channel;
4. any other failure is retried per the strategy until ``max_attempts`` failed attempts
   (channel failures not counted), then parks ("Retries exhausted (N failed attempts): …").
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from notifications.adapters import adapter_for
from notifications.backoff import STRATEGIES, RetryTiming, attempts_exhausted, expired, retry_delay
from notifications.models import DeliveryPolicy, Notification, default_retry_on
from notifications.vocabulary import ADAPTER_PATHS, CHANNEL_FAILURES, FailureClass

Status = Notification.Status
MAX_ERROR_LENGTH = 4000

# The stored fields, with their type and smallest value (config file, console form).
POLICY_FIELDS: dict[str, tuple[type, float]] = {
    "strategy": (str, 0),
    "interval_seconds": (int, 0),
    "max_interval_seconds": (int, 0),
    "jitter": (float, 0),
    "max_attempts": (int, 0),
    "max_age_seconds": (int, 0),
    "retry_on": (list, 0),
    "breaker_threshold": (int, 1),
    "breaker_cooldown_seconds": (int, 1),
    "breaker_max_cooldown_seconds": (int, 1),
    "rate_per_minute": (int, 0),
}


@dataclass(frozen=True)
class ChannelPolicy:
    """The policy a channel is delivered with now. ``stored``: from a DeliveryPolicy row (else
    the default)."""

    channel: str
    timing: RetryTiming
    retry_on: frozenset[str]
    breaker_threshold: int = 5
    breaker_cooldown_seconds: int = 30
    breaker_max_cooldown_seconds: int = 600
    rate_per_minute: int = 0
    stored: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The policy in the configuration file's shape."""
        return {
            "strategy": self.timing.strategy,
            "interval_seconds": int(self.timing.interval_seconds),
            "max_interval_seconds": int(self.timing.max_interval_seconds),
            "jitter": self.timing.jitter,
            "max_attempts": self.timing.max_attempts,
            "max_age_seconds": int(self.timing.max_age_seconds),
            "retry_on": [value for value in FailureClass.values if value in self.retry_on],
            "breaker_threshold": self.breaker_threshold,
            "breaker_cooldown_seconds": self.breaker_cooldown_seconds,
            "breaker_max_cooldown_seconds": self.breaker_max_cooldown_seconds,
            "rate_per_minute": self.rate_per_minute,
        }


def delivery_policy_default(*, channel: str) -> ChannelPolicy:
    """The policy of ``channel`` while no DeliveryPolicy row exists for it."""
    try:
        timing = adapter_for(channel).default_timing()
    except KeyError:
        timing = RetryTiming()
    return ChannelPolicy(channel=channel, timing=timing, retry_on=frozenset(default_retry_on()))


def delivery_policy_from_row(row: DeliveryPolicy) -> ChannelPolicy:
    """The effective policy a stored row describes."""
    return ChannelPolicy(
        channel=row.channel,
        timing=RetryTiming(
            strategy=row.strategy,
            interval_seconds=row.interval_seconds,
            max_interval_seconds=row.max_interval_seconds,
            jitter=row.jitter,
            max_attempts=row.max_attempts,
            max_age_seconds=row.max_age_seconds,
        ),
        retry_on=frozenset(row.retry_on),
        breaker_threshold=row.breaker_threshold,
        breaker_cooldown_seconds=row.breaker_cooldown_seconds,
        breaker_max_cooldown_seconds=row.breaker_max_cooldown_seconds,
        rate_per_minute=row.rate_per_minute,
        stored=True,
    )


def delivery_policy_for(*, channel: str) -> ChannelPolicy:
    """The policy ``channel`` is delivered with now: its stored row, else the default."""
    row = DeliveryPolicy.objects.filter(channel=channel).first()
    return delivery_policy_from_row(row) if row is not None else delivery_policy_default(channel=channel)


def delivery_policies_all() -> dict[str, ChannelPolicy]:
    """The effective policy of every registered channel (one query for the stored rows)."""
    stored = {row.channel: row for row in DeliveryPolicy.objects.all()}
    return {
        channel: delivery_policy_from_row(stored[channel])
        if channel in stored
        else delivery_policy_default(channel=channel)
        for channel in ADAPTER_PATHS
    }


def delivery_policy_validate(*, values: Mapping[str, Any]) -> dict[str, str]:
    """Problems with a complete or partial set of policy ``values``, by field name; empty when
    valid. Unknown fields, wrong types, out-of-range numbers, unknown strategies or failure
    classes, and a maximum cool-down below the first are problems."""
    problems: dict[str, str] = {}
    for name in sorted(set(values) - set(POLICY_FIELDS)):
        problems[name] = "unknown field."
    for name, (kind, smallest) in POLICY_FIELDS.items():
        problem = _policy_value_problem(values[name], kind, smallest) if name in values else None
        if problem:
            problems[name] = problem
    if "strategy" not in problems and "strategy" in values and values["strategy"] not in STRATEGIES:
        problems["strategy"] = f"{values['strategy']!r} is not one of {', '.join(STRATEGIES)}."
    if "jitter" not in problems and "jitter" in values and not 0 <= values["jitter"] <= 1:
        problems["jitter"] = "must be between 0 and 1."
    if "retry_on" not in problems and "retry_on" in values:
        problem = _retry_on_problem(values["retry_on"])
        if problem:
            problems["retry_on"] = problem
    first, most = values.get("breaker_cooldown_seconds"), values.get("breaker_max_cooldown_seconds")
    if (
        isinstance(first, int)
        and isinstance(most, int)
        and not {"breaker_cooldown_seconds", "breaker_max_cooldown_seconds"} & set(problems)
        and most < first
    ):
        problems["breaker_max_cooldown_seconds"] = "must not be below breaker_cooldown_seconds."
    return problems


def _policy_value_problem(value: Any, kind: type, smallest: float) -> str | None:
    """What is wrong with one policy field's ``value`` of ``kind`` (numbers at least
    ``smallest``), or None."""
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        words = {str: "a string", int: "an integer", float: "a number", list: "a list of failure classes"}
        return f"must be {words[kind]}."
    if kind in (int, float) and value < smallest:
        return f"must be at least {smallest:g}."
    return None


def _retry_on_problem(retry_on: list[Any]) -> str | None:
    """What is wrong with a ``retry_on`` list (unknown or repeated failure classes), or None."""
    unknown = [item for item in retry_on if item not in FailureClass.values]
    if unknown:
        return f"{', '.join(repr(item) for item in unknown)} not failure classes (known: {', '.join(FailureClass.values)})."
    if len(set(retry_on)) != len(retry_on):
        return "lists a failure class twice."
    return None


def delivery_policy_store(*, channel: str, values: Mapping[str, Any]) -> tuple[DeliveryPolicy, bool]:
    """Create or update ``channel``'s stored policy with ``values`` (validated by the caller);
    a new row starts from the channel's current effective policy, so fields not given keep
    their present meaning. Returns ``(row, created)``."""
    row = DeliveryPolicy.objects.filter(channel=channel).first()
    created = row is None
    if row is None:
        row = DeliveryPolicy(channel=channel, **delivery_policy_default(channel=channel).as_dict())
    for name, value in values.items():
        setattr(row, name, list(value) if name == "retry_on" else value)
    row.save()
    return row, created


# --- what a failure leads to ---------------------------------------------------------------


@dataclass(frozen=True)
class FailureDecision:
    """What one failed attempt does to its row: ``status`` Retrying (due at
    ``next_attempt_at``) or Parked; ``channel_failure``: the channel's fault (does not count
    against ``max_attempts``); ``expired``: parked for its age."""

    status: str
    next_attempt_at: datetime | None
    last_error: str
    channel_failure: bool
    expired: bool = False


def delivery_failure_decide(
    *,
    policy: ChannelPolicy,
    failure_class: str,
    message: str,
    row_failures: int,
    queued_at: datetime,
    now: datetime,
    rand: float,
    outcome_unknown: bool = False,
    relay_wide: str = "",
) -> FailureDecision:
    """The rule of the module docstring for one failed attempt of class ``failure_class``.

    ``row_failures`` counts this row's failed attempts that were not the channel's fault,
    including this one if it is not; ``outcome_unknown``: the attempt left only recipients
    whose outcome is unknown (rule 0); ``queued_at`` is when the row's maximum age started
    (ingest, or the last operator Retry or Requeue); ``rand`` in [0, 1) draws the jitter;
    ``relay_wide``: the answer (e.g. "451 4.3.5") this attempt got is its endpoint's failure,
    so the attempt is a channel failure whatever its class.
    """
    timing = policy.timing
    channel_failure = failure_class in CHANNEL_FAILURES or bool(relay_wide)

    def park(text: str, *, is_expired: bool = False) -> FailureDecision:
        return FailureDecision(
            status=Status.PARKED,
            next_attempt_at=None,
            last_error=text[:MAX_ERROR_LENGTH],
            channel_failure=channel_failure,
            expired=is_expired,
        )

    if outcome_unknown:
        return park(f"Outcome unknown ({failure_class}; the relay may have accepted it): {message}")
    if failure_class not in policy.retry_on:
        return park(f"Permanent failure ({failure_class}): {message}")
    if expired(timing, created_at=queued_at, now=now):
        return park(
            f"Expired: not delivered within {_duration(timing.max_age_seconds)} "
            f"(last failure, {failure_class}: {message})",
            is_expired=True,
        )
    if channel_failure:
        # The breaker spaces the channel's attempts; the row only waits the first delay, so
        # that it is due again as soon as the channel recovers.
        delay = retry_delay(timing, failed_attempts=1, rand=rand)
        shape = f"; relay-wide {relay_wide}" if relay_wide else ""
        text = f"Channel failure ({failure_class}{shape}; retried until the channel recovers): {message}"
    elif attempts_exhausted(timing, failed_attempts=row_failures):
        return park(f"Retries exhausted ({row_failures} failed attempts): {message}")
    else:
        delay = retry_delay(timing, failed_attempts=row_failures, rand=rand)
        of = f" of {timing.max_attempts}" if timing.max_attempts else ""
        text = f"Transient failure ({failure_class}, attempt {row_failures}{of}): {message}"
    return FailureDecision(
        status=Status.RETRYING,
        next_attempt_at=now + timedelta(seconds=delay),
        last_error=text[:MAX_ERROR_LENGTH],
        channel_failure=channel_failure,
    )


def delivery_expired_message(*, policy: ChannelPolicy) -> str:
    """``last_error`` of a row that expired while it waited (no attempt failed just now)."""
    return f"Expired: not delivered within {_duration(policy.timing.max_age_seconds)}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
