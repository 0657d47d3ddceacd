"""Shared fixtures: a site, its key, an authenticated API client, a notification list."""

import uuid

import pytest
from django.db import connection
from rest_framework.test import APIClient

from notifications.models import EmailRecipient, NotificationList
from sites.models import Site
from sites.services import site_key_issue


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Each test starts with full per-site token buckets."""
    from sites.throttling import SiteRateThrottle

    SiteRateThrottle._buckets.clear()


@pytest.fixture
def postgres_only(db):
    """Skip (with a printed reason) where the test database is not PostgreSQL."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://…); this run uses SQLite")


@pytest.fixture
def site(db):
    return Site.objects.create(site_id="plant-a", name="Plant A")


@pytest.fixture
def site_key(site):
    _, key = site_key_issue(site=site)
    return key


@pytest.fixture
def other_site(db):
    return Site.objects.create(site_id="plant-b", name="Plant B")


@pytest.fixture
def other_site_key(other_site):
    _, key = site_key_issue(site=other_site)
    return key


@pytest.fixture
def api(site_key):
    """An API client authenticated as plant-a."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
    return client


@pytest.fixture
def operators_list(db):
    notification_list = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=notification_list, email="op1@example.com")
    EmailRecipient.objects.create(notification_list=notification_list, email="op2@example.com")
    return notification_list


def make_payload(**overrides):
    payload = {
        "notification_id": str(uuid.uuid4()),
        "type": "email",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "body": "Pump 3 tripped on overcurrent at 10:00.",
        "type_data": {},
        "source_instance_id": "Pump3",
        "source_script": "OnTrip",
        "site_enqueued_at": "2026-11-21T10:00:00Z",
    }
    payload.update(overrides)
    return payload


@pytest.fixture
def payload():
    return make_payload()
