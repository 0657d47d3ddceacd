"""Per-recipient delivery state and ambiguous outcomes, against a real SMTP server on loopback
(aiosmtpd): a relay's recipient limit, greylisting, a connection lost after the message was
handed over, a slow answer to the end of the message (docs/recipients.md)."""

import time

import pytest
from django.utils import timezone

from notifications.adapters import email as email_adapter
from notifications.adapters.base import DeliveryError, delivery_deadline
from notifications.adapters.email import EmailSession
from notifications.models import DeliveryAttempt, EmailRecipient, Notification, NotificationList
from notifications.operations import notification_retry
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass

Status = Notification.Status


def make_due(notification: Notification) -> None:
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())


def message_ids(server) -> list[str]:
    return [received.message["Message-ID"] for received in server.received]


@pytest.fixture
def hundred_twenty(db) -> list[str]:
    crowd = NotificationList.objects.create(name="Everyone")
    members = [f"member{number:03d}@example.com" for number in range(120)]
    EmailRecipient.objects.bulk_create(EmailRecipient(notification_list=crowd, email=email) for email in members)
    return members


@pytest.mark.parametrize("mode", ["bcc", "to"])
def test_120_recipients_behind_a_limit_of_50_per_transaction_each_receive_it_exactly_once(
    smtp_server, smtp_config, hundred_twenty, mode
):
    NotificationList.objects.filter(name="Everyone").update(recipient_mode=mode)
    smtp_server.rcpt_limit = 50
    (notification,) = queue(list_name="Everyone")
    report = run_pass()
    assert report.delivered == 1
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED and notification.last_error == ""
    # Three transactions in the one attempt: 50, 50 and the last 20, the same message each time.
    assert [len(received.rcpt_tos) for received in smtp_server.received] == [50, 50, 20]
    # One command at a time, the first 452 ends a transaction's RCPT TOs; pipelined, all of
    # them are written before a reply is read, so each one over the limit is answered 452
    # (70, then 20) and goes in the next transaction.
    assert smtp_server.too_many == (70 + 20 if smtp_server.pipelining else 2)
    assert smtp_server.copies_by_recipient() == dict.fromkeys(hundred_twenty, 1)
    assert len(set(message_ids(smtp_server))) == 1
    assert [t["target"] for t in notification.resolved_targets] == hundred_twenty
    assert {t["outcome"] for t in notification.resolved_targets} == {"delivered"}
    (attempt,) = notification.attempts.all()
    assert (attempt.outcome, attempt.detail["accepted"]) == ("success", 120)


def test_an_older_servers_552_for_too_many_recipients_also_splits_the_transaction(
    smtp_server, smtp_config, hundred_twenty
):
    smtp_server.rcpt_limit = 50
    smtp_server.too_many_reply = "552 5.5.3 Too many recipients"
    (notification,) = queue(list_name="Everyone")
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    assert [len(received.rcpt_tos) for received in smtp_server.received] == [50, 50, 20]
    assert smtp_server.copies_by_recipient() == dict.fromkeys(hundred_twenty, 1)


def test_recipients_a_full_server_defers_are_sent_by_later_attempts_each_exactly_once(
    smtp_server, smtp_config, hundred_twenty
):
    # "Insufficient storage" is not a recipient limit: the rest wait for the next attempt.
    smtp_server.rcpt_limit = 50
    smtp_server.too_many_reply = "452 4.3.1 Insufficient system storage"
    (notification,) = queue(list_name="Everyone")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert [t["outcome"] for t in notification.resolved_targets].count("deferred") == 70
    assert notification.last_error.startswith(
        "Transient failure (provider_error, attempt 1 of 3): Delivered to 50 of 120 recipients; 70 still owed it"
    )
    for _ in range(2):
        make_due(notification)
        run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert [len(received.rcpt_tos) for received in smtp_server.received] == [50, 50, 20]
    assert smtp_server.copies_by_recipient() == dict.fromkeys(hundred_twenty, 1)
    assert list(notification.attempts.values_list("outcome", flat=True)) == ["transient", "transient", "success"]


