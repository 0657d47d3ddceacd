"""Escalation in one process: steps started at ingest, children created when due and delivered
by the same pass, stopped by acknowledgement, clearing and discarding, repeated, never twice;
the waiting worker wakes for a step's due time. Real PostgreSQL, real HTTP receivers.
(Real worker processes: test_escalation_workers.py.)"""

import threading
import time
from datetime import UTC, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from notifications.acknowledgement import acknowledge, clear
from notifications.clock import database_now
from notifications.dispatch.claim import dispatch_wake_at
from notifications.dispatch.wait import dispatch_wait
from notifications.escalation import (
    escalation_step,
    notifications_escalate_due,
)
from notifications.ingest import notification_status_record
from notifications.models import EmailRecipient, Notification, NotificationList, WebhookTarget
from notifications.operations import notification_discard
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.receivers import WebhookReceiver, new_webhook_secret

Status = Notification.Status


@pytest.fixture
def receiver():
    with WebhookReceiver() as hooks:
        yield hooks


@pytest.fixture
def leads(db, receiver):
    """The list steps escalate to: a webhook on the receiver."""
    leads = NotificationList.objects.create(name="Shift-Leads")
    secret = new_webhook_secret()
    receiver.secrets["/leads"] = secret
    WebhookTarget.objects.create(notification_list=leads, url=receiver.url("/leads"), secret=secret)
    return leads


@pytest.fixture
def operators(leads):
    """The list alarms go to, escalating to Shift-Leads by webhook after 60 s, then 120 s."""
    return NotificationList.objects.create(
        name="Operators",
        ack_required_from="high",
        escalation=[
            {"after_seconds": 60, "list": "Shift-Leads", "type": "webhook"},
            {"after_seconds": 120, "list": "Shift-Leads", "type": "webhook"},
        ],
    )


def raise_alarm(**overrides):
    overrides.setdefault("priority", "high")
    overrides.setdefault("subject", "Gas detector 4 fault")
    (notification,) = queue(list_name="Operators", **overrides)
    return notification


def make_step_due(notification, *, seconds_ago=0.0):
    """Time compression: move the notification's creation back so that its next step is due
    ``seconds_ago`` seconds ago (instead of waiting for it)."""
    notification = fresh(notification)
    shift = notification.escalation_due_at - database_now() + timedelta(seconds=seconds_ago)
    Notification.objects.filter(pk=notification.pk).update(
        created_at=notification.created_at - shift, escalation_due_at=notification.escalation_due_at - shift
    )
    return fresh(notification)


def children_of(notification):
    return list(Notification.objects.filter(escalation_of=notification.pk).order_by("escalation_step"))


# --- starting ----------------------------------------------------------------------------------


def test_a_notification_that_asks_for_acknowledgement_has_its_first_step_due_after_its_creation(operators):
    alarm = fresh(raise_alarm())
    assert alarm.asks_ack is True
    assert alarm.escalation_step == 0
    assert alarm.escalation_due_at == alarm.created_at + timedelta(seconds=60)


def test_a_notification_below_the_lists_ack_required_from_neither_asks_nor_escalates(operators):
    notice = fresh(raise_alarm(priority="normal"))
    assert notice.asks_ack is False
    assert notice.escalation_due_at is None


def test_a_list_without_steps_asks_for_acknowledgement_but_does_not_escalate(db):
    NotificationList.objects.create(name="Operators")
    alarm = fresh(raise_alarm())
    assert (alarm.asks_ack, alarm.escalation_due_at, alarm.escalation_step) == (True, None, None)


# --- taking a step ------------------------------------------------------------------------------


