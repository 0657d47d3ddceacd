"""Delivery through a real Postfix (tests/support/postfix.py): required STARTTLS with a
certificate from a test CA, SASL (Cyrus, sasldb) required to relay, a recipient and a size
limit, relaying to an aiosmtpd sink. Skipped (with the reason) where Postfix is not installed,
unless CI=true: then it fails."""

import time

import pytest

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import email_send_test
from notifications.models import EmailRecipient, Notification, NotificationList, SmtpConfiguration
from tests.dispatch.conftest import fresh, queue, run_pass, store_policy
from tests.support.postfix import PostfixRelay, postfix_or_skip
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
