"""Every failure class of the email adapter, produced by a real SMTP conversation on loopback
(aiosmtpd, or a socket that misbehaves the way a server can), classified by the one
``classify`` in notifications/adapters/email.py, and what the default policy then does."""

import pytest

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import email_send_test
from notifications.models import DeliveryAttempt, Notification, SmtpConfiguration
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.smtp import SmtpServer, closed_port, replying_port, silent_port

Status = Notification.Status


def failure_of(config: SmtpConfiguration, to: str = "op1@example.com") -> DeliveryError:
    """The DeliveryError a delivery through ``config`` to ``to`` raises (the test fails if the
    server accepts)."""
    with pytest.raises(DeliveryError) as caught:
        email_send_test(config=config, to=to)
    return caught.value


# Timeouts long enough for a loaded machine's answers (the timeout tests set their own).
QUICK_TIMEOUTS = {"timeout_seconds": 1, "greeting_timeout_seconds": 1, "data_timeout_seconds": 1}


def plain_config(port: int, **fields) -> SmtpConfiguration:
    values = {
        "host": "127.0.0.1",
        "port": port,
        "security": "none",
        "from_address": "outbox@example.com",
        "timeout_seconds": 10,
        "greeting_timeout_seconds": 10,
        "data_timeout_seconds": 10,
    }
    values.update(fields)
    return SmtpConfiguration(**values)


# --- connection and timeout -------------------------------------------------------------------


def test_a_refused_connection_is_class_connection():
    error = failure_of(plain_config(closed_port()))
    assert error.failure_class == "connection"
    assert "refused" in error.message


def test_a_connection_dropped_during_data_is_class_connection(smtp_server):
    smtp_server.behave("drop")
    assert failure_of(plain_config(smtp_server.port)).failure_class == "connection"


def test_an_unresolvable_host_is_class_connection():
    assert failure_of(plain_config(25, host="relay.invalid")).failure_class == "connection"


def test_a_server_that_never_greets_is_class_timeout():
    with silent_port() as port:
        error = failure_of(plain_config(port, **QUICK_TIMEOUTS))
    assert error.failure_class == "timeout"


def test_a_server_hanging_at_data_is_class_timeout(smtp_server):
    smtp_server.behave("hang", hang_seconds=10)
    assert failure_of(plain_config(smtp_server.port, **QUICK_TIMEOUTS)).failure_class == "timeout"


# --- authentication ---------------------------------------------------------------------------


def test_wrong_credentials_535_are_class_auth():
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        error = failure_of(plain_config(server.port, username="outbox", password="wrong"))
    assert error.failure_class == "auth"
    assert error.detail["smtp_code"] == 535


def test_a_temporary_authentication_failure_454_is_class_auth():
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        server.auth_failure_reply = "454 4.7.0 Temporary authentication failure"
        error = failure_of(plain_config(server.port, username="outbox", password="s3cret-but-expired"))
    assert (error.failure_class, error.detail["smtp_code"]) == ("auth", 454)


def test_authentication_required_530_at_mail_from_is_class_auth(smtp_server):
    smtp_server.behave("mail", reply="530 5.7.0 Authentication required")
    assert failure_of(plain_config(smtp_server.port)).failure_class == "auth"


# --- throttling -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "421 4.7.0 Too many messages, slow down",
        "451 4.7.1 Rate limit exceeded",
        "450 4.2.1 Too many connections from your host",
        "452 4.5.3 Message rate throttled",
    ],
)
def test_rate_replies_at_data_are_class_throttled(smtp_server, reply):
    smtp_server.behave("4xx", reply=reply)
    assert failure_of(plain_config(smtp_server.port)).failure_class == "throttled"


def test_421_at_the_greeting_is_class_throttled():
    with replying_port("421 4.7.0 Too many connections, try later") as port:
        error = failure_of(plain_config(port))
    assert (error.failure_class, error.detail["smtp_code"]) == ("throttled", 421)


def test_a_relay_above_its_rate_answers_421_which_is_class_throttled(smtp_server):
    smtp_server.behave("throttle", limit=1, window_seconds=60)
    config = plain_config(smtp_server.port)
    email_send_test(config=config, to="op1@example.com")  # the first one is within the rate
    assert failure_of(config).failure_class == "throttled"
    assert smtp_server.throttled == 1


# --- the row's own failures ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [550, 551, 553])
def test_every_recipient_refused_with_5xx_is_class_recipient_rejected(smtp_server, code):
    smtp_server.behave("refuse", refuse={"op1@example.com"}, refuse_code=code)
    error = failure_of(plain_config(smtp_server.port))
    assert (error.failure_class, error.detail["stage"]) == ("recipient_rejected", "RCPT TO")


@pytest.mark.parametrize("reply", ["552 5.3.4 Message size exceeds fixed limit", "554 5.7.1 Message rejected as spam"])
def test_5xx_at_data_is_class_content_rejected(smtp_server, reply):
    smtp_server.behave("5xx", reply=reply)
    assert failure_of(plain_config(smtp_server.port)).failure_class == "content_rejected"


