"""Signed webhooks end to end over real HTTP: a receiver that verifies every request with the
standardwebhooks library, scripted to accept, fail, refuse or hang."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import DeliveryAttempt, EmailRecipient, Notification, WebhookTarget
from tests.channels.conftest import configure_channel, make_due
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass
from tests.support.receivers import Reply, new_webhook_secret
from tests.support.smtp import SmtpServer

Status = Notification.Status


def add_hooks(channel_list, receiver, *paths, secret=None):
    for path in paths:
        hook_secret = secret or new_webhook_secret()
        receiver.secrets[path] = hook_secret
        WebhookTarget.objects.create(notification_list=channel_list, url=receiver.url(path), secret=hook_secret)


def queue_webhook(**overrides):
    overrides.setdefault("type", "webhook")
    overrides.setdefault("list_name", "Channels")
    (notification,) = queue(**overrides)
    return notification


def test_a_signed_webhook_verifies_at_the_receiver_and_the_notification_is_delivered(channel_list, webhook_receiver):
    add_hooks(channel_list, webhook_receiver, "/hook")
    notification = queue_webhook(subject="Pump 3 tripped", body="Overcurrent", type_data={"pump": 3})
    report = run_pass()
    assert report.delivered == 1
    (request,) = webhook_receiver.received
    assert request.verified is True
    assert request.headers["webhook-id"] == str(notification.notification_id)
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body == {
        "notification_id": str(notification.notification_id),
        "type": "webhook",
        "list_name": "Channels",
        "subject": "Pump 3 tripped",
        "body": "Overcurrent",
        "type_data": {"pump": 3},
        "site_id": "plant-a",
        "created_at": body["created_at"],
    }
    assert body["created_at"].endswith("Z")
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    (target,) = notification.resolved_targets
    assert target["channel"] == "webhook"
    assert target["target"] == webhook_receiver.url("/hook")
    assert (target["outcome"], target["http_status"]) == ("delivered", 200)


def test_a_receiver_with_another_secret_rejects_the_signature_and_the_target_is_refused(channel_list, webhook_receiver):
    WebhookTarget.objects.create(
        notification_list=channel_list, url=webhook_receiver.url("/hook"), secret=new_webhook_secret()
    )
    webhook_receiver.secrets["/hook"] = new_webhook_secret()  # the receiver knows a different secret
    notification = queue_webhook()
    run_pass()
    (request,) = webhook_receiver.received
    assert request.verified is False
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "401" in notification.last_error
    assert notification.resolved_targets[0]["outcome"] == "refused"


def test_a_503_is_retried_and_delivered_once_the_receiver_recovers(channel_list, webhook_receiver):
    add_hooks(channel_list, webhook_receiver, "/hook")
    webhook_receiver.script("/hook", [Reply(503, "down for maintenance"), Reply(200)])
    notification = queue_webhook()
    assert run_pass().retrying == 1
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert notification.retry_count == 1
    assert "HTTP 503" in notification.last_error
    assert notification.resolved_targets[0]["outcome"] == "deferred"
    attempt = DeliveryAttempt.objects.get(notification=notification)
    assert (attempt.outcome, attempt.failure_class) == ("transient", "provider_error")
    make_due(notification)
    assert run_pass().delivered == 1
    assert fresh(notification).status == Status.DELIVERED
    assert len(webhook_receiver.received) == 2
    assert all(request.verified for request in webhook_receiver.received)


def test_a_429_with_retry_after_is_retried_no_sooner_than_the_receiver_asked(channel_list, webhook_receiver):
    add_hooks(channel_list, webhook_receiver, "/hook")
    webhook_receiver.script("/hook", [Reply(429, "slow down", {"Retry-After": "900"})])
    notification = queue_webhook()
    before = timezone.now()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    # The channel's own first delay is 30 s; the receiver asked for 15 minutes.
    assert notification.next_attempt_at >= before + timedelta(seconds=899)
    assert DeliveryAttempt.objects.get(notification=notification).failure_class == "throttled"


@pytest.mark.parametrize("status", [400, 410])
def test_a_4xx_answer_is_permanent_and_parks_the_notification(channel_list, webhook_receiver, status):
    add_hooks(channel_list, webhook_receiver, "/hook")
    webhook_receiver.script("/hook", [Reply(status, "no such hook")])
    notification = queue_webhook()
    assert run_pass().parked == 1
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Permanent failure")
    assert f"HTTP {status}" in notification.last_error
    assert notification.resolved_targets[0]["outcome"] == "refused"


def test_two_of_three_targets_accept_then_only_the_third_is_retried(channel_list, webhook_receiver):
    add_hooks(channel_list, webhook_receiver, "/a", "/b", "/c")
    webhook_receiver.script("/c", [Reply(503), Reply(200)])
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    # Two accepted, one still retryable: not Delivered yet.
    assert notification.status == Status.RETRYING
    outcomes = {entry["target"].rsplit("/", 1)[1]: entry["outcome"] for entry in notification.resolved_targets}
    assert outcomes == {"a": "delivered", "b": "delivered", "c": "deferred"}
    make_due(notification)
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert [request.path for request in webhook_receiver.received].count("/a") == 1  # never sent twice
    assert [request.path for request in webhook_receiver.received].count("/c") == 2
    assert {entry["outcome"] for entry in notification.resolved_targets} == {"delivered"}


def test_one_target_refusing_does_not_stop_delivery_to_the_others(channel_list, webhook_receiver):
    add_hooks(channel_list, webhook_receiver, "/a", "/gone")
    webhook_receiver.script("/gone", [Reply(410, "gone")])
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert "some targets refused" in notification.last_error
    assert sorted(entry["outcome"] for entry in notification.resolved_targets) == ["delivered", "refused"]


def test_a_receiver_slower_than_the_timeout_is_a_transient_timeout(channel_list, webhook_receiver):
    configure_channel("webhook", timeout_seconds=1)
    add_hooks(channel_list, webhook_receiver, "/slow")
    webhook_receiver.script("/slow", [Reply(200, delay=3)])
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    attempt = DeliveryAttempt.objects.get(notification=notification)
    assert attempt.failure_class == "timeout"
    assert attempt.duration_ms is not None and attempt.duration_ms < 2900


def test_a_receiver_that_is_down_is_a_connection_failure_that_never_parks(channel_list):
    from tests.support.smtp import closed_port

    WebhookTarget.objects.create(
        notification_list=channel_list, url=f"http://127.0.0.1:{closed_port()}/hook", secret=new_webhook_secret()
    )
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert notification.last_error.startswith("Channel failure (connection")
    assert notification.channel_failures == 1


def test_a_list_without_webhook_targets_is_a_permanent_failure_naming_list_and_channel(channel_list):
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "'Channels'" in notification.last_error and "webhook" in notification.last_error


def test_the_secret_is_stored_encrypted(channel_list, webhook_receiver):
    from django.db import connection

    secret = new_webhook_secret()
    WebhookTarget.objects.create(notification_list=channel_list, url=webhook_receiver.url(), secret=secret)
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM notifications_webhooktarget")
        (stored,) = cursor.fetchone()
    assert stored.startswith("fernet:") and secret not in stored
    assert json.dumps(WebhookTarget.objects.get().secret) == json.dumps(secret)


def test_targets_not_reached_within_a_quarter_of_the_lease_wait_for_the_next_attempt(
    channel_list, webhook_receiver, settings
):
    settings.OUTBOX_LEASE_SECONDS = 4  # a quarter: 1 s for all the targets of one notification
    configure_channel("webhook", timeout_seconds=1)
    add_hooks(channel_list, webhook_receiver, "/slow", "/later")
    webhook_receiver.script("/slow", [Reply(200, delay=1.5), Reply(200)])
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    later = next(entry for entry in notification.resolved_targets if entry["target"].endswith("/later"))
    assert later["outcome"] == "deferred" and "ran out of time" in later["detail"]
    assert [request.path for request in webhook_receiver.received] == ["/slow"]
    make_due(notification)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED


def test_a_secret_the_keys_cannot_decrypt_refuses_that_target_and_the_others_are_delivered(
    channel_list, webhook_receiver, settings
):
    add_hooks(channel_list, webhook_receiver, "/old")
    settings.OUTBOX_SECRET_KEYS = ["a-new-key"]  # /old's secret was encrypted under SECRET_KEY
    add_hooks(channel_list, webhook_receiver, "/new")
    notification = queue_webhook()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    old = next(entry for entry in notification.resolved_targets if entry["target"].endswith("/old"))
    assert old["outcome"] == "refused" and "cannot be decrypted" in old["detail"]
    assert [request.path for request in webhook_receiver.received] == ["/new"]


def test_email_and_webhooks_in_one_pass_are_each_delivered_once(channel_list, webhook_receiver):
    # Email runs on the pass's own thread, webhooks on delivery threads: the pass waits for both.
    add_hooks(channel_list, webhook_receiver, "/hook")
    EmailRecipient.objects.create(notification_list=channel_list, email="ops@example.com")
    with SmtpServer(pipelining=True) as server:
        configure_smtp(server)
        hooks = [queue_webhook(subject=f"hook {number}") for number in range(6)]
        mails = queue(6, type="email", list_name="Channels")
        report = run_pass(concurrency=3)
        assert report.delivered == 12
        assert server.count == 6
        assert set(server.count_by_notification_id().values()) == {1}
    assert sorted(request.headers["webhook-id"] for request in webhook_receiver.received) == sorted(
        str(row.notification_id) for row in hooks
    )
    assert all(fresh(row).status == Status.DELIVERED for row in [*hooks, *mails])
