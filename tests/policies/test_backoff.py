"""Retry timing arithmetic: every strategy, the cap, jitter bounds, attempt and age limits."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifications.backoff import (
    DELAY_CEILING_SECONDS,
    STRATEGIES,
    RetryTiming,
    attempts_exhausted,
    base_delay,
    expired,
    next_attempt_at,
    retry_delay,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

timings = st.builds(
    RetryTiming,
    strategy=st.sampled_from(STRATEGIES),
    interval_seconds=st.integers(min_value=0, max_value=86_400),
    max_interval_seconds=st.integers(min_value=0, max_value=7 * 86_400),
    jitter=st.floats(min_value=0, max_value=1),
    max_attempts=st.integers(min_value=0, max_value=1_000),
    max_age_seconds=st.integers(min_value=0, max_value=30 * 86_400),
)
failures = st.integers(min_value=1, max_value=10_000)
rands = st.floats(min_value=0, max_value=1, exclude_max=True)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("immediate", [0, 0, 0, 0]),
        ("fixed", [30, 30, 30, 30]),
        ("linear", [30, 60, 90, 120]),
        ("exponential", [30, 60, 120, 240]),
    ],
)
def test_each_strategy_spaces_attempts_as_documented(strategy, expected):
    timing = RetryTiming(strategy=strategy, interval_seconds=30)
    assert [base_delay(timing, failed_attempts=n) for n in (1, 2, 3, 4)] == expected


def test_none_strategy_parks_after_the_first_failure_whatever_max_attempts_says():
    timing = RetryTiming(strategy="none", max_attempts=0)
    assert attempts_exhausted(timing, failed_attempts=1)
    assert next_attempt_at(timing, failed_attempts=1, now=NOW, rand=0.5) is None


def test_exponential_delay_is_capped_by_max_interval():
    timing = RetryTiming(strategy="exponential", interval_seconds=10, max_interval_seconds=300)
    assert [base_delay(timing, failed_attempts=n) for n in (1, 5, 6, 50, 10_000)] == [10, 160, 300, 300, 300]


def test_zero_max_attempts_means_unlimited():
    timing = RetryTiming(strategy="fixed", max_attempts=0)
    assert not attempts_exhausted(timing, failed_attempts=1_000_000)
    assert next_attempt_at(timing, failed_attempts=1_000_000, now=NOW, rand=0) == NOW + timedelta(seconds=60)


def test_max_attempts_counts_failed_attempts():
    timing = RetryTiming(strategy="fixed", max_attempts=3)
    assert [attempts_exhausted(timing, failed_attempts=n) for n in (1, 2, 3, 4)] == [False, False, True, True]


def test_age_limit_expires_a_row_exactly_at_max_age_and_zero_means_none():
    timing = RetryTiming(max_age_seconds=3600)
    assert not expired(timing, created_at=NOW - timedelta(seconds=3599), now=NOW)
    assert expired(timing, created_at=NOW - timedelta(seconds=3600), now=NOW)
    assert not expired(RetryTiming(max_age_seconds=0), created_at=NOW - timedelta(days=3650), now=NOW)


@pytest.mark.parametrize(
    "bad",
    [
        {"strategy": "fibonacci"},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"interval_seconds": -1},
        {"max_attempts": -1},
        {"max_age_seconds": -5},
    ],
)
def test_invalid_timings_are_refused_with_the_reason(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        RetryTiming(**bad)


@given(timing=timings, n=failures)
def test_base_delay_never_decreases_as_failures_grow(timing, n):
    assert base_delay(timing, failed_attempts=n + 1) >= base_delay(timing, failed_attempts=n)


@given(timing=timings, n=failures)
def test_base_delay_never_exceeds_the_cap(timing, n):
    if timing.max_interval_seconds:
        assert base_delay(timing, failed_attempts=n) <= timing.max_interval_seconds


@given(timing=timings, n=failures, rand=rands)
def test_jittered_delay_stays_within_its_bounds(timing, n, rand):
    base = base_delay(timing, failed_attempts=n)
    delay = retry_delay(timing, failed_attempts=n, rand=rand)
    assert base * (1 - timing.jitter) - 1e-9 <= delay <= base
    assert delay >= 0


@given(timing=timings, n=failures, rand=rands)
def test_next_attempt_is_never_in_the_past_and_none_only_when_exhausted(timing, n, rand):
    when = next_attempt_at(timing, failed_attempts=n, now=NOW, rand=rand)
    if attempts_exhausted(timing, failed_attempts=n):
        assert when is None
    else:
        assert when is not None and when >= NOW


@given(timing=timings, n=failures)
def test_no_delay_ever_exceeds_the_ceiling_even_without_a_cap(timing, n):
    assert base_delay(timing, failed_attempts=n) <= DELAY_CEILING_SECONDS


def test_an_uncapped_exponential_after_thousands_of_failures_stays_a_date():
    timing = RetryTiming(strategy="exponential", interval_seconds=86_400, max_attempts=0)
    assert next_attempt_at(timing, failed_attempts=10_000, now=NOW, rand=0) == NOW + timedelta(
        seconds=DELAY_CEILING_SECONDS
    )
