"""Apprise end to end: a json:// Apprise URL posting to a real local HTTP receiver."""

import pytest

from notifications.models import AppriseTarget, DeliveryAttempt, Notification
from tests.channels.conftest import configure_channel, make_due
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.receivers import Receiver, Reply
from tests.support.smtp import closed_port

Status = Notification.Status


@pytest.fixture
def receiver():
    with Receiver() as server:
        yield server


def apprise_url(receiver, path="/notify"):
    return f"json://user:apprise-secret@127.0.0.1:{receiver.port}{path}"


def queue_apprise(**overrides):
    overrides.setdefault("type", "apprise")
    overrides.setdefault("list_name", "Channels")
    (notification,) = queue(**overrides)
    return notification


def test_a_json_apprise_url_delivers_title_and_body_and_the_target_is_masked(channel_list, receiver):
    AppriseTarget.objects.create(notification_list=channel_list, url=apprise_url(receiver))
    notification = queue_apprise(subject="Pump 3 tripped", body="Overcurrent")
    assert run_pass().delivered == 1
    (request,) = receiver.received
    message = request.json()
    assert (message["title"], message["message"]) == ("Pump 3 tripped", "Overcurrent")
    assert request.headers["authorization"].startswith("Basic ")
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    (target,) = notification.resolved_targets
    assert target["channel"] == "apprise" and target["outcome"] == "delivered"
    assert "apprise-secret" not in target["target"] and target["target"].startswith("json://")


def test_a_failing_service_is_a_transient_provider_error_then_delivered(channel_list, receiver):
    AppriseTarget.objects.create(notification_list=channel_list, url=apprise_url(receiver))
    receiver.script("/notify", [Reply(500), Reply(200)])
    notification = queue_apprise()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert DeliveryAttempt.objects.get(notification=notification).failure_class == "provider_error"
    make_due(notification)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED


def test_two_of_three_services_accept_and_only_the_third_is_retried(channel_list, receiver):
    for path in ("/a", "/b", "/c"):
        AppriseTarget.objects.create(notification_list=channel_list, url=apprise_url(receiver, path))
    receiver.script("/c", [Reply(503), Reply(200)])
    notification = queue_apprise()
    run_pass()
    assert fresh(notification).status == Status.RETRYING
    make_due(notification)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    assert sorted(request.path for request in receiver.received) == ["/a", "/b", "/c", "/c"]


def test_a_service_slower_than_the_timeout_is_not_delivered(channel_list, receiver):
    configure_channel("apprise", timeout_seconds=1)
    AppriseTarget.objects.create(notification_list=channel_list, url=apprise_url(receiver))
    receiver.script("/notify", [Reply(200, delay=4)])
    notification = queue_apprise()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    attempt = DeliveryAttempt.objects.get(notification=notification)
    # Apprise reports its own read timeout as a failed send, not as a timeout: a provider error.
    assert attempt.failure_class == "provider_error"
    assert attempt.duration_ms is not None and attempt.duration_ms < 3900


def test_an_unreachable_service_is_retried(channel_list):
    AppriseTarget.objects.create(notification_list=channel_list, url=f"json://127.0.0.1:{closed_port()}/x")
    notification = queue_apprise()
    run_pass()
    assert fresh(notification).status == Status.RETRYING
