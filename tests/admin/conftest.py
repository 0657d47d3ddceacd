"""Fixtures for the operations console: users in each role and a notification factory."""

import hashlib
import itertools
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.utils import timezone

from notifications.models import Notification

PASSWORD = "correct horse battery staple"
_counter = itertools.count()


def make_user(username, *, groups=(), permissions=(), superuser=False):
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=True, is_superuser=superuser)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def operator(db):
    return make_user("olivia", groups=["Operators"])


@pytest.fixture
def administrator(db):
    return make_user("adam", groups=["Administrators"])


@pytest.fixture
def viewer(db):
    """Staff who may look at the outbox but neither retry nor discard."""
    return make_user("victor", permissions=["view_notification"])


def login(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(client, operator):
    return login(client, operator)


@pytest.fixture
def admin_client_(client, administrator):
    return login(client, administrator)


def make_notification(*, status=Notification.Status.PENDING, age=timedelta(seconds=5), **fields):
    now = timezone.now()
    n = next(_counter)
    values = {
        "notification_id": uuid.uuid4(),
        "type": "email",
        "list_name": "Operators",
        "subject": f"Pump {n} tripped",
        "body": "Pump tripped on overcurrent.",
        "source_site_id": "plant-a",
        "site_enqueued_at": now - age,
        "created_at": now - age,
        "fingerprint": hashlib.sha256(str(n).encode()).hexdigest(),
        "status": status,
    }
    if status == Notification.Status.PARKED:
        values.update(retry_count=10, last_error="Retries exhausted (10): 451 try again later")
    if status == Notification.Status.DELIVERED:
        values.update(delivered_at=now - age + timedelta(seconds=1))
    values.update(fields)
    return Notification.objects.create(**values)


@pytest.fixture
def notification_factory(db):
    return make_notification