def test_a_due_step_creates_its_child_for_the_steps_list_and_channel_and_the_same_pass_delivers_it(operators, receiver):
    alarm = make_step_due(raise_alarm(type_data={"cc": ["x@example.com"]}))
    report = run_pass()
    assert report.escalated == 1
    (child,) = children_of(alarm)
    assert (child.escalation_step, child.type, child.list_name) == (1, "webhook", "Shift-Leads")
    assert child.subject == "[Escalation 1] Gas detector 4 fault"
    assert (child.priority, child.source_site_id, child.body) == (alarm.priority, alarm.source_site_id, alarm.body)
    assert child.type_data == {}  # the parent's email fields mean nothing to a webhook
    assert child.asks_ack is True and child.escalation_due_at is None
    assert child.notification_id != alarm.notification_id
    assert fresh(child).status == Status.DELIVERED
    (request,) = receiver.to("/leads")
    assert request.json()["subject"] == "[Escalation 1] Gas detector 4 fault"
    alarm = fresh(alarm)
    assert alarm.escalation_due_at == alarm.created_at + timedelta(seconds=120)  # step 2, from creation


def test_the_child_is_created_at_the_database_time_of_the_pass_within_a_second_of_due(operators):
    alarm = make_step_due(raise_alarm())
    notifications_escalate_due()
    (child,) = children_of(alarm)
    assert timedelta(0) <= child.created_at - alarm.escalation_due_at < timedelta(seconds=1)


def test_a_step_not_yet_due_creates_nothing(operators):
    alarm = raise_alarm()
    assert notifications_escalate_due().created == 0
    assert children_of(alarm) == []


def test_the_parents_status_record_lists_its_escalations(operators):
    alarm = make_step_due(raise_alarm())
    notifications_escalate_due()
    (child,) = children_of(alarm)
    record = notification_status_record(fresh(alarm), staff=True)
    assert record["escalations"] == [
        {
            "step": 1,
            "notification_id": str(child.pk),
            "list_name": "Shift-Leads",
            "type": "webhook",
            "status": "Pending",
            "created_at": child.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        }
    ]
    assert notification_status_record(child)["escalations"] == []


def test_a_child_never_starts_its_own_lists_escalation(operators, leads):
    leads.escalation = [{"after_seconds": 1, "list": "Operators", "type": "email"}]
    leads.ack_required_from = "low"
    leads.save()
    alarm = make_step_due(raise_alarm())
    notifications_escalate_due()
    (child,) = children_of(alarm)
    assert child.escalation_due_at is None
    Notification.objects.filter(pk=child.pk).update(escalation_due_at=database_now())  # even if told to
    notifications_escalate_due()
    assert children_of(child) == []
    assert fresh(child).escalation_due_at is None


def test_after_the_last_step_without_repeat_the_escalation_ends(operators):
    alarm = raise_alarm()
    for _ in range(2):
        make_step_due(alarm)
        notifications_escalate_due()
    assert [child.escalation_step for child in children_of(alarm)] == [1, 2]
    assert fresh(alarm).escalation_due_at is None


def test_the_last_step_repeats_with_increasing_step_numbers_until_acknowledged(operators):
    operators.repeat_last_every_seconds = 30
    operators.save()
    alarm = raise_alarm()
    for _ in range(2):
        make_step_due(alarm)
        notifications_escalate_due()
    due_of_step_3 = fresh(alarm).escalation_due_at
    assert due_of_step_3 == fresh(alarm).created_at + timedelta(seconds=120 + 30)
    make_step_due(alarm)
    notifications_escalate_due()
    children = children_of(alarm)
    assert [c.escalation_step for c in children] == [1, 2, 3]
    assert children[2].subject.startswith("[Escalation 3] ") and children[2].list_name == "Shift-Leads"
    Notification.objects.filter(pk=alarm.pk).update(acknowledged_at=database_now())
    make_step_due(alarm)
    notifications_escalate_due()
    assert len(children_of(alarm)) == 3


def test_a_repeat_missed_while_no_worker_ran_is_taken_once_not_made_up(operators):
    operators.repeat_last_every_seconds = 10
    operators.save()
    alarm = raise_alarm()
    for _ in range(2):
        make_step_due(alarm)
        notifications_escalate_due()
    make_step_due(alarm, seconds_ago=100)  # ten repeats' worth
    notifications_escalate_due()
    assert len(children_of(alarm)) == 3
    assert fresh(alarm).escalation_due_at > database_now() + timedelta(seconds=9)


