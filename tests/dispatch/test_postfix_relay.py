"""Delivery through a real Postfix (tests/support/postfix.py): required STARTTLS with a
certificate from a test CA, SASL (Cyrus, sasldb) required to relay, a recipient and a size
limit, relaying to an aiosmtpd sink. Skipped (with the reason) where Postfix is not installed,
unless CI=true: then it fails."""

import time

import pytest

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import email_send_test
from notifications.models import ChannelHealth, EmailRecipient, Notification, NotificationList, SmtpConfiguration
from tests.dispatch.conftest import fresh, queue, run_pass, store_policy
from tests.support.postfix import PolicyService, PostfixRelay, postfix_or_skip
from tests.support.smtp import SmtpServer

Status = Notification.Status


@pytest.fixture(scope="module")
def relay():
    postfix_or_skip()
    with SmtpServer() as sink, PostfixRelay(sink=sink) as postfix:
        yield postfix


@pytest.fixture
def sink(relay):
    relay.sink.reset()
    relay.sink.behave("accept")
    return relay.sink


def relay_config(relay, **overrides) -> SmtpConfiguration:
    values = {
        "host": relay.host,
        "port": relay.port,
        "security": "starttls",
        "ca_file": relay.ca_file,
        "username": relay.username,
        "password": relay.password,
        "from_address": "outbox@example.com",
        "local_hostname": "outbox.example.com",
        "timeout_seconds": 10,
    }
    values.update(overrides)
    SmtpConfiguration.objects.update_or_create(pk=SmtpConfiguration.SINGLETON_PK, defaults=values)
    return SmtpConfiguration.objects.get()


def members(name: str, *addresses: str) -> NotificationList:
    notification_list = NotificationList.objects.create(name=name)
    for address in addresses:
        EmailRecipient.objects.create(notification_list=notification_list, email=address)
    return notification_list


def test_the_private_ca_is_trusted_through_ca_file_only(db, relay, sink):
    untrusted = relay_config(relay, ca_file="")
    with pytest.raises(DeliveryError) as caught:
        email_send_test(config=untrusted, to="op1@example.com")
    assert caught.value.failure_class == "connection"  # held by the breaker, not parked
    assert "certificate" in caught.value.message and "ca_file" in caught.value.message
    result = email_send_test(config=relay_config(relay), to="op1@example.com")
    assert result.detail["smtp_code"] == 250
    relay.wait_until_idle()
    sink.wait_for(1, timeout=20)


def test_idn_recipient_and_from_are_delivered_in_punycode(db, relay, sink):
    relay_config(relay, from_address="alarme@bücher.example")
    members("Idn", "ops@bücher.example", "op2@example.com")
    (notification,) = queue(list_name="Idn")
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    sink.wait_for(1, timeout=20)
    (received,) = sink.received
    assert received.mail_from == "alarme@xn--bcher-kva.example"
    assert sorted(received.rcpt_tos) == ["op2@example.com", "ops@xn--bcher-kva.example"]
    assert received.message["From"] == "alarme@xn--bcher-kva.example"


def test_the_test_email_to_an_idn_address_is_delivered(db, relay, sink):
    result = email_send_test(config=relay_config(relay), to="ops@bücher.example")
    assert result.detail["smtp_code"] == 250
    sink.wait_for(1, timeout=20)
    assert sink.received[0].rcpt_tos == ["ops@xn--bcher-kva.example"]
    assert sink.received[0].message["To"] == "ops@xn--bcher-kva.example"


def test_a_wrong_password_costs_one_failed_auth_per_pass_and_recovers_by_itself(db, relay, sink, operators_list):
    # Short timing so that the recovery happens within the test; the breaker opens at the
    # first channel failure.
    store_policy(
        interval_seconds=1,
        breaker_threshold=1,
        breaker_cooldown_seconds=1,
        breaker_max_cooldown_seconds=1,
    )
    relay_config(relay, password="wrong-password")
    failed_before = relay.log_count("authentication failed")
    notifications = queue(20)
    run_pass(concurrency=4)
    assert relay.log_count("authentication failed") - failed_before == 1
    statuses = {fresh(n).status for n in notifications}
    assert Status.PARKED not in statuses and Status.DELIVERED not in statuses
    # The rows tried carry the reason; the others were held by the open breaker, untried.
    assert any("authentication failed" in fresh(n).last_error for n in notifications)

    # A second pass (the breaker's probe) tries once more, again at most once.
    time.sleep(1.1)
    run_pass(concurrency=4)
    assert relay.log_count("authentication failed") - failed_before <= 2
    assert not Notification.objects.filter(status=Status.PARKED).exists()

    # The administrator fixes the password; nobody touches the rows.
    relay_config(relay)
    deadline = time.monotonic() + 30
    while Notification.objects.exclude(status=Status.DELIVERED).exists() and time.monotonic() < deadline:
        run_pass(concurrency=4)
        time.sleep(0.3)
    assert set(Notification.objects.values_list("status", flat=True)) == {Status.DELIVERED}
    relay.wait_until_idle()
    sink.wait_for(20, timeout=20)
    assert relay.log_count("authentication failed") - failed_before <= 3 + 2  # one per pass at most


