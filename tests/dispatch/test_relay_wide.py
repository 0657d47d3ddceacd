"""Channel failure by shape: a relay that answers every recipient alike with a "not now" of its
own (Postfix's 451 4.3.5 while a lookup table or a policy service is down) or a receiver that
answers 503 to everything fails as a channel — the breaker opens, the rows wait uncharged and
the probes resume them — while one greylisted address, or a list of one recipient, stays that
recipient's failure. Against a real SMTP server (aiosmtpd) and a real webhook receiver."""

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.adapters.base import DeliveryError
from notifications.failure_shape import (
    SHAPE_WINDOW_SECONDS,
    Evidence,
    ShapeTracker,
    attempt_evidence,
    entry_signature,
    relay_wide,
)
from notifications.models import ChannelHealth, DeliveryAttempt, EmailRecipient, Notification, NotificationList
from tests.channels.test_webhook import add_hooks, queue_webhook
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass, store_policy
from tests.support.receivers import Reply, WebhookReceiver

Status = Notification.Status
State = ChannelHealth.State
LOOKUP_DOWN = "451 4.3.5 Server configuration problem"
GREYLISTED = "450 4.2.0 <{}>: Recipient address rejected: Greylisted, try again later"


def members(name, *addresses):
    notification_list = NotificationList.objects.create(name=name)
    for address in addresses:
        EmailRecipient.objects.create(notification_list=notification_list, email=address)
    return notification_list


def email_health():
    return ChannelHealth.objects.filter(channel="email").first()


def everything_due():
    Notification.objects.filter(status__in=Notification.NON_TERMINAL).update(next_attempt_at=timezone.now())


