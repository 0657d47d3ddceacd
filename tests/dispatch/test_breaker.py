"""Channel health: the circuit breaker opens after consecutive channel failures, keeps its rows
waiting uncharged, lets exactly one probe through after a growing cool-down, and closes on
success — within one process, and across two real dispatcher processes sharing PostgreSQL.
The rate limit holds across two processes as well."""

import itertools
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import smtp_endpoint
from notifications.dispatch.claim import dispatch_wake_at, notifications_claim_due
from notifications.dispatch.finish import DeliveryOutcome, Finish, delivery_attempts_record, notifications_finish
from notifications.health import dispatch_channels
from notifications.models import ChannelHealth, DeliveryAttempt, Notification, SmtpConfiguration
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass, store_policy
from tests.support.processes import manage, poll, stop
from tests.support.smtp import closed_port

Status = Notification.Status
State = ChannelHealth.State
pytestmark = pytest.mark.usefixtures("operators_list")


def health():
    config = SmtpConfiguration.objects.get()
    return ChannelHealth.objects.get(channel="email", endpoint=smtp_endpoint(host=config.host, port=config.port))


def relay_down():
    """Point the SMTP configuration at a port nobody listens on (connection refused)."""
    SmtpConfiguration.objects.update_or_create(
        pk=1, defaults={"host": "127.0.0.1", "port": closed_port(), "from_address": "outbox@example.com"}
    )


def probe_due():
    ChannelHealth.objects.update(probe_after=timezone.now() - timedelta(seconds=1))


def test_consecutive_channel_failures_open_the_channel_and_the_rest_of_the_batch_is_not_charged(db):
    relay_down()
    store_policy(breaker_threshold=3, breaker_cooldown_seconds=30)
    rows = queue(10)
    report = run_pass(concurrency=1)
    state = health()
    assert state.state == State.OPEN
    assert (state.consecutive_failures, state.last_failure_class) == (3, "connection")
    assert state.opened_at is not None
    assert 29 <= (state.probe_after - state.opened_at).total_seconds() <= 30
    # Three attempts failed; the seven rows not started were released, uncharged.
    assert (report.retrying, report.released) == (3, 7)
    counts = Counter(fresh(row).retry_count for row in rows)
    assert counts == {1: 3, 0: 7}
    assert DeliveryAttempt.objects.count() == 3


def test_with_parallel_deliveries_at_most_the_ones_under_way_fail_beyond_the_threshold(db):
    relay_down()
    store_policy(breaker_threshold=3)
    queue(40)
    report = run_pass(concurrency=4)
    assert health().state == State.OPEN
    assert 3 <= report.retrying <= 3 + 3  # the threshold, plus deliveries already started by other threads
    assert report.released == 40 - report.retrying


def test_an_open_channel_gives_no_rows_until_its_probe_is_due(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=30)
    queue(3)
    run_pass(concurrency=1)
    assert health().state == State.OPEN
    Notification.objects.update(next_attempt_at=timezone.now())  # all due: still nothing is attempted
    assert notifications_claim_due(worker_id="w1", limit=10).rows == []
    assert run_pass().claimed == 0
    assert DeliveryAttempt.objects.count() == 1


def test_exactly_one_worker_probes_with_exactly_one_row(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=30)
    queue(3)
    run_pass(concurrency=1)
    Notification.objects.update(next_attempt_at=timezone.now())
    probe_due()
    first = notifications_claim_due(worker_id="w1", limit=10)
    second = notifications_claim_due(worker_id="w2", limit=10)
    assert len(first.rows) == 1 and first.probes == {first.rows[0].pk}
    assert second.rows == []
    state = health()
    assert (state.state, state.probe_claimed_by, state.probes) == (State.HALF_OPEN, "w1", 1)


def test_a_probe_that_fails_doubles_the_cool_down_up_to_the_maximum(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=10, breaker_max_cooldown_seconds=30)
    (row,) = queue()
    run_pass()
    cooldowns = [health().cooldown_seconds]
    for _ in range(3):
        Notification.objects.update(next_attempt_at=timezone.now())
        probe_due()
        assert run_pass().claimed == 1
        state = health()
        assert state.state == State.OPEN and state.probe_claimed_by == ""
        cooldowns.append(state.cooldown_seconds)
    assert cooldowns == [10, 20, 30, 30]
    assert (fresh(row).retry_count, fresh(row).channel_failures, fresh(row).status) == (4, 4, Status.RETRYING)
    assert DeliveryAttempt.objects.filter(detail__probe=True).count() == 3


