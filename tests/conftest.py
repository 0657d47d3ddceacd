"""Shared fixtures: the test run's settings, a site, its key, an authenticated API client, a
notification list and a payload. Helpers live in tests/support/."""

import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import connection, connections
from django.test import override_settings
from rest_framework.test import APIClient

from notifications.models import EmailRecipient, NotificationList
from sites.models import Site
from sites.services import site_key_issue
from tests.support.payloads import make_payload


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On SQLite, the test database is a file in this run's temporary directory: a file, not
    memory, so that processes a test starts share it; per run, so that two runs on one
    checkout do not collide."""
    database = connections["default"]
    if database.vendor == "sqlite":
        name = tmp_path_factory.mktemp("database") / "test_outbox.sqlite3"
        database.settings_dict.setdefault("TEST", {})["NAME"] = str(name)


@pytest.fixture(scope="session", autouse=True)
def _test_run_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For the whole run, here and in every process a test starts: the dispatch trigger is off
    unless a test is marked ``dispatch_trigger``; STATIC_ROOT, the metrics files and the password
    hashing lock are in directories of this run, not var/ of the checkout. In this process, passwords use a fast hasher: the hash
    algorithm is Django's, not what these tests examine, and the default one costs a
    noticeable fraction of a second per user created."""
    static_root = str(tmp_path_factory.mktemp("static"))
    # Processes the tests start count their deliveries into this run's metrics files, not var/.
    metrics_dir = str(tmp_path_factory.mktemp("metrics"))
    hash_lock = str(tmp_path_factory.mktemp("locks") / "password-hashing.lock")
    with (
        mock.patch.dict(
            os.environ,
            {
                "OUTBOX_DISPATCH_TRIGGER": "false",
                "STATIC_ROOT": static_root,
                "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
                "OUTBOX_PASSWORD_HASH_LOCK": hash_lock,
            },
        ),
        override_settings(
            OUTBOX_DISPATCH_TRIGGER=False,
            STATIC_ROOT=static_root,
            OUTBOX_PASSWORD_HASH_LOCK=hash_lock,
            PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        ),
    ):
        yield


@pytest.fixture(autouse=True)
def _dispatch_trigger(request: pytest.FixtureRequest) -> None:
    """Tests marked ``dispatch_trigger`` run with the trigger on (in this process)."""
    if request.node.get_closest_marker("dispatch_trigger"):
        request.getfixturevalue("settings").OUTBOX_DISPATCH_TRIGGER = True


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    """Each test starts with no per-site tokens held by this process (the shared buckets are rows
    of the test's database) and full failed-authentication and console-login token buckets."""
    from notifications.console_login import login_failures
    from sites.rate_limits import leases
    from sites.throttling import auth_failures

    leases.clear()
    auth_failures.clear()
    login_failures.clear()


@pytest.fixture(autouse=True)
def _fresh_list_settings() -> None:
    """Each test starts with no lists' settings held by this process (a rolled-back test's lists
    are gone without the signal that would forget them)."""
    from notifications.acknowledgement import list_settings_forget

    list_settings_forget()


@pytest.fixture
def postgres_only(db: None) -> None:
    """Skip (with a printed reason) where the test database is not PostgreSQL."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://…); this run uses SQLite")


@pytest.fixture
def site(db: None) -> Site:
    return Site.objects.create(site_id="plant-a", name="Plant A")


@pytest.fixture
def site_key(site: Site) -> str:
    _, key = site_key_issue(site=site)
    return key


@pytest.fixture
def other_site(db: None) -> Site:
    return Site.objects.create(site_id="plant-b", name="Plant B")


@pytest.fixture
def other_site_key(other_site: Site) -> str:
    _, key = site_key_issue(site=other_site)
    return key


@pytest.fixture
def api(site_key: str) -> APIClient:
    """An API client authenticated as plant-a."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
    return client


@pytest.fixture
def operators_list(db: None) -> NotificationList:
    notification_list = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=notification_list, email="op1@example.com")
    EmailRecipient.objects.create(notification_list=notification_list, email="op2@example.com")
    return notification_list


@pytest.fixture
def payload() -> dict[str, Any]:
    return make_payload()