def probe_due():
    ChannelHealth.objects.update(probe_after=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def channel_list(db):
    return NotificationList.objects.create(name="Channels")


@pytest.fixture
def relay(db, smtp_server):
    configure_smtp(smtp_server)
    store_policy(strategy="fixed", interval_seconds=60, max_attempts=3, breaker_threshold=5)
    members("Shift", "a@example.com", "b@example.com", "c@example.com")
    return smtp_server


# --- the rule, on its own -----------------------------------------------------------------------


def evidence(notification_id, *targets, answer="451 4.3.5"):
    return Evidence(notification_id, {answer: frozenset(targets)})


def test_the_rule_needs_three_notifications_and_three_recipients():
    assert relay_wide(notifications=3, targets=3)
    assert not relay_wide(notifications=2, targets=30)
    assert not relay_wide(notifications=30, targets=2)


def test_an_http_answer_needs_three_notifications_only_a_receiver_has_no_per_target_not_now():
    assert relay_wide(notifications=3, targets=1, signature="HTTP 503")
    assert not relay_wide(notifications=2, targets=1, signature="HTTP 503")
    assert not relay_wide(notifications=3, targets=1, signature="451 4.3.5")


def test_three_notifications_to_three_recipients_answered_alike_make_the_answer_the_endpoints():
    tracker = ShapeTracker()
    tracker.observe(evidence("n1", "a", "b"), now=100)
    tracker.observe(evidence("n2", "a", "b"), now=101)
    assert tracker.newly_wide() is None  # two notifications, two recipients
    tracker.observe(evidence("n3", "c"), now=102)
    assert tracker.newly_wide() == "451 4.3.5"
    assert tracker.take("451 4.3.5") == {"n1": 1, "n2": 1, "n3": 1}
    tracker.observe(evidence("n4", "d"), now=103)  # the active answer is the endpoint's: not counted again
    assert tracker.seen == {}


def test_answers_older_than_the_window_are_forgotten():
    tracker = ShapeTracker()
    tracker.observe(evidence("n1", "a"), now=0)
    tracker.observe(evidence("n2", "b"), now=1)
    now = SHAPE_WINDOW_SECONDS + 0.5  # n1 is now older than the window, n2 not
    tracker.forget_before(now - SHAPE_WINDOW_SECONDS)
    tracker.observe(evidence("n3", "c"), now=now)
    assert tracker.newly_wide() is None
    assert list(tracker.seen["451 4.3.5"]["n"]) == ["n2", "n3"]


def test_different_answers_are_counted_apart():
    tracker = ShapeTracker()
    tracker.observe(evidence("n1", "a", answer="451 4.3.5"), now=1)
    tracker.observe(evidence("n2", "b", answer="452 4.3.1"), now=2)
    tracker.observe(evidence("n3", "c", answer="451 4.3.5"), now=3)
    assert tracker.newly_wide() is None


def test_answers_are_read_from_smtp_codes_with_their_enhanced_status_and_from_http_statuses():
    assert entry_signature(
        {"outcome": "deferred", "smtp_code": 451, "error": "4.3.5 Server configuration problem"}
    ) == ("451 4.3.5")
    assert entry_signature({"outcome": "deferred", "smtp_code": 452, "error": "Insufficient system storage"}) == "452"
    assert entry_signature({"outcome": "deferred", "http_status": 503, "failure_class": "provider_error"}) == "HTTP 503"
    assert entry_signature({"outcome": "deferred", "error": "Connection refused"}) is None  # not reached


def test_an_attempt_that_delivered_to_someone_is_no_evidence_against_the_relay():
    targets = [
        {"target": "a@example.com", "outcome": "delivered", "smtp_code": 250},
        {"target": "b@example.com", "outcome": "deferred", "smtp_code": 451, "error": "4.3.5 try later"},
    ]
    error = DeliveryError("1 still owed", failure_class="provider_error", detail={"accepted": 1}, targets=targets)
    assert attempt_evidence(notification_id="n1", error=error) is None
    error.detail = {"accepted": 0}
    assert attempt_evidence(notification_id="n1", error=error) is not None


# --- a real relay ---------------------------------------------------------------------------------


def test_a_relay_answering_451_4_3_5_to_every_recipient_opens_the_breaker_and_the_rows_wait_uncharged(relay):
    relay.rcpt_reply = LOOKUP_DOWN
    rows = queue(3, list_name="Shift")
    run_pass(concurrency=1)
    health = email_health()
    assert health.state == State.OPEN
    assert health.last_failure_class == "provider_error"
    assert health.last_error.startswith("relay-wide 451 4.3.5: ")
    for row in map(fresh, rows):
        assert row.status == Status.RETRYING
        assert row.retry_count == row.channel_failures  # nothing charged to the row
        assert "relay-wide 451 4.3.5" in row.last_error and row.last_error.startswith("Channel failure")
    # The attempts keep their class.
    assert set(DeliveryAttempt.objects.values_list("failure_class", flat=True)) == {"provider_error"}


def test_attempts_charged_before_the_shape_was_recognised_are_given_back_and_a_row_parked_by_them_waits_again(relay):
    store_policy(strategy="fixed", interval_seconds=60, max_attempts=2, breaker_threshold=5)
    relay.rcpt_reply = LOOKUP_DOWN
    (early,) = queue(1, list_name="Shift")
    run_pass()
    everything_due()
    run_pass()
    # Alone, its answers looked like the row's: two attempts charged, parked.
    early = fresh(early)
    assert (early.status, early.retry_count, early.channel_failures) == (Status.PARKED, 2, 0)
    assert early.last_error.startswith("Retries exhausted")
    (second,) = queue(1, list_name="Shift")
    run_pass()
    assert fresh(second).channel_failures == 0  # two notifications: not yet the relay's
    (third,) = queue(1, list_name="Shift")
    run_pass()
    assert email_health().state == State.OPEN
    early, second, third = fresh(early), fresh(second), fresh(third)
    assert (early.status, early.channel_failures) == (Status.RETRYING, 2)
    assert "relay-wide 451 4.3.5" in early.last_error
    assert (second.status, second.retry_count, second.channel_failures) == (Status.RETRYING, 1, 1)
    assert (third.status, third.retry_count, third.channel_failures) == (Status.RETRYING, 1, 1)


def test_probes_resume_the_waiting_rows_by_themselves_once_the_relay_answers_again(relay):
    relay.rcpt_reply = LOOKUP_DOWN
    rows = queue(4, list_name="Shift")
    run_pass(concurrency=1)
    assert email_health().state == State.OPEN
    everything_due()
    probe_due()
    assert run_pass().claimed == 1  # the probe, refused alike: the relay still is down
    health = email_health()
    assert health.state == State.OPEN and health.cooldown_seconds > health.probes
    relay.rcpt_reply = None  # the lookup table is back
    everything_due()
    probe_due()
    run_pass()
    run_pass()
    assert email_health().state == State.CLOSED
    assert [fresh(row).status for row in rows] == [Status.DELIVERED] * 4
    assert relay.count == 4
    assert email_health().shape == {}


def test_one_greylisted_address_stays_that_recipients_failure(relay):
    relay.rcpt_replies = {"c@example.com": GREYLISTED.format("c@example.com")}
    rows = queue(5, list_name="Shift")
    run_pass(concurrency=1)
    assert email_health() is None or email_health().state == State.CLOSED
    for row in map(fresh, rows):
        # Delivered to a and b; c is owed it, charged to the row.
        assert (row.status, row.retry_count, row.channel_failures) == (Status.RETRYING, 1, 0)
        assert row.last_error.startswith("Transient failure (provider_error")


def test_a_list_of_one_recipient_answered_451_stays_that_recipients_failure(relay):
    members("Solo", "solo@example.com")
    relay.rcpt_reply = LOOKUP_DOWN
    rows = queue(6, list_name="Solo")
    for _ in range(3):
        run_pass(concurrency=1)
        everything_due()
    assert email_health() is None or email_health().state == State.CLOSED
    for row in map(fresh, rows):
        assert (row.status, row.retry_count, row.channel_failures) == (Status.PARKED, 3, 0)
        assert row.last_error.startswith("Retries exhausted (3 failed attempts)")


def test_a_delivery_meanwhile_shows_the_relay_works(relay):
    relay.rcpt_reply = LOOKUP_DOWN
    queue(2, list_name="Shift")
    run_pass(concurrency=1)
    assert email_health().shape["seen"]
    relay.rcpt_reply = None
    queue(1, list_name="Shift")
    run_pass(concurrency=1)  # the new one, and the two due ones are not due yet
    assert email_health().shape == {}
    relay.rcpt_reply = LOOKUP_DOWN
    queue(1, list_name="Shift")
    run_pass(concurrency=1)
    assert email_health().state == State.CLOSED  # one notification since the delivery


# --- a receiver answering 503 -------------------------------------------------------------------


def test_a_webhook_receiver_answering_503_to_every_target_opens_the_breaker_and_the_rows_wait(channel_list):
    with WebhookReceiver() as receiver:
        store_policy("webhook", strategy="exponential", interval_seconds=30, max_attempts=2)
        add_hooks(channel_list, receiver, "/a", "/b", "/c")
        for path in ("/a", "/b", "/c"):
            receiver.script(path, [Reply(503, "Service Unavailable")])
        rows = [queue_webhook() for _ in range(3)]
        run_pass(concurrency=1)
        health = ChannelHealth.objects.get(channel="webhook")
        assert health.state == State.OPEN and health.last_error.startswith("relay-wide HTTP 503: ")
        assert all(fresh(row).channel_failures == fresh(row).retry_count == 1 for row in rows)
        for path in ("/a", "/b", "/c"):
            receiver.script(path, [Reply(200)])
        everything_due()
        probe_due()
        run_pass()
        run_pass()
        assert [fresh(row).status for row in rows] == [Status.DELIVERED] * 3
        assert ChannelHealth.objects.get(channel="webhook").state == State.CLOSED


def test_a_lists_single_webhook_answering_503_opens_the_breaker_nothing_parks_and_the_probe_resumes(channel_list):
    with WebhookReceiver() as receiver:
        store_policy("webhook", strategy="exponential", interval_seconds=30, max_attempts=2)
        add_hooks(channel_list, receiver, "/only")
        receiver.script("/only", [Reply(503, "Service Unavailable")])
        rows = [queue_webhook() for _ in range(3)]
        run_pass(concurrency=1)
        health = ChannelHealth.objects.get(channel="webhook")
        assert health.state == State.OPEN and health.last_error.startswith("relay-wide HTTP 503: ")
        assert all(fresh(row).status == Status.RETRYING and fresh(row).channel_failures == 1 for row in rows)
        everything_due()
        run_pass()  # the channel is open and no probe is due yet: nothing is tried, nothing charged
        assert all(fresh(row).status == Status.RETRYING and fresh(row).retry_count == 1 for row in rows)
        assert ChannelHealth.objects.get(channel="webhook").state == State.OPEN
        probe_due()
        run_pass(concurrency=1)  # the probe meets the same answer: open again, still nothing charged
        assert ChannelHealth.objects.get(channel="webhook").state == State.OPEN
        assert all(
            fresh(row).status == Status.RETRYING and fresh(row).channel_failures == fresh(row).retry_count
            for row in rows
        )
        receiver.script("/only", [Reply(200)])
        everything_due()
        probe_due()
        run_pass()
        run_pass()
        assert [fresh(row).status for row in rows] == [Status.DELIVERED] * 3
        assert ChannelHealth.objects.get(channel="webhook").state == State.CLOSED


def test_one_webhook_target_answering_503_while_the_others_accept_stays_that_targets_failure(channel_list):
    with WebhookReceiver() as receiver:
        add_hooks(channel_list, receiver, "/a", "/b", "/c")
        receiver.script("/c", [Reply(503, "Service Unavailable")])
        rows = [queue_webhook() for _ in range(4)]
        run_pass(concurrency=1)
        assert ChannelHealth.objects.filter(channel="webhook", state=State.OPEN).count() == 0
        assert all(fresh(row).channel_failures == 0 and fresh(row).retry_count == 1 for row in rows)