def test_a_non_fqdn_helo_is_refused_until_local_hostname_is_set(db, relay, monkeypatch):
    postfix_or_skip()
    # This host's own name as a machine without a domain would give it.
    monkeypatch.setattr("notifications.adapters.smtp_connect.default_local_hostname", lambda: "plant-pc")
    with SmtpServer() as sink, PostfixRelay(sink=sink, reject_non_fqdn_helo=True) as strict:
        config = relay_config(strict, ca_file=strict.ca_file, local_hostname="")
        with pytest.raises(DeliveryError) as caught:
            email_send_test(config=config, to="op1@example.com")
        assert caught.value.failure_class == "configuration"
        assert "local_hostname" in caught.value.message
        assert "504" in caught.value.message
        # The same through delivery: one code path.
        members("Helo", "op1@example.com")
        (notification,) = queue(list_name="Helo")
        run_pass()
        assert fresh(notification).status == Status.PARKED
        assert "local_hostname" in fresh(notification).last_error

        config = relay_config(strict, ca_file=strict.ca_file, local_hostname="outbox.example.com")
        assert email_send_test(config=config, to="op1@example.com").detail["smtp_code"] == 250
        sink.wait_for(1, timeout=20)


def test_an_oversize_message_is_refused_at_mail_from_before_it_is_sent(db, operators_list):
    postfix_or_skip()
    with SmtpServer() as sink, PostfixRelay(sink=sink, message_size_limit=4000) as small:
        relay_config(small)
        (notification,) = queue(body="Pump log:\n" + "x" * 8000)
        run_pass()
        notification = fresh(notification)
        # SIZE=<bytes> on MAIL FROM: Postfix refuses there (552 5.3.4), before any DATA.
        assert notification.status == Status.PARKED
        assert "552" in notification.last_error and "MAIL FROM" in notification.last_error
        assert notification.attempts.get().failure_class == "content_rejected"
        assert sink.count == 0


def test_120_recipients_through_a_relay_that_takes_50_per_transaction_each_receive_it_once(db, relay, sink):
    """Postfix answers the 51st RCPT TO with ``452 4.5.3 Error: too many recipients``: the
    adapter sends the rest in further transactions of the same attempt (RFC 5321 4.5.3.1.10)."""
    assert relay.recipient_limit == 50
    relay_config(relay)
    addresses = [f"member{index:03d}@example.com" for index in range(120)]
    members("Everyone", *addresses)
    (notification,) = queue(list_name="Everyone")
    run_pass()
    row = fresh(notification)
    assert row.status == Status.DELIVERED, row.last_error
    deadline = time.monotonic() + 30
    while sum(sink.copies_by_recipient().values()) < 120 and time.monotonic() < deadline:
        time.sleep(0.2)
    relay.wait_until_idle()
    copies = sink.copies_by_recipient()
    assert copies == dict.fromkeys(addresses, 1)
    # Postfix queued three messages of 50, 50 and 20 recipients (its limit held every time).
    assert relay.log_count("nrcpt=50 ") == 2 and relay.log_count("nrcpt=20 ") == 1, relay.log_text()[-3000:]


def test_a_policy_service_answering_451_opens_the_breaker_and_the_rows_are_delivered_once_it_answers_again(db):
    """Postfix's ``check_policy_service`` asks a policy server about every recipient; while it
    answers ``451 4.3.5`` (as Postfix itself does when the service is down) every recipient of
    every message is deferred alike. That is the relay failing, not the rows: the breaker opens
    ("relay-wide 451 4.3.5"), nothing is charged or parked, and once the service answers DUNNO
    again the probes deliver everything — no operator action."""
    postfix_or_skip()
    store_policy(
        strategy="fixed", interval_seconds=1, max_attempts=2, breaker_cooldown_seconds=1, breaker_max_cooldown_seconds=2
    )
    members("Shift", "a@example.com", "b@example.com", "c@example.com")
    with (
        SmtpServer() as sink,
        PolicyService() as policy,
        PostfixRelay(sink=sink, policy=policy) as guarded,
    ):
        policy.action = "451 4.3.5 Policy service unavailable"
        relay_config(guarded)
        notifications = queue(5, list_name="Shift")
        deadline = time.monotonic() + 8  # longer than two attempts at 1 s: the row limit would park them
        while time.monotonic() < deadline:
            run_pass(concurrency=2)
            time.sleep(0.3)
        health = ChannelHealth.objects.get(channel="email")
        assert health.state in (ChannelHealth.State.OPEN, ChannelHealth.State.HALF_OPEN)
        assert health.last_error.startswith("relay-wide 451 4.3.5")
        assert policy.requests >= 9  # three notifications, three recipients at least
        rows = [fresh(n) for n in notifications]
        assert {row.status for row in rows} == {Status.RETRYING}
        assert all(row.retry_count == row.channel_failures for row in rows)
        assert sink.count == 0

        policy.action = "DUNNO"  # the service is back; nobody touches the rows
        deadline = time.monotonic() + 30
        while Notification.objects.exclude(status=Status.DELIVERED).exists() and time.monotonic() < deadline:
            run_pass(concurrency=2)
            time.sleep(0.3)
        assert set(Notification.objects.values_list("status", flat=True)) == {Status.DELIVERED}
        assert ChannelHealth.objects.get(channel="email").state == ChannelHealth.State.CLOSED
        guarded.wait_until_idle()
        sink.wait_for(5, timeout=20)
        assert sink.count_by_notification_id() == {str(n.pk): 1 for n in notifications}
