"""Operator actions racing dispatchers: every action is a conditional update, so a worker's
result never overwrites an operator's decision, an operator never changes a row under a live
claim, and a discarded notification is never sent after its discard."""

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from notifications.adapters.base import DeliveryResult
from notifications.dispatch.claim import notifications_claim_due
from notifications.dispatch.finish import DeliveryOutcome, Finish, delivery_attempts_record, notifications_finish
from notifications.models import Notification
from notifications.operations import (
    notification_discard,
    notification_requeue,
    notification_retry,
    notification_retry_now,
)
from tests.dispatch.conftest import channel_with, configure_smtp, fresh, queue
from tests.support.processes import manage, poll, stop

Status = Notification.Status
pytestmark = pytest.mark.usefixtures("operators_list")


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("olivia", is_staff=True)


def claim(worker):
    (row,) = notifications_claim_due(worker_id=worker, limit=1).rows
    return row, delivery_attempts_record(worker_id=worker, notifications=[row], now=timezone.now())[row.pk]


def delivered(row, attempt, worker):
    outcome = DeliveryOutcome(result=DeliveryResult(targets=[{"target": "op1@example.com", "outcome": "delivered"}]))
    return notifications_finish(
        worker_id=worker, outcomes=[Finish(notification=row, attempt=attempt, outcome=outcome, channel=channel_with())]
    )


# --- one worker, deterministic interleavings ----------------------------------------------------


def test_discard_skips_a_row_under_a_live_claim_and_the_worker_finishes_it(db, operator):
    (notification,) = queue()
    row, attempt = claim("w1")
    assert notification_discard(notification_ids=[row.pk], user=operator, reason="obsolete") == (0, 1)
    assert delivered(row, attempt, "w1").delivered == 1
    assert fresh(notification).status == Status.DELIVERED


def test_a_discard_after_the_lease_expired_stands_against_the_late_worker(db, operator):
    (notification,) = queue()
    row, attempt = claim("w1")
    Notification.objects.filter(pk=row.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))  # ran out
    assert notification_discard(notification_ids=[row.pk], user=operator, reason="obsolete") == (1, 0)
    report = delivered(row, attempt, "w1")
    assert (report.delivered, report.lost) == (0, 1)
    notification = fresh(notification)
    assert (notification.status, notification.discard_reason) == (Status.DISCARDED, "obsolete")


def test_retry_now_skips_a_retrying_row_being_delivered(db, operator):
    (notification,) = queue()
    Notification.objects.filter(pk=notification.pk).update(status=Status.RETRYING)
    row, attempt = claim("w1")
    assert notification_retry_now(notification_ids=[row.pk], user=operator) == (0, 1)
    assert delivered(row, attempt, "w1").delivered == 1


def test_requeue_and_retry_touch_only_their_statuses(db, operator):
    pending, parked, discarded = queue(3)
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED)
    Notification.objects.filter(pk=discarded.pk).update(status=Status.DISCARDED)
    ids = [pending.pk, parked.pk, discarded.pk]
    assert notification_retry(notification_ids=ids, user=operator) == (1, 2)
    assert notification_requeue(notification_ids=ids, user=operator) == (1, 2)
    assert {fresh(row).status for row in (pending, parked, discarded)} == {Status.PENDING}


# --- real dispatcher processes (PostgreSQL) -----------------------------------------------------

DISPATCHER_ENV: dict[str, Any] = {"OUTBOX_DISPATCH_INTERVAL": 0.1, "OUTBOX_BATCH_SIZE": 5, "OUTBOX_CONCURRENCY": 2}


def hammer(action, ids, stop_event, **kwargs):
    """Apply ``action`` to ``ids`` again and again until ``stop_event``; the total changed."""
    changed = 0
    try:
        while not stop_event.is_set():
            changed += action(notification_ids=ids, **kwargs).changed
            time.sleep(0.01)
    finally:
        connections.close_all()
    return changed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_discards_racing_two_dispatchers_never_let_a_discarded_row_be_sent(postgres_only, smtp_server, operator):
    configure_smtp(smtp_server)
    smtp_server.behave("accept", delay_seconds=0.05)
    ids = [row.pk for row in queue(60)]
    stop_event = threading.Event()
    operator_thread = threading.Thread(
        target=hammer, args=(notification_discard, ids[::2], stop_event), kwargs={"user": operator, "reason": "race"}
    )
    workers = [manage("dispatch", **DISPATCHER_ENV) for _ in range(2)]
    operator_thread.start()
    try:
        poll(
            lambda: not Notification.objects.filter(pk__in=ids, status__in=Notification.NON_TERMINAL).exists(),
            timeout=60,
            message="rows were left queued",
        )
    finally:
        stop_event.set()
        operator_thread.join()
        for worker in workers:
            stop(worker)
    statuses = dict(Notification.objects.filter(pk__in=ids).values_list("pk", "status"))
    received = smtp_server.count_by_notification_id()
    discarded = {pk for pk, status in statuses.items() if status == Status.DISCARDED}
    assert discarded and discarded <= set(ids[::2])
    assert all(status in (Status.DELIVERED, Status.DISCARDED) for status in statuses.values())
    # Never sent after the discard, never both: a discarded row was never under a live claim.
    assert not {str(pk) for pk in discarded} & set(received)
    assert {str(pk) for pk, status in statuses.items() if status == Status.DELIVERED} == set(received)
    assert all(count == 1 for count in received.values())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_retry_now_and_requeue_racing_a_dispatcher_send_each_row_once(postgres_only, smtp_server, operator):
    configure_smtp(smtp_server)
    retrying = queue(20)
    discarded = queue(20)
    later = timezone.now() + timedelta(hours=1)
    Notification.objects.filter(pk__in=[r.pk for r in retrying]).update(status=Status.RETRYING, next_attempt_at=later)
    Notification.objects.filter(pk__in=[r.pk for r in discarded]).update(status=Status.DISCARDED, next_attempt_at=None)
    ids = [r.pk for r in retrying + discarded]
    stop_event = threading.Event()
    threads = [
        threading.Thread(
            target=hammer,
            args=(notification_retry_now, [r.pk for r in retrying], stop_event),
            kwargs={"user": operator},
        ),
        threading.Thread(
            target=hammer, args=(notification_requeue, [r.pk for r in discarded], stop_event), kwargs={"user": operator}
        ),
    ]
    worker = manage("dispatch", **DISPATCHER_ENV)
    for thread in threads:
        thread.start()
    try:
        poll(
            lambda: Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == len(ids),
            timeout=60,
            message="not every row was delivered",
        )
    finally:
        stop_event.set()
        for thread in threads:
            thread.join()
        stop(worker)
    assert smtp_server.count_by_notification_id() == {str(pk): 1 for pk in ids}