def test_a_successful_probe_closes_the_channel_and_the_waiting_rows_are_delivered(db, smtp_server):
    configure_smtp(smtp_server)
    store_policy(breaker_threshold=2, breaker_cooldown_seconds=30)
    rows = queue(6)
    smtp_server.stop()  # the relay goes down …
    run_pass(concurrency=1)
    assert health().state == State.OPEN
    smtp_server.start()  # … and comes back on the same address
    Notification.objects.update(next_attempt_at=timezone.now())
    probe_due()
    report = run_pass()
    state = health()
    assert (state.state, state.consecutive_failures, state.opened_at, state.probes) == (State.CLOSED, 0, None, 0)
    assert report.delivered == 1  # the probe
    assert run_pass().delivered == 5
    assert all(fresh(row).status == Status.DELIVERED for row in rows)
    assert smtp_server.count == 6


def test_a_probe_refused_for_its_recipients_still_proves_the_channel_works(db, smtp_server):
    configure_smtp(smtp_server)
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=30)
    smtp_server.behave("4xx", reply="421 4.7.0 slow down")
    queue(2)
    run_pass(concurrency=1)
    assert health().state == State.OPEN
    smtp_server.behave("refuse", refuse={"op1@example.com", "op2@example.com"})
    Notification.objects.update(next_attempt_at=timezone.now())
    probe_due()
    run_pass()
    assert health().state == State.CLOSED


def test_saving_the_smtp_configuration_lets_an_open_channel_be_probed_at_once(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=600)
    queue()
    run_pass()
    assert health().probe_after > timezone.now() + timedelta(minutes=9)
    config = SmtpConfiguration.objects.get()
    config.password = "the fixed password"
    config.save()
    assert health().probe_after <= timezone.now()


def test_the_next_wake_time_of_an_open_channel_is_its_probe(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=30)
    queue(2)
    run_pass(concurrency=1)
    Notification.objects.update(next_attempt_at=timezone.now())
    assert dispatch_wake_at() == health().probe_after


def test_a_rate_limited_channel_gives_a_claim_no_more_rows_than_its_tokens(db, smtp_server):
    configure_smtp(smtp_server)
    store_policy(rate_per_minute=120)  # 2 a second; the bucket holds 2
    queue(10)
    first = notifications_claim_due(worker_id="w1", limit=10)
    second = notifications_claim_due(worker_id="w2", limit=10)
    assert (len(first.rows), len(second.rows)) == (2, 0)
    wake = dispatch_wake_at()
    assert wake is not None and timezone.now() < wake <= timezone.now() + timedelta(seconds=0.6)


# --- across processes (PostgreSQL) ------------------------------------------------------------

DISPATCHER_ENV: dict[str, Any] = {"OUTBOX_DISPATCH_INTERVAL": 0.2, "OUTBOX_LEASE_SECONDS": 10, "OUTBOX_CONCURRENCY": 2}


