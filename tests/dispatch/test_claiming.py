"""Claiming with a lease, and finishing rows only while the claim is still ours."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.adapters.base import DeliveryError, DeliveryResult, RetryPolicy
from notifications.dispatch import DeliveryOutcome, notification_apply_result, notifications_claim_due
from notifications.models import DeliveryAttempt, Notification
from tests.dispatch.conftest import fresh, queue, run_pass

Status = Notification.Status


def test_claim_stamps_a_lease_and_hides_the_rows_from_other_workers(db):
    queue(3)
    claimed = notifications_claim_due(worker_id="w1", limit=2)
    assert len(claimed) == 2
    for row in Notification.objects.filter(pk__in=[n.pk for n in claimed]):
        assert row.claimed_by == "w1"
        assert row.claimed_until > timezone.now() + timedelta(seconds=60)
    others = notifications_claim_due(worker_id="w2", limit=10)
    assert len(others) == 1
    assert {n.pk for n in others}.isdisjoint({n.pk for n in claimed})
    assert notifications_claim_due(worker_id="w3", limit=10) == []


def test_a_row_whose_lease_expired_is_due_again(db):
    (notification,) = queue()
    notifications_claim_due(worker_id="crashed", limit=10)
    assert notifications_claim_due(worker_id="w2", limit=10) == []
    later = timezone.now() + timedelta(seconds=121)
    (reclaimed,) = notifications_claim_due(worker_id="w2", limit=10, now=later)
    assert reclaimed.pk == notification.pk
    assert fresh(notification).claimed_by == "w2"


def test_only_pending_and_due_retrying_rows_are_claimed(db):
    pending, retrying_due, retrying_later, parked, delivered = queue(5)
    now = timezone.now()
    Notification.objects.filter(pk=retrying_due.pk).update(status=Status.RETRYING, next_attempt_at=now)
    Notification.objects.filter(pk=retrying_later.pk).update(status=Status.RETRYING,
                                                             next_attempt_at=now + timedelta(minutes=1))  # fmt: skip
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED)
    Notification.objects.filter(pk=delivered.pk).update(status=Status.DELIVERED)
    claimed = {n.pk for n in notifications_claim_due(worker_id="w1", limit=10, now=now + timedelta(seconds=1))}
    assert claimed == {pending.pk, retrying_due.pk}


def test_a_pending_row_without_a_next_attempt_time_is_still_due(db):
    (notification,) = queue()
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=None)
    assert [n.pk for n in notifications_claim_due(worker_id="w1", limit=10)] == [notification.pk]


def test_finishing_does_not_overwrite_a_row_another_worker_reclaimed(db):
    (notification,) = queue()
    (claimed,) = notifications_claim_due(worker_id="slow", limit=1)
    Notification.objects.filter(pk=notification.pk).update(claimed_by="other")
    outcome = DeliveryOutcome(result=DeliveryResult(targets=[]), started_at=timezone.now())
    assert notification_apply_result(notification=claimed, outcome=outcome, worker_id="slow", policy=None) is False
    notification = fresh(notification)
    assert (notification.status, notification.claimed_by) == (Status.PENDING, "other")


def test_finishing_does_not_overwrite_an_operator_change_of_status(db):
    (notification,) = queue()
    (claimed,) = notifications_claim_due(worker_id="w1", limit=1)
    Notification.objects.filter(pk=notification.pk).update(status=Status.DISCARDED)
    outcome = DeliveryOutcome(error=DeliveryError("451 later", permanent=False), started_at=timezone.now())
    policy = RetryPolicy(max_retries=3, interval_seconds=60)
    assert notification_apply_result(notification=claimed, outcome=outcome, worker_id="w1", policy=policy) is False
    assert fresh(notification).status == Status.DISCARDED


def test_max_retries_of_zero_parks_on_the_first_transient_failure(db):
    (notification,) = queue()
    (claimed,) = notifications_claim_due(worker_id="w1", limit=1)
    outcome = DeliveryOutcome(error=DeliveryError("451 later", permanent=False), started_at=timezone.now())
    notification_apply_result(notification=claimed, outcome=outcome, worker_id="w1",
                              policy=RetryPolicy(max_retries=0, interval_seconds=60))  # fmt: skip
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error == "Retries exhausted (1 failed attempts): 451 later"


@pytest.mark.usefixtures("operators_list")
def test_a_stopped_pass_releases_rows_it_did_not_start_and_keeps_no_attempt_for_them(smtp_server, smtp_config):
    queue(5)
    stop = threading.Event()
    stop.set()
    report = run_pass(stop=stop)
    assert report.claimed == 0  # a stop request before the first claim claims nothing

    # Stop after the claim: every row is released untouched and due again.
    original = notifications_claim_due

    def claim_then_stop(**kwargs):
        rows = original(**kwargs)
        stop.set()
        return rows

    stop.clear()
    import notifications.dispatch as dispatch

    dispatch.notifications_claim_due, saved = claim_then_stop, dispatch.notifications_claim_due
    try:
        report = run_pass(stop=stop)
    finally:
        dispatch.notifications_claim_due = saved
    assert (report.claimed, report.released, report.delivered) == (5, 5, 0)
    assert smtp_server.count == 0
    assert DeliveryAttempt.objects.count() == 0
    assert Notification.objects.filter(status=Status.PENDING, claimed_by="", claimed_until=None).count() == 5
    assert run_pass().delivered == 5


@pytest.mark.usefixtures("operators_list")
def test_a_pass_drains_several_batches(smtp_server, smtp_config):
    queue(25)
    report = run_pass(batch_size=10)
    assert (report.batches, report.delivered, report.more_due) == (3, 25, False)
    assert smtp_server.count == 25


@pytest.mark.usefixtures("operators_list")
def test_a_pass_out_of_time_says_more_is_due(smtp_server, smtp_config):
    queue(3)
    report = run_pass(time_budget=0)
    assert (report.claimed, report.more_due) == (0, True)
