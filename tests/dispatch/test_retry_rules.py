"""The delivery policy's rule for failed attempts, end to end through dispatch passes against a
real SMTP server: every strategy's spacing, jitter, max_attempts counting only the row's own
failures, retry_on, and max_age_seconds (on a failing row and on a row that only waits)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.dispatch.claim import notifications_expire
from notifications.health import dispatch_channels
from notifications.kpis import kpis_compute
from notifications.models import ChannelHealth, Notification, SmtpConfiguration
from notifications.operations import notification_retry
from notifications.policies import delivery_failure_decide
from tests.dispatch.conftest import channel_with, configure_smtp, fresh, queue, run_pass, store_policy
from tests.support.smtp import closed_port

Status = Notification.Status
pytestmark = pytest.mark.usefixtures("operators_list")


def fail_and_measure(notification, times):
    """Run ``times`` failing passes, making the row due before each; for each failure, the
    bounds of the delay it scheduled (next attempt − the moment the failure was applied, which
    lies between the start and the end of its pass), in seconds: ``(low, high)``. Bounds, not
    one figure, so that a pass slowed down by a busy machine changes nothing."""
    delays = []
    for _ in range(times):
        Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
        before = timezone.now()
        run_pass()
        after = timezone.now()
        row = fresh(notification)
        if row.next_attempt_at is None:
            break
        delays.append(((row.next_attempt_at - after).total_seconds(), (row.next_attempt_at - before).total_seconds()))
    return delays


def scheduled(delay, seconds):
    """Whether ``delay`` (bounds from fail_and_measure) is ``seconds`` after its failure."""
    low, high = delay
    return low - 0.01 <= seconds <= high + 0.01


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("fixed", [10, 10, 10]),
        ("linear", [10, 20, 30]),
        ("exponential", [10, 20, 40]),
        ("immediate", [0, 0, 0]),
    ],
)
def test_each_strategy_spaces_the_retries_of_a_failing_row(smtp_server, smtp_config, strategy, expected):
    store_policy(strategy=strategy, interval_seconds=10, max_attempts=10)
    smtp_server.behave("4xx")
    (notification,) = queue()
    delays = fail_and_measure(notification, 3)
    assert len(delays) == 3
    for delay, wanted in zip(delays, expected, strict=True):
        assert scheduled(delay, wanted), (delay, wanted)


def test_strategy_none_parks_the_first_failure_of_a_retried_class(smtp_server, smtp_config):
    store_policy(strategy="none", max_attempts=0)
    smtp_server.behave("4xx")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Retries exhausted (1 failed attempts): ")


def test_the_cap_bounds_an_exponential_delay(smtp_server, smtp_config):
    store_policy(strategy="exponential", interval_seconds=10, max_interval_seconds=25)
    smtp_server.behave("4xx")
    (notification,) = queue()
    delays = fail_and_measure(notification, 3)
    assert len(delays) == 3
    assert [scheduled(delay, wanted) for delay, wanted in zip(delays, [10, 20, 25], strict=True)] == [True] * 3, delays


def test_jitter_takes_away_at_most_its_fraction_of_each_delay(smtp_server, smtp_config):
    store_policy(strategy="fixed", interval_seconds=100, jitter=0.5)
    smtp_server.behave("4xx")
    rows = queue(12)
    before = timezone.now()
    run_pass()
    delays = [(fresh(row).next_attempt_at - before).total_seconds() for row in rows]
    assert all(50 <= delay < 102 for delay in delays)
    assert len({round(delay, 3) for delay in delays}) > 1  # spread, not all retrying at once


def test_max_attempts_counts_only_the_rows_own_failures_not_the_channels(smtp_server, smtp_config):
    store_policy(strategy="immediate", max_attempts=2, breaker_threshold=100)
    (notification,) = queue()
    SmtpConfiguration.objects.update(port=closed_port())  # the relay is down: channel failures
    fail_and_measure(notification, 4)
    row = fresh(notification)
    assert (row.status, row.retry_count, row.channel_failures) == (Status.RETRYING, 4, 4)
    assert row.last_error.startswith("Channel failure (connection; retried until the channel recovers): ")
    configure_smtp(smtp_server)
    smtp_server.behave("4xx")  # the relay is back and defers this message: the row's own failures
    fail_and_measure(notification, 1)
    row = fresh(notification)
    assert row.status == Status.RETRYING
    assert row.last_error.startswith("Transient failure (provider_error, attempt 1 of 2): ")
    fail_and_measure(notification, 1)
    row = fresh(notification)
    assert (row.status, row.retry_count) == (Status.PARKED, 6)
    assert row.last_error.startswith("Retries exhausted (2 failed attempts): ")


def test_a_class_left_out_of_retry_on_parks_at_once(smtp_server, smtp_config):
    store_policy(retry_on=["connection", "timeout", "auth", "throttled"])
    smtp_server.behave("4xx")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Permanent failure (provider_error): ")


def test_a_channel_class_left_out_of_retry_on_parks_at_once_too(db):
    SmtpConfiguration.objects.create(host="127.0.0.1", port=closed_port(), from_address="outbox@example.com")
    store_policy(retry_on=["provider_error"])
    (notification,) = queue()
    run_pass()
    assert fresh(notification).last_error.startswith("Permanent failure (connection): ")


def test_a_failing_row_past_its_maximum_age_parks_as_expired(smtp_server, smtp_config):
    store_policy(max_age_seconds=3600)
    smtp_server.behave("hang", hang_seconds=1)  # answers "451 … too late" a second later
    (notification,) = queue()
    # Young enough when the pass starts, too old when the attempt fails.
    Notification.objects.filter(pk=notification.pk).update(created_at=timezone.now() - timedelta(seconds=3600 - 0.5))
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Expired: not delivered within 1 h (last failure, provider_error: ")
    assert notification.expired_at is not None


def test_rows_waiting_for_an_open_channel_expire_without_an_attempt_and_are_counted(db):
    SmtpConfiguration.objects.create(host="127.0.0.1", port=closed_port(), from_address="outbox@example.com")
    store_policy(max_age_seconds=600)
    old, young = queue(2)
    Notification.objects.filter(pk=old.pk).update(
        status=Status.RETRYING, created_at=timezone.now() - timedelta(minutes=11), last_error="Channel failure: down"
    )
    ChannelHealth.objects.create(
        channel="email", endpoint=f"127.0.0.1:{SmtpConfiguration.objects.get().port}", state="open"
    )
    report = run_pass()
    assert (report.expired, report.claimed) == (1, 0)
    old, young = fresh(old), fresh(young)
    assert old.status == Status.PARKED
    assert old.last_error == "Expired: not delivered within 10 min; last error: Channel failure: down"
    assert old.attempts.count() == 0 and old.expired_at is not None
    assert young.status == Status.PENDING
    assert kpis_compute()["global"]["expired"] == 1


def test_an_operator_retry_restarts_the_age_so_a_retried_row_does_not_expire_at_once(db, django_user_model):
    SmtpConfiguration.objects.create(host="127.0.0.1", port=closed_port(), from_address="outbox@example.com")
    store_policy(max_age_seconds=600)
    (row,) = queue()
    Notification.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(hours=2))
    assert notifications_expire(channels=dispatch_channels()) == 1
    operator = django_user_model.objects.create_user("olivia", is_staff=True)
    assert notification_retry(notification_ids=[row.pk], user=operator).changed == 1
    assert notifications_expire(channels=dispatch_channels()) == 0
    row = fresh(row)
    assert (row.status, row.expired_at) == (Status.PENDING, None)


@pytest.mark.parametrize(
    ("failure_class", "row_failures", "status", "starts"),
    [
        ("provider_error", 1, Status.RETRYING, "Transient failure (provider_error, attempt 1 of 3): "),
        ("provider_error", 3, Status.PARKED, "Retries exhausted (3 failed attempts): "),
        ("connection", 0, Status.RETRYING, "Channel failure (connection; "),
        ("auth", 0, Status.RETRYING, "Channel failure (auth; "),
        ("recipient_rejected", 1, Status.PARKED, "Permanent failure (recipient_rejected): "),
        ("configuration", 1, Status.PARKED, "Permanent failure (configuration): "),
    ],
)
def test_the_decision_for_each_kind_of_failure(failure_class, row_failures, status, starts):
    now = timezone.now()
    decision = delivery_failure_decide(
        policy=channel_with(max_attempts=3).policy,
        failure_class=failure_class,
        message="boom",
        row_failures=row_failures,
        queued_at=now,
        now=now,
        rand=0.5,
    )
    assert decision.status == status and decision.last_error.startswith(starts)
    assert (decision.next_attempt_at is None) == (status == Status.PARKED)
