"""Fixtures for dispatch: a real SMTP server on loopback, an SMTP configuration pointing at
it, and a way to queue notifications through the real ingest path."""

import pytest

from notifications.backoff import RetryTiming
from notifications.dispatch.runner import dispatch_pass
from notifications.health import Channel
from notifications.ingest import NotificationInput, notification_validate, notifications_ingest
from notifications.models import DeliveryPolicy, Notification, SmtpConfiguration, default_retry_on
from notifications.policies import ChannelPolicy
from tests.support.payloads import make_payload
from tests.support.smtp import SmtpServer

WORKER = "test-worker"


# The tests of SMTP transactions run against both ways of speaking: pipelined (RFC 2920, what
# real relays advertise and so the server's default here) and one command at a time.
BOTH_WAYS = {
    "tests.dispatch.test_email_delivery",
    "tests.dispatch.test_failure_classes",
    "tests.dispatch.test_partial_delivery",
    "tests.dispatch.test_recipient_state",
}


def pytest_generate_tests(metafunc):
    if "smtp_server" in metafunc.fixturenames and metafunc.module.__name__ in BOTH_WAYS:
        metafunc.parametrize("smtp_server", [True, False], indirect=True, ids=["pipelined", "lockstep"])


@pytest.fixture
def smtp_server(request):
    with SmtpServer(pipelining=getattr(request, "param", True)) as server:
        yield server


def configure_smtp(server, **overrides):
    values = {
        "host": server.host,
        "port": server.port,
        "security": "none",
        "from_address": "outbox@example.com",
        "timeout_seconds": 2,
        "max_retries": 3,
        "retry_interval_seconds": 60,
    }
    values.update(overrides)
    SmtpConfiguration.objects.update_or_create(pk=SmtpConfiguration.SINGLETON_PK, defaults=values)
    return SmtpConfiguration.current()


@pytest.fixture
def smtp_config(db, smtp_server):
    return configure_smtp(smtp_server)


def validated(payload, *, site_id="plant-a") -> NotificationInput:
    """``payload`` through validation, as the API would take it from ``site_id``."""
    item, rejection = notification_validate(payload, site_id=site_id)
    assert item is not None, rejection
    return item


def queue(count=1, *, site_id="plant-a", **overrides):
    """Ingest ``count`` notifications as a site would; returns their rows."""
    items = []
    for _ in range(count):
        items.append(validated(make_payload(**overrides), site_id=site_id))
    notifications_ingest(site_id=site_id, inputs=items)
    return list(Notification.objects.filter(pk__in=[i.notification_id for i in items]))


def run_pass(**kwargs):
    kwargs.setdefault("worker_id", WORKER)
    kwargs.setdefault("time_budget", 30)
    return dispatch_pass(**kwargs)


def fresh(notification):
    notification.refresh_from_db()
    return notification


TIMING_FIELDS = ("strategy", "interval_seconds", "max_interval_seconds", "jitter", "max_attempts", "max_age_seconds")


def channel_with(*, name="email", endpoint=None, retry_on=None, **fields):
    """A channel as a dispatch pass sees it, with a policy built from ``fields`` (timing fields
    and breaker settings) over the defaults; no endpoint unless given (then its health counts)."""
    timing = RetryTiming(**{key: value for key, value in fields.items() if key in TIMING_FIELDS})
    rest = {key: value for key, value in fields.items() if key not in TIMING_FIELDS}
    policy = ChannelPolicy(
        channel=name, timing=timing, retry_on=frozenset(default_retry_on() if retry_on is None else retry_on), **rest
    )
    return Channel(name=name, endpoint=endpoint, policy=policy)


def store_policy(channel="email", **fields):
    """Store ``channel``'s delivery policy with ``fields`` over the model's defaults."""
    DeliveryPolicy.objects.update_or_create(channel=channel, defaults=fields)