def test_header_injection_is_class_content_rejected(smtp_server):
    config = plain_config(smtp_server.port)
    error = failure_of(config, to="op1@example.com\r\nBcc: victim@example.com")
    assert error.failure_class == "content_rejected"
    assert smtp_server.connections == 0


@pytest.mark.parametrize(
    "reply", ["451 4.3.0 Local error in processing", "452 4.3.1 Insufficient system storage", "450 4.2.0 Mailbox busy"]
)
def test_other_4xx_at_data_are_class_provider_error(smtp_server, reply):
    smtp_server.behave("4xx", reply=reply)
    assert failure_of(plain_config(smtp_server.port)).failure_class == "provider_error"


def test_every_recipient_deferred_with_a_plain_4xx_is_class_provider_error(smtp_server):
    smtp_server.behave("refuse", refuse={"op1@example.com"}, refuse_code=450)
    assert failure_of(plain_config(smtp_server.port)).failure_class == "provider_error"


# --- configuration ------------------------------------------------------------------------------


def test_an_untrusted_certificate_is_class_connection_with_a_hint():
    # A channel failure: the breaker holds the rows until the certificate (or ca_file) is
    # fixed, instead of parking every alarm at once.
    with SmtpServer(security="starttls") as server:
        error = failure_of(plain_config(server.port, security="starttls"))
    assert error.failure_class == "connection"
    assert "certificate" in error.message
    assert "ca_file" in error.message


def test_starttls_required_but_not_offered_is_class_configuration(smtp_server):
    assert failure_of(plain_config(smtp_server.port, security="starttls")).failure_class == "configuration"


def test_a_username_for_a_server_without_auth_is_class_configuration(smtp_server):
    error = failure_of(plain_config(smtp_server.port, username="outbox", password="s3cret"))
    assert error.failure_class == "configuration"


def test_the_sender_refused_at_mail_from_is_class_configuration(smtp_server):
    smtp_server.behave("mail", reply="553 5.7.1 Sender address rejected: not owned by user")
    error = failure_of(plain_config(smtp_server.port))
    assert (error.failure_class, error.detail["stage"]) == ("configuration", "MAIL FROM")


def test_a_server_that_refuses_service_at_the_greeting_is_class_configuration():
    with replying_port("554 5.7.1 No SMTP service for your network") as port:
        assert failure_of(plain_config(port)).failure_class == "configuration"


# --- unknown, and what the default policy does with each class ------------------------------------


@pytest.mark.usefixtures("operators_list")
def test_an_adapter_crash_is_class_unknown_and_retried(smtp_server, smtp_config, monkeypatch):
    # A bug cannot be produced by a real server: the composer is made to crash (a mock).
    import notifications.adapters.email as email

    def crash(**kwargs):
        raise RuntimeError("composer bug")

    monkeypatch.setattr(email, "email_compose", crash)
    (notification,) = queue()
    run_pass()
    attempt = DeliveryAttempt.objects.get(notification=notification)
    assert (attempt.failure_class, attempt.outcome) == ("unknown", "transient")
    assert fresh(notification).status == Status.RETRYING


@pytest.mark.usefixtures("operators_list")
@pytest.mark.parametrize(
    ("behaviour", "failure_class", "status"),
    [
        ({"mode": "4xx", "reply": "451 4.3.0 try later"}, "provider_error", Status.RETRYING),
        ({"mode": "4xx", "reply": "421 4.7.0 slow down"}, "throttled", Status.RETRYING),
        ({"mode": "5xx", "reply": "554 5.7.1 rejected"}, "content_rejected", Status.PARKED),
        ({"mode": "refuse", "refuse": {"op1@example.com", "op2@example.com"}}, "recipient_rejected", Status.PARKED),
        ({"mode": "mail", "reply": "553 5.7.1 sender not allowed"}, "configuration", Status.PARKED),
    ],
)
def test_the_default_policy_retries_or_parks_by_class_and_records_the_class(
    smtp_server, smtp_config, behaviour, failure_class, status
):
    options = dict(behaviour)  # the parameters are shared by both ways of speaking SMTP
    smtp_server.behave(options.pop("mode"), **options)
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert notification.status == status
    assert notification.attempts.get().failure_class == failure_class
    if status == Status.PARKED:
        assert notification.last_error.startswith(f"Permanent failure ({failure_class}): ")


def test_a_refused_connection_is_recorded_as_a_channel_failure_of_the_row(db, operators_list):
    plain_config(closed_port()).save()
    (notification,) = queue()
    run_pass()
    notification = fresh(notification)
    assert (notification.status, notification.retry_count, notification.channel_failures) == (Status.RETRYING, 1, 1)
    assert notification.attempts.get().failure_class == "connection"