def test_a_greylisted_recipient_is_retried_alone_and_the_row_is_delivered_only_then(
    smtp_server, smtp_config, operators_list
):
    smtp_server.greylist = {"op2@example.com"}
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING and notification.delivered_at is None
    assert notification.resolved_targets == [
        {"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
        {
            "target": "op2@example.com",
            "outcome": "deferred",
            "smtp_code": 450,
            "error": "4.7.1 <op2@example.com>: Recipient address rejected: Greylisted, try again later",
        },
    ]
    assert notification.last_error.startswith(
        "Transient failure (provider_error, attempt 1 of 3): Delivered to 1 of 2 recipients; 1 still owed it"
    )
    first = notification.attempts.get()
    # Some recipients took it, so the relay works: not a channel failure.
    assert (first.outcome, first.failure_class) == ("transient", "provider_error")
    assert smtp_server.copies_by_recipient() == {"op1@example.com": 1}

    make_due(notification)
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED and notification.last_error == ""
    assert [(t["target"], t["outcome"]) for t in notification.resolved_targets] == [
        ("op1@example.com", "delivered"),
        ("op2@example.com", "delivered"),
    ]
    assert [received.rcpt_tos for received in smtp_server.received] == [["op1@example.com"], ["op2@example.com"]]
    assert len(set(message_ids(smtp_server))) == 1
    assert list(notification.attempts.values_list("outcome", flat=True)) == ["transient", "success"]


def test_a_recipient_deferred_until_the_attempts_are_used_up_parks_and_an_operator_retry_skips_the_accepted(
    smtp_server, smtp_config, operators_list
):
    EmailRecipient.objects.create(notification_list=operators_list, email="op3@example.com")
    smtp_server.greylist = {"op2@example.com"}
    smtp_server.behave("refuse", refuse={"op3@example.com"}, refuse_code=550)
    (notification,) = queue()
    run_pass()
    # op3 is refused for good; op2 stays deferred until the attempts run out.
    smtp_server.behave("refuse", refuse={"op2@example.com"}, refuse_code=451)
    for _ in range(2):
        make_due(notification)
        run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert [t["outcome"] for t in notification.resolved_targets] == ["delivered", "deferred", "refused"]
    assert notification.last_error.startswith("Retries exhausted (3 failed attempts): Delivered to 1 of 3 recipients")
    assert smtp_server.copies_by_recipient() == {"op1@example.com": 1}

    # The operator's Retry sends to everyone who has not accepted it, and never to who has.
    smtp_server.behave("accept")
    assert notification_retry(notification_ids=[notification.pk], user=None).changed == 1
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.copies_by_recipient() == {"op1@example.com": 1, "op2@example.com": 1, "op3@example.com": 1}


def test_a_deferred_recipient_refused_for_good_on_its_retry_leaves_the_row_delivered_partially(
    smtp_server, smtp_config, operators_list
):
    EmailRecipient.objects.create(notification_list=operators_list, email="op3@example.com")
    smtp_server.behave("refuse", refuse={"op2@example.com"}, refuse_code=451)
    (notification,) = queue()
    run_pass()
    smtp_server.behave("refuse", refuse={"op2@example.com", "op3@example.com"}, refuse_code=550)
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
    run_pass()
    notification = fresh(notification)
    # op1 and op3 had it after the first attempt; op2 is now refused for good.
    assert notification.status == Status.DELIVERED and notification.targets_refused == 1
    assert [t["outcome"] for t in notification.resolved_targets] == ["delivered", "refused", "delivered"]
    assert smtp_server.copies_by_recipient() == {"op1@example.com": 1, "op3@example.com": 1}


def test_a_recipient_refused_for_good_is_never_retried_and_the_row_is_delivered_partially(
    smtp_server, smtp_config, operators_list
):
    smtp_server.behave("refuse", refuse={"op2@example.com"})
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED and notification.targets_refused == 1
    assert (
        notification.last_error == "Delivered to 1 of 2 recipients; refused: op2@example.com (550 mailbox unavailable)"
    )


def test_a_connection_lost_after_the_message_makes_at_most_two_copies_and_parks_as_outcome_unknown(
    smtp_server, smtp_config, operators_list
):
    smtp_server.behave("queue_drop")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert {t["outcome"] for t in notification.resolved_targets} == {"ambiguous"}
    assert "may have accepted it (retried with the same Message-ID)" in notification.last_error

    for _ in range(5):
        make_due(notification)
        run_pass()
    notification = fresh(notification)
    assert smtp_server.count == 2
    (message_id,) = set(message_ids(smtp_server))
    assert message_id == f"<{notification.notification_id}@example.com>"
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Outcome unknown (connection; the relay may have accepted it): ")
    assert "the server never answered after the whole message was sent, 2 times" in notification.last_error
    assert "exhausted" not in notification.last_error
    assert {t["outcome"] for t in notification.resolved_targets} == {"unknown"}
    assert list(notification.attempts.values_list("outcome", flat=True)) == ["ambiguous", "ambiguous"]

    # An operator who has checked the relay's log may send it once more.
    smtp_server.behave("accept")
    notification_retry(notification_ids=[notification.pk], user=None)
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.count == 3 and set(message_ids(smtp_server)) == {message_id}


def test_a_connection_lost_after_the_message_then_accepted_is_delivered_with_the_same_message_id(
    smtp_server, smtp_config, operators_list
):
    smtp_server.behave("queue_drop")
    (notification,) = queue()
    run_pass()
    smtp_server.behave("accept")
    make_due(notification)
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.count == 2 and len(set(message_ids(smtp_server))) == 1
    assert "2 recipient(s) may have a second copy (same Message-ID)" in notification.last_error
    assert list(notification.attempts.values_list("outcome", flat=True)) == ["ambiguous", "success"]


def test_a_connection_lost_before_the_message_was_handed_over_is_not_ambiguous(
    smtp_server, smtp_config, operators_list
):
    smtp_server.behave("mail", reply="421 4.3.2 shutting down")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert notification.attempts.get().outcome == DeliveryAttempt.Outcome.TRANSIENT
    assert {t["outcome"] for t in notification.resolved_targets} == {"deferred"}


def test_a_slow_answer_to_the_message_within_the_data_timeout_is_one_copy_delivered(smtp_server, operators_list, db):
    # Every other step is bounded by one second; the answer to the message takes 2.5.
    configure_smtp(smtp_server, timeout_seconds=1, data_timeout_seconds=600)
    smtp_server.behave("accept", delay_seconds=2.5)
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.count == 1
    assert notification.attempts.get().duration_ms >= 2400


def test_the_dispatcher_ends_the_wait_for_the_answer_before_its_claim_runs_out(
    smtp_server, operators_list, settings, db
):
    # A 4 s lease: the wait for the answer ends with the lease's last tenth, not after ten
    # minutes (another dispatcher could then claim the row and send it again meanwhile).
    settings.OUTBOX_LEASE_SECONDS = 4
    configure_smtp(smtp_server, timeout_seconds=1, data_timeout_seconds=600)
    smtp_server.behave("accept", delay_seconds=8)
    (notification,) = queue()
    started = time.monotonic()
    run_pass()
    assert time.monotonic() - started < 4
    notification = fresh(notification)
    assert notification.status == Status.RETRYING and notification.claimed_by == ""
    attempt = notification.attempts.get()
    assert (attempt.outcome, attempt.failure_class) == ("ambiguous", "timeout")
    assert 3000 <= attempt.duration_ms < 4000


def test_the_wait_for_the_answer_never_outlives_the_delivery_deadline(smtp_server, smtp_config):
    session = EmailSession(configure_smtp(smtp_server, timeout_seconds=2, data_timeout_seconds=600))
    assert session._data_wait() == 600
    with delivery_deadline(time.monotonic() + 30):
        assert 29 <= session._data_wait() <= 30
    with delivery_deadline(time.monotonic()):
        assert session._data_wait() == 2  # never below the other steps' timeout


def test_individual_mode_sends_an_unanswered_cc_copy_again_alone_with_its_first_message_id(
    smtp_server, smtp_config, operators_list
):
    operators_list.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    operators_list.save()
    smtp_server.behave("queue_drop", only_for={"chief@example.com"})
    (notification,) = queue(type_data={"cc": ["chief@example.com"]})
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    outcomes = {t["target"]: (t["outcome"], t.get("role")) for t in notification.resolved_targets}
    assert outcomes == {
        "op1@example.com": ("delivered", None),
        "op2@example.com": ("delivered", None),
        "chief@example.com": ("ambiguous", "cc"),
    }
    smtp_server.behave("accept")
    make_due(notification)
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.copies_by_recipient() == {"op1@example.com": 1, "op2@example.com": 1, "chief@example.com": 2}
    cc_ids = {r.message["Message-ID"] for r in smtp_server.received if r.rcpt_tos == ["chief@example.com"]}
    assert len(cc_ids) == 1
    member_ids = {r.message["Message-ID"] for r in smtp_server.received if r.rcpt_tos != ["chief@example.com"]}
    assert len(member_ids) == 2 and not member_ids & cc_ids


def test_send_test_email_waits_for_the_answer_no_longer_than_a_person_would(smtp_server, smtp_config, monkeypatch):
    monkeypatch.setattr(email_adapter, "TEST_ANSWER_WAIT_SECONDS", 1)
    config = configure_smtp(smtp_server, timeout_seconds=1, data_timeout_seconds=600)
    smtp_server.behave("accept", delay_seconds=4)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as caught:
        email_adapter.email_send_test(config=config, to="op1@example.com")
    assert time.monotonic() - started < 3
    assert caught.value.ambiguous and caught.value.failure_class == "timeout"
