"""Retry timing of a delivery policy: pure arithmetic, no Django, no clock, no randomness of its own.

A policy's ``strategy`` turns the number of failed attempts so far into the delay before the
next attempt:

=============  ==============================================================================
strategy       delay before attempt ``n + 1`` after ``n`` failed attempts (``n`` ≥ 1)
=============  ==============================================================================
``none``       never retried: the first failure is final
``immediate``  0 seconds
``fixed``      ``interval``
``linear``     ``interval × n``
``exponential`` ``interval × 2^(n − 1)``
=============  ==============================================================================

The un-jittered delay never decreases as ``n`` grows and is capped at ``max_interval`` when that
is set (> 0), and in any case at :data:`DELAY_CEILING_SECONDS` (30 days: an uncapped exponential
would otherwise leave the calendar after a few dozen failures). ``jitter`` (0–1) then takes away up to that fraction of the delay, drawn from the
caller's ``rand`` in [0, 1): workers that failed together do not all retry in the same second,
and a jittered delay never exceeds the un-jittered one (so never the cap).

``max_attempts`` bounds the failed attempts (0 = unlimited); ``max_age`` bounds how long after
ingest a notification may still be attempted (0 = no bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

STRATEGIES = ("none", "fixed", "linear", "exponential", "immediate")

# Exponents beyond this add nothing but overflow risk: 2^40 seconds is ~35,000 years.
_MAX_EXPONENT = 40
# No delay is ever longer than this, whatever the policy says.
DELAY_CEILING_SECONDS = 30 * 86_400.0


@dataclass(frozen=True)
class RetryTiming:
    """The timing part of a delivery policy (what this module needs of it)."""

    strategy: str = "fixed"
    interval_seconds: float = 60
    max_interval_seconds: float = 0
    jitter: float = 0.0
    max_attempts: int = 10
    max_age_seconds: float = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} (got {self.strategy!r})")
        if self.interval_seconds < 0 or self.max_interval_seconds < 0 or self.max_age_seconds < 0:
            raise ValueError("intervals and max_age_seconds must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1 (got {self.jitter})")
        if self.max_attempts < 0:
            raise ValueError("max_attempts must not be negative (0 means unlimited)")


def base_delay(timing: RetryTiming, *, failed_attempts: int) -> float:
    """The un-jittered delay in seconds after ``failed_attempts`` (≥ 1) failures, capped.

    For ``none`` the answer is meaningless (nothing is retried); it is 0.
    """
    n = max(1, failed_attempts)
    if timing.strategy in ("none", "immediate"):
        delay = 0.0
    elif timing.strategy == "fixed":
        delay = float(timing.interval_seconds)
    elif timing.strategy == "linear":
        delay = float(timing.interval_seconds) * n
    else:  # exponential
        delay = float(timing.interval_seconds) * 2.0 ** min(n - 1, _MAX_EXPONENT)
    if timing.max_interval_seconds:
        delay = min(delay, float(timing.max_interval_seconds))
    return min(delay, DELAY_CEILING_SECONDS)


def retry_delay(timing: RetryTiming, *, failed_attempts: int, rand: float) -> float:
    """The jittered delay: ``base × (1 − jitter × rand)``, with ``rand`` in [0, 1)."""
    return base_delay(timing, failed_attempts=failed_attempts) * (1.0 - timing.jitter * rand)


def attempts_exhausted(timing: RetryTiming, *, failed_attempts: int) -> bool:
    """True when no further attempt is allowed after ``failed_attempts`` failures."""
    if timing.strategy == "none":
        return failed_attempts >= 1
    return bool(timing.max_attempts) and failed_attempts >= timing.max_attempts


def expired(timing: RetryTiming, *, created_at: datetime, now: datetime) -> bool:
    """True when a notification created at ``created_at`` is past the policy's maximum age."""
    return bool(timing.max_age_seconds) and now - created_at >= timedelta(seconds=timing.max_age_seconds)


def next_attempt_at(timing: RetryTiming, *, failed_attempts: int, now: datetime, rand: float) -> datetime | None:
    """When to try again after ``failed_attempts`` failures, or None when the row must park
    (attempts exhausted). Expiry is checked separately, against the row's age."""
    if attempts_exhausted(timing, failed_attempts=failed_attempts):
        return None
    return now + timedelta(seconds=retry_delay(timing, failed_attempts=failed_attempts, rand=rand))
