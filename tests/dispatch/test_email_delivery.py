"""Email delivery against a real SMTP server on loopback: every outcome of the dispatch rules (docs/architecture.md)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import DeliveryAttempt, EmailRecipient, Notification, NotificationList, SmtpConfiguration
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass
from tests.support.smtp import SmtpServer, closed_port, silent_port

Status = Notification.Status
pytestmark = pytest.mark.usefixtures("operators_list")


def test_accepted_message_is_delivered_to_every_recipient_in_one_transaction(smtp_server, smtp_config):
    (notification,) = queue(subject="Pump 3 tripped", body="Overcurrent at 10:00.")
    report = run_pass()
    assert report.delivered == 1
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert notification.delivered_at is not None and notification.last_attempt_at is not None
    assert (notification.retry_count, notification.last_error) == (0, "")
    assert (notification.claimed_by, notification.claimed_until, notification.next_attempt_at) == ("", None, None)
    assert notification.resolved_targets == [
        {"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
        {"target": "op2@example.com", "outcome": "delivered", "smtp_code": 250},
    ]
    (received,) = smtp_server.received
    assert received.rcpt_tos == ["op1@example.com", "op2@example.com"]
    assert received.mail_from == "outbox@example.com"
    message = received.message
    assert message["X-Notification-Id"] == str(notification.notification_id)
    assert message["From"] == "outbox@example.com"
    assert message["Subject"] == "Pump 3 tripped"
    assert message.get_content().strip() == "Overcurrent at 10:00."


def test_every_attempt_is_recorded_with_duration_and_smtp_reply_code(smtp_server, smtp_config):
    (notification,) = queue()
    run_pass()
    (attempt,) = DeliveryAttempt.objects.filter(notification=notification)
    assert attempt.outcome == DeliveryAttempt.Outcome.SUCCESS
    assert attempt.duration_ms is not None and attempt.duration_ms >= 0
    assert attempt.detail["smtp_code"] == 250
    assert attempt.worker == "test-worker"


def test_non_ascii_subject_and_body_arrive_intact(smtp_server, smtp_config):
    queue(subject="Pumpe 3 ausgefallen – Überstrom", body="Température élevée: 95 °C ✓")
    run_pass()
    message = smtp_server.received[0].message
    assert message["Subject"] == "Pumpe 3 ausgefallen – Überstrom"
    assert message.get_content().strip() == "Température élevée: 95 °C ✓"


def test_connections_are_reused_across_a_batch(smtp_server, smtp_config):
    queue(30)
    report = run_pass(concurrency=3)
    assert report.delivered == 30
    assert smtp_server.count == 30
    assert smtp_server.connections <= 3


def test_list_names_resolve_case_insensitively_at_delivery_time(smtp_server, smtp_config):
    (notification,) = queue(list_name="operators")
    EmailRecipient.objects.create(
        notification_list=NotificationList.objects.get(name="Operators"), email="late@example.com"
    )
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    assert smtp_server.received[0].rcpt_tos == ["late@example.com", "op1@example.com", "op2@example.com"]


def test_4xx_reply_schedules_a_retry_after_the_fixed_interval(smtp_server, smtp_config):
    smtp_server.behave("4xx")
    (notification,) = queue()
    before = timezone.now()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert notification.retry_count == 1
    assert notification.last_error.startswith("Transient failure (provider_error, attempt 1 of 3): ")
    assert "451" in notification.last_error
    assert before + timedelta(seconds=59) < notification.next_attempt_at < timezone.now() + timedelta(seconds=61)
    (attempt,) = notification.attempts.all()
    assert (attempt.outcome, attempt.failure_class, attempt.detail["smtp_code"]) == ("transient", "provider_error", 451)
    # Not due again before the interval has passed.
    assert run_pass().claimed == 0


def test_transient_failures_park_once_retries_are_exhausted(smtp_server, smtp_config):
    smtp_server.behave("4xx")
    (notification,) = queue()
    for _ in range(3):
        Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
        run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.retry_count == 3
    assert notification.last_error.startswith("Retries exhausted (3 failed attempts): ")
    assert "451" in notification.last_error
    assert notification.attempts.count() == 3
    assert run_pass().claimed == 0


def test_a_retry_that_succeeds_is_delivered(smtp_server, smtp_config):
    smtp_server.behave("4xx")
    (notification,) = queue()
    run_pass()
    smtp_server.behave("accept")
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
    run_pass()
    notification = fresh(notification)
    assert (notification.status, notification.retry_count) == (Status.DELIVERED, 1)
    assert list(notification.attempts.values_list("outcome", flat=True)) == ["transient", "success"]


def test_5xx_reply_parks_at_once_as_a_permanent_failure(smtp_server, smtp_config):
    smtp_server.behave("5xx")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.retry_count == 1
    assert notification.last_error.startswith("Permanent failure (content_rejected): ")
    assert "554" in notification.last_error and "exhausted" not in notification.last_error
    (attempt,) = notification.attempts.all()
    assert (attempt.outcome, attempt.failure_class, attempt.detail["smtp_code"]) == (
        "permanent",
        "content_rejected",
        554,
    )


def test_partial_recipient_refusal_delivers_to_the_accepted_and_records_each_outcome(smtp_server, smtp_config):
    smtp_server.behave("refuse", refuse={"op2@example.com"})
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert notification.resolved_targets == [
        {"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
        {"target": "op2@example.com", "outcome": "refused", "smtp_code": 550, "error": "mailbox unavailable"},
    ]
    assert "op2@example.com (550" in notification.last_error
    assert smtp_server.received[0].rcpt_tos == ["op1@example.com"]


def test_every_recipient_refused_with_5xx_parks(smtp_server, smtp_config):
    smtp_server.behave("refuse", refuse={"op1@example.com", "op2@example.com"})
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "Every recipient was refused" in notification.last_error
    assert [t["outcome"] for t in notification.resolved_targets] == ["refused", "refused"]
    assert smtp_server.count == 0


def test_every_recipient_refused_with_4xx_is_retried(smtp_server, smtp_config):
    smtp_server.behave("refuse", refuse={"op1@example.com", "op2@example.com"}, refuse_code=450)
    (notification,) = queue()
    run_pass()
    assert fresh(notification).status == Status.RETRYING


def test_server_hanging_after_the_message_past_the_data_timeout_is_an_ambiguous_channel_failure(
    smtp_server, smtp_config
):
    configure_smtp(smtp_server, timeout_seconds=1, data_timeout_seconds=1)
    smtp_server.behave("hang", hang_seconds=10)
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert "timed out at end of data" in notification.last_error and "may have accepted it" in notification.last_error
    attempt = notification.attempts.get()
    assert (attempt.outcome, attempt.failure_class) == ("ambiguous", "timeout")
    assert attempt.duration_ms >= 900
    assert {t["outcome"] for t in notification.resolved_targets} == {"ambiguous"}


def test_server_that_never_greets_times_out_as_a_channel_failure(db):
    with silent_port() as port:
        SmtpConfiguration.objects.create(
            host="127.0.0.1",
            port=port,
            security="none",
            from_address="outbox@example.com",
            timeout_seconds=1,
            greeting_timeout_seconds=1,
        )
        (notification,) = queue()
        run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert "timed out" in notification.last_error


def test_dropped_connection_is_a_channel_failure(smtp_server, smtp_config):
    smtp_server.behave("drop")
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert "connection" in notification.last_error.lower()


def test_refused_connection_is_a_channel_failure(db):
    SmtpConfiguration.objects.create(
        host="127.0.0.1", port=closed_port(), security="none", from_address="outbox@example.com"
    )
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert "refused" in notification.last_error


def test_login_with_correct_credentials_delivers(db):
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        configure_smtp(server, username="outbox", password="s3cret")
        (notification,) = queue()
        run_pass()
    assert fresh(notification).status == Status.DELIVERED


def test_authentication_failure_waits_for_the_channel_with_a_clear_message(db):
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        configure_smtp(server, username="outbox", password="wrong")
        (notification,) = queue()
        run_pass()
        assert server.count == 0
    notification = fresh(notification)
    assert notification.status == Status.RETRYING  # the channel's fault: the row waits, never parks for it
    assert (notification.retry_count, notification.channel_failures) == (1, 1)
    assert notification.last_error.startswith("Channel failure (auth; retried until the channel recovers): ")
    assert "SMTP authentication failed" in notification.last_error
    assert "username and password" in notification.last_error


@pytest.mark.parametrize("security", ["starttls", "tls"])
def test_encrypted_connections_deliver_when_the_certificate_is_trusted(db, monkeypatch, security):
    with SmtpServer(security=security) as server:
        monkeypatch.setenv("SSL_CERT_FILE", server.ca_file)
        configure_smtp(server, security=security)
        (notification,) = queue()
        run_pass()
        assert server.count == 1
    assert fresh(notification).status == Status.DELIVERED


def test_untrusted_certificate_holds_the_row_and_ca_file_delivers_it(db):
    with SmtpServer(security="starttls") as server:
        configure_smtp(server, security="starttls")
        (notification,) = queue()
        run_pass()
        notification = fresh(notification)
        assert notification.status == Status.RETRYING  # held (channel failure), not parked
        assert "certificate" in notification.last_error
        assert notification.attempts.get().failure_class == "connection"
        # Trusting the server's CA through the configuration (not SSL_CERT_FILE) delivers it.
        configure_smtp(server, security="starttls", ca_file=server.ca_file)
        Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
        run_pass()
        assert server.count == 1
    assert fresh(notification).status == Status.DELIVERED


def test_unknown_list_parks_without_contacting_the_server(smtp_server, smtp_config):
    (notification,) = queue(list_name="Nobody")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error == "Permanent failure (configuration): Unknown notification list 'Nobody'."
    assert notification.attempts.get().outcome == "permanent"
    assert smtp_server.connections == 0


def test_empty_list_parks(smtp_server, smtp_config):
    NotificationList.objects.create(name="Empty")
    (notification,) = queue(list_name="Empty")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "has no email recipients" in notification.last_error


def test_missing_smtp_configuration_parks(db):
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "No SMTP configuration" in notification.last_error


def test_header_injection_in_the_subject_is_refused_and_parked(smtp_server, smtp_config):
    (notification,) = queue()
    Notification.objects.filter(pk=notification.pk).update(subject="Hi\r\nBcc: victim@example.com")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "header injection" in notification.last_error
    assert smtp_server.count == 0


def test_injected_recipient_address_is_refused_and_parked(smtp_server, smtp_config, operators_list):
    EmailRecipient.objects.filter(notification_list=operators_list, email="op2@example.com").update(
        email="op2@example.com\r\nBcc: x@example.com"
    )
    (notification,) = queue()
    run_pass()
    assert fresh(notification).status == Status.PARKED
    assert smtp_server.count == 0
