"""Fixtures for dispatch: a real SMTP server on loopback, an SMTP configuration pointing at
it, and a way to queue notifications through the real ingest path."""

import pytest

from notifications.dispatch import dispatch_pass
from notifications.ingest import notification_validate, notifications_ingest
from notifications.models import Notification, SmtpConfiguration
from tests.conftest import make_payload
from tests.support.smtp import SmtpServer

WORKER = "test-worker"


@pytest.fixture
def smtp_server():
    with SmtpServer() as server:
        yield server


def configure_smtp(server, **overrides):
    values = dict(host=server.host, port=server.port, security="none", from_address="outbox@example.com",
                  timeout_seconds=2, max_retries=3, retry_interval_seconds=60)  # fmt: skip
    values.update(overrides)
    SmtpConfiguration.objects.update_or_create(pk=SmtpConfiguration.SINGLETON_PK, defaults=values)
    return SmtpConfiguration.current()


@pytest.fixture
def smtp_config(db, smtp_server):
    return configure_smtp(smtp_server)


def queue(count=1, *, site_id="plant-a", **overrides):
    """Ingest ``count`` notifications as a site would; returns their rows."""
    items = []
    for _ in range(count):
        item, errors = notification_validate(make_payload(**overrides))
        assert not errors, errors
        items.append(item)
    notifications_ingest(site_id=site_id, inputs=items)
    return list(Notification.objects.filter(pk__in=[i.notification_id for i in items]))


def run_pass(**kwargs):
    kwargs.setdefault("worker_id", WORKER)
    kwargs.setdefault("time_budget", 30)
    return dispatch_pass(**kwargs)


def fresh(notification):
    notification.refresh_from_db()
    return notification