# --- stopping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["acknowledged", "cleared"])
def test_acknowledged_or_cleared_before_due_no_child_is_created(operators, stop):
    alarm = raise_alarm()
    if stop == "acknowledged":
        assert acknowledge(alarm.pk, via="console", by="olivia").changed
    else:
        assert clear(alarm.pk, note="pressure back to normal", site_id="plant-a").changed
    assert fresh(alarm).escalation_due_at is None  # no longer a wake time
    Notification.objects.filter(pk=alarm.pk).update(escalation_due_at=database_now())  # a late step would not run
    report = notifications_escalate_due()
    assert children_of(alarm) == []
    assert report.stopped == 1
    assert fresh(alarm).escalation_due_at is None


def test_a_row_acknowledged_behind_the_due_pass_is_dropped_by_it(operators):
    alarm = make_step_due(raise_alarm())
    Notification.objects.filter(pk=alarm.pk).update(acknowledged_at=database_now())  # due time left behind
    assert notifications_escalate_due().stopped == 1
    assert children_of(alarm) == [] and fresh(alarm).escalation_due_at is None


def test_acknowledged_after_step_one_no_step_two(operators):
    alarm = make_step_due(raise_alarm())
    notifications_escalate_due()
    (child,) = children_of(alarm)
    assert acknowledge(child.pk, via="link", by="lead@example.com").changed  # the child's link counts
    assert fresh(alarm).acknowledged_at is not None and fresh(alarm).escalation_due_at is None
    Notification.objects.filter(pk=alarm.pk).update(escalation_due_at=database_now())
    notifications_escalate_due()
    assert [child.escalation_step for child in children_of(alarm)] == [1]


def test_discarding_the_parent_cancels_its_escalation(operators, smtp_config):
    alarm = raise_alarm()
    user = User.objects.create_user("op")
    result = notification_discard(notification_ids=[alarm.pk], user=user, reason="a test alarm")
    assert result.changed == 1
    assert fresh(alarm).escalation_due_at is None
    Notification.objects.filter(pk=alarm.pk).update(escalation_due_at=database_now())  # a late one is dropped too
    notifications_escalate_due()
    assert children_of(alarm) == []


def test_a_parked_or_delivered_parent_still_escalates(operators):
    parked = raise_alarm()
    delivered = raise_alarm()
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED, next_attempt_at=None)
    Notification.objects.filter(pk=delivered.pk).update(status=Status.DELIVERED, next_attempt_at=None)
    make_step_due(parked)
    make_step_due(delivered)
    assert notifications_escalate_due().created == 2


# --- exactly once ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_workers_taking_due_steps_at_once_create_one_child_per_step(postgres_only, leads):
    NotificationList.objects.create(
        name="Operators", escalation=[{"after_seconds": 60, "list": "Shift-Leads", "type": "webhook"}]
    )
    alarms = [raise_alarm() for _ in range(40)]
    Notification.objects.filter(pk__in=[a.pk for a in alarms]).update(escalation_due_at=database_now())
    barrier = threading.Barrier(4)
    errors = []

    def worker():
        try:
            barrier.wait()
            notifications_escalate_due(batch_size=7)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Notification.objects.filter(escalation_of__isnull=False).count() == 40
    assert not Notification.objects.filter(escalation_due_at__isnull=False).exists()


def test_the_database_refuses_a_second_child_for_the_same_step(operators):
    alarm = make_step_due(raise_alarm())
    notifications_escalate_due()
    (child,) = children_of(alarm)
    with pytest.raises(IntegrityError), transaction.atomic():
        Notification.objects.create(
            list_name="Shift-Leads",
            source_site_id="plant-a",
            site_enqueued_at=child.site_enqueued_at,
            fingerprint="x",
            escalation_of=alarm.pk,
            escalation_step=1,
        )