def sessions_waiting_for_me(cursor: Any) -> int:
    """How many database sessions wait for a lock this session holds (read afresh: inside a
    transaction, PostgreSQL keeps the first snapshot of pg_stat_activity unless cleared)."""
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))")
    return int(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_dispatcher_processes_share_one_breaker_open_probe_once_at_a_time_and_close(postgres_only, smtp_server):
    configure_smtp(smtp_server, retry_interval_seconds=1)
    port = smtp_server.port
    store_policy(
        strategy="fixed",
        interval_seconds=1,
        breaker_threshold=3,
        breaker_cooldown_seconds=1,
        breaker_max_cooldown_seconds=2,
    )
    smtp_server.stop()  # the relay is down
    ids = [row.pk for row in queue(20)]
    workers = []
    try:
        # Both processes make their first claim together, two rows each, so that both take part
        # whichever starts first: the table is locked (claims wait) until both wait on it.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("LOCK TABLE notifications_notification IN EXCLUSIVE MODE")
            workers = [manage("dispatch", OUTBOX_BATCH_SIZE=2, **DISPATCHER_ENV) for _ in range(2)]
            poll(
                lambda: sessions_waiting_for_me(cursor) >= 2,
                timeout=60,
                interval=0.05,
                message="the dispatchers never reached their first claim",
            )
        poll(
            lambda: ChannelHealth.objects.filter(state__in=[State.OPEN, State.HALF_OPEN]).exists(),
            timeout=20,
            message="the channel never opened",
        )
        opened_at = ChannelHealth.objects.get().opened_at
        assert opened_at is not None
        # Both processes keep running while the channel is open; wait for a few probes.
        poll(lambda: ChannelHealth.objects.get().probes >= 3, timeout=20, message="no probes were made")
        smtp_server.port = port
        smtp_server.start()  # the relay is back
        poll(
            lambda: Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == len(ids),
            timeout=30,
            message="the rows were not all delivered after the relay came back",
        )
    finally:
        for worker in workers:
            stop(worker)
    assert ChannelHealth.objects.get().state == State.CLOSED
    assert smtp_server.count_by_notification_id() == {str(pk): 1 for pk in ids}
    assert not Notification.objects.filter(status=Status.PARKED).exists()
    # While the channel was open, every attempt that started was a probe, one at a time.
    settle = opened_at + timedelta(seconds=0.5)  # attempts already under way when it opened
    late = DeliveryAttempt.objects.filter(started_at__gt=settle, failure_class__in=["connection", "timeout"])
    assert late.exists() and all(attempt.detail.get("probe") for attempt in late)
    probes = sorted(DeliveryAttempt.objects.filter(detail__probe=True).values_list("started_at", flat=True))
    assert all((later - earlier).total_seconds() >= 0.9 for earlier, later in itertools.pairwise(probes))
    workers_seen = {attempt.worker.rsplit(":", 1)[0] for attempt in DeliveryAttempt.objects.all()}
    assert len(workers_seen) == 2  # both processes took part


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_dispatcher_processes_together_keep_to_the_channels_rate(postgres_only, smtp_server):
    configure_smtp(smtp_server)
    store_policy(rate_per_minute=120)  # 2 a second; the bucket holds 2
    ids = [row.pk for row in queue(16)]
    workers = [manage("dispatch", **DISPATCHER_ENV) for _ in range(2)]
    try:
        poll(
            lambda: Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == len(ids),
            timeout=40,
            message="the rows were not all delivered",
        )
    finally:
        for worker in workers:
            stop(worker)
    assert smtp_server.count_by_notification_id() == {str(pk): 1 for pk in ids}
    # At most the bucket (2) plus the refill (2 a second) in any window: 2 + 2 × 3 in 3 s.
    assert smtp_server.most_accepted_in_any(3.0) <= 8
    assert not Notification.objects.exclude(retry_count=0).exists()  # waiting for a token is not a failure


def test_a_probe_under_way_when_the_configuration_is_fixed_does_not_postpone_the_next_one(db):
    relay_down()
    store_policy(breaker_threshold=1, breaker_cooldown_seconds=10, breaker_max_cooldown_seconds=600)
    queue(2)
    run_pass(concurrency=1)
    Notification.objects.update(next_attempt_at=timezone.now())
    probe_due()
    claim = notifications_claim_due(worker_id="prober", limit=10)  # a probe starts with the old password …
    assert len(claim.probes) == 1
    config = SmtpConfiguration.objects.get()
    config.password = "the fixed password"
    config.save()  # … and the configuration is fixed meanwhile

    (row,) = claim.rows
    attempt = delivery_attempts_record(worker_id="prober", notifications=[row], now=timezone.now())[row.pk]
    error = DeliveryError("535 authentication failed", failure_class="auth")
    notifications_finish(
        worker_id="prober",
        outcomes=[
            Finish(
                notification=row,
                attempt=attempt,
                outcome=DeliveryOutcome(error=error),
                channel=dispatch_channels()["email"],
                probe=True,
            )
        ],
    )
    state = health()
    assert state.state == State.OPEN and state.probe_after <= timezone.now()  # the next probe may start at once
