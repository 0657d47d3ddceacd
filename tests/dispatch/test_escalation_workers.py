"""Escalation with real worker processes (time compressed: steps a few seconds apart): the
failover path when the SMTP relay is down, through django-q2's qcluster and its waiting
worker; and exactly one child per step when two dispatchers run at once and are killed and
restarted between steps."""

import signal
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from notifications.models import (
    EmailRecipient,
    Notification,
    NotificationList,
    SmsTarget,
    WebhookTarget,
    WorkerProcess,
)
from tests.channels.conftest import ACCOUNT_SID, AUTH_TOKEN, configure_sms
from tests.dispatch.conftest import configure_smtp, queue
from tests.support.processes import manage, poll, stop
from tests.support.receivers import TwilioFake, WebhookReceiver, new_webhook_secret
from tests.support.smtp import closed_port

Status = Notification.Status
pytestmark = [pytest.mark.slow]
LEAD = "+4930123456"
MARGIN = 5  # a step is due within this many seconds of its time


def children_of(notification_id):
    return list(Notification.objects.filter(escalation_of=notification_id).order_by("escalation_step"))


def operators_escalating(*steps, email_to=None):
    operators = NotificationList.objects.create(
        name="Operators",
        escalation=[{"after_seconds": after, "list": "Shift-Leads", "type": channel} for after, channel in steps],
    )
    if email_to:
        EmailRecipient.objects.create(notification_list=operators, email=email_to)
    return operators


def webhook_leads(receiver):
    leads = NotificationList.objects.create(name="Shift-Leads")
    secret = new_webhook_secret()
    receiver.secrets["/leads"] = secret
    WebhookTarget.objects.create(notification_list=leads, url=receiver.url("/leads"), secret=secret)
    return leads


@pytest.mark.dispatch_trigger
@pytest.mark.parametrize("channel", ["sms", "webhook"])
def test_with_the_smtp_relay_down_the_first_step_reaches_its_list_by_sms_or_webhook_in_time(
    transactional_db, api, channel
):
    configure_smtp(SimpleNamespace(host="127.0.0.1", port=closed_port()))  # the relay is down
    with TwilioFake(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as twilio, WebhookReceiver() as hooks:
        configure_sms(twilio)
        leads = webhook_leads(hooks)
        SmsTarget.objects.create(notification_list=leads, phone_number=LEAD)
        operators_escalating((3, channel), email_to="night-operator@example.com")
        worker = manage("qcluster")
        try:
            # Its start-up is not what is measured: the clock starts once a task process is up.
            poll(WorkerProcess.objects.exists, timeout=60, message="the worker did not start")
            from tests.support.payloads import make_payload

            payload = make_payload(list_name="Operators", priority="critical", subject="Gas detector 4 fault")
            assert api.post("/api/v1/notifications/", payload, format="json").status_code == 201
            created = time.monotonic()
            if channel == "sms":
                poll(lambda: twilio.messages, timeout=3 + MARGIN, message="no SMS within after_seconds + 5 s")
                arrived = time.monotonic() - created
                (form,) = (request.form() for request in twilio.received)
                assert form["To"] == LEAD and "[Escalation 1] Gas detector 4 fault" in form["Body"]
            else:
                poll(lambda: hooks.to("/leads"), timeout=3 + MARGIN, message="no webhook within after_seconds + 5 s")
                arrived = time.monotonic() - created
                assert hooks.to("/leads")[0].json()["subject"] == "[Escalation 1] Gas detector 4 fault"
        finally:
            stop(worker)
    parent = Notification.objects.get(pk=payload["notification_id"])
    assert parent.status != Status.DELIVERED and parent.retry_count >= 1  # the relay refused every attempt
    (child,) = children_of(parent.pk)
    assert (child.escalation_step, child.type, child.status) == (1, channel, Status.DELIVERED)
    assert child.created_at - parent.created_at < timedelta(seconds=3 + MARGIN)  # on the database clock
    print(f"relay down: step 1 ({channel}) delivered {arrived:.2f} s after ingest (due at 3 s)")


def started_dispatchers(hooks, count=2):
    """``count`` dispatch processes, returned once one of them has delivered a warm-up
    notification (their start-up is not what is measured here)."""
    workers = [manage("dispatch", "--concurrency", "2") for _ in range(count)]
    (warm_up,) = queue(list_name="Shift-Leads", type="webhook")
    poll(
        lambda: hooks.accepted_by_notification_id("/leads")[str(warm_up.pk)],
        timeout=60,
        message="no dispatcher started",
    )
    time.sleep(1)  # the other one too
    hooks.reset()
    return workers


def test_dispatchers_killed_and_restarted_between_steps_create_exactly_one_child_per_step(transactional_db):
    with WebhookReceiver() as hooks:
        webhook_leads(hooks)
        operators_escalating((2, "webhook"), (10, "webhook"))
        workers = started_dispatchers(hooks)
        try:
            (parent,) = queue(list_name="Operators", priority="high", type="webhook")  # no target: parks
            created = time.monotonic()
            poll(lambda: len(hooks.to("/leads")) >= 1, timeout=2 + MARGIN, message="step 1 not within 5 s of due")
            for worker in workers:
                stop(worker, sig=signal.SIGKILL)  # killed between the steps
            assert time.monotonic() - created < 10
            workers = [manage("dispatch", "--concurrency", "2") for _ in range(2)]
            poll(lambda: len(hooks.to("/leads")) >= 2, timeout=30, message="step 2 never came")
            time.sleep(1.5)  # room for a duplicate to show
        finally:
            for worker in workers:
                stop(worker)
        assert [child.escalation_step for child in children_of(parent.pk)] == [1, 2]
        assert sorted(hooks.accepted_by_notification_id("/leads").values()) == [1, 1]
        assert Notification.objects.get(pk=parent.pk).escalation_due_at is None