# --- waking ---------------------------------------------------------------------------------------


def test_the_next_wake_time_is_the_earliest_step_due_when_no_delivery_waits_sooner(operators):
    alarm = raise_alarm()
    Notification.objects.filter(pk=alarm.pk).update(status=Status.DELIVERED, next_attempt_at=None)
    assert dispatch_wake_at() == fresh(alarm).escalation_due_at


def test_the_waiting_worker_takes_a_step_within_a_second_of_its_due_time(operators, receiver):
    alarm = raise_alarm()
    Notification.objects.filter(pk=alarm.pk).update(status=Status.DELIVERED, next_attempt_at=None)
    make_step_due(alarm, seconds_ago=-2)  # due in 2 s
    due = fresh(alarm).escalation_due_at
    started = time.monotonic()
    waited = dispatch_wait(worker_id="test-waiter", time_budget=4)
    assert waited.held
    (child,) = children_of(alarm)
    assert timedelta(0) <= child.created_at - due < timedelta(seconds=1)
    assert time.monotonic() - started < 4
    assert receiver.to("/leads")  # delivered by the pass the waiter ran


def test_steps_stored_malformed_by_hand_mean_no_step_rather_than_an_error(db):
    for escalation in (5, {"after_seconds": 5}, ["soon"], [{"after_seconds": "5"}]):
        assert escalation_step(NotificationList(escalation=escalation, repeat_last_every_seconds=9), 1) is None


def test_escalation_step_numbers_past_the_last_repeat_only_when_the_list_repeats(db):
    steps = [{"after_seconds": 5, "list": "A", "type": "sms"}]
    assert escalation_step(NotificationList(escalation=steps), 2) is None
    repeated = escalation_step(NotificationList(escalation=steps, repeat_last_every_seconds=9), 4)
    assert repeated is not None
    assert (repeated.number, repeated.list_name, repeated.type) == (4, "A", "sms")


def test_an_email_alarm_to_a_list_without_escalation_is_untouched(db, smtp_config):
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op@example.com")
    alarm = raise_alarm(type="email")
    run_pass()
    assert fresh(alarm).status == Status.DELIVERED and children_of(alarm) == []


def test_a_step_falling_due_during_a_long_pass_is_taken_at_its_next_claim(operators, smtp_server, smtp_config):
    EmailRecipient.objects.create(notification_list=NotificationList.objects.create(name="Backlog"), email="b@x.org")
    smtp_server.behave("accept", delay_seconds=0.2)
    queue(25, list_name="Backlog")  # about 5 s of deliveries, one at a time
    alarm = raise_alarm()
    Notification.objects.filter(pk=alarm.pk).update(status=Status.DELIVERED, next_attempt_at=None)
    make_step_due(alarm, seconds_ago=-1)  # due 1 s into the pass
    due = fresh(alarm).escalation_due_at
    report = run_pass(concurrency=1, batch_size=2)
    (child,) = children_of(alarm)
    assert report.delivered >= 25 and report.escalated == 1
    assert child.created_at - due < timedelta(seconds=1.5)  # not at the pass's end, 4 s later


@pytest.mark.parametrize("action", ["ack", "clear"])
def test_the_site_acknowledging_or_clearing_through_the_api_stops_escalation_and_shows_in_the_record(
    operators, api, action
):
    alarm = raise_alarm()
    response = api.post(f"/api/v1/notifications/{alarm.pk}/{action}/", {"note": "HMI"}, format="json")
    assert response.status_code == 200, response.content
    record = api.get(f"/api/v1/notifications/{alarm.pk}/").json()
    assert record["acknowledged_at" if action == "ack" else "cleared_at"] is not None
    assert fresh(alarm).escalation_due_at is None
    notifications_escalate_due(now=fresh(alarm).created_at + timedelta(seconds=600))
    assert children_of(alarm) == [] and record["escalations"] == []
