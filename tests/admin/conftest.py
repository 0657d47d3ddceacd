"""Fixtures for the operations console: users in each role and a notification factory."""

import hashlib
import importlib
import itertools
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.utils import timezone

from notifications.models import Notification

PASSWORD = "correct horse battery staple"
_counter = itertools.count()


def ensure_roles():
    """The groups come from a data migration; a transactional test's flush removes them."""
    from types import SimpleNamespace

    from django.apps import apps
    from django.db import connection

    if Group.objects.filter(name__in=["Operators", "Administrators"]).count() < 2:
        editor = SimpleNamespace(connection=connection)
        importlib.import_module("notifications.migrations.0004_console_roles").create_roles(apps, editor)
        importlib.import_module("notifications.migrations.0007_delivery_resilience").grant_roles(apps, editor)
        importlib.import_module("notifications.migrations.0009_channel_targets").grant_roles(apps, editor)
        importlib.import_module("notifications.migrations.0011_console_admin").grant_list_view(apps, editor)
        importlib.import_module("notifications.migrations.0021_dispatch_request_worker_processes").grant_roles(
            apps, editor
        )
        importlib.import_module("notifications.migrations.0032_suppression_roles").grant_roles(apps, editor)
        site_roles = importlib.import_module("sites.migrations.0003_site_operator_permissions")
        site_roles.grant(apps, editor)
        importlib.import_module("sites.migrations.0009_watchdog_permissions").grant(apps, editor)


def make_user(username, *, groups=(), permissions=(), superuser=False):
    if groups:
        ensure_roles()
    user = User.objects.create_user(
        username, f"{username}@example.com", PASSWORD, is_staff=True, is_superuser=superuser
    )
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
