"""Timing: the worker's schedules come with migrate (and a check warns when they are missing),
the worker knows when work is next due and waits for it (one waiter at a time), a task hands
the waiting on before it ends, and a retry is never attempted before it is due.

A fresh clone with only ``migrate`` and ``qcluster`` retries a transient failure: the last
test starts a real qcluster (and gunicorn) on a database that nothing else prepared."""

import json
import subprocess
import threading
from datetime import timedelta

import pytest
import requests
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Schedule

from notifications import tasks
from notifications.checks import check_schedules_present
from notifications.dispatch.claim import dispatch_wake_at
from notifications.dispatch.wait import dispatch_timer_take, dispatch_wait
from notifications.models import DeliveryAttempt, Notification
from notifications.schedules import SCHEDULES
from tests.dispatch.conftest import fresh, queue, store_policy
from tests.dispatch.test_worker import queued_dispatch_tasks
from tests.support.db import database_url, drop_postgres_database, fresh_postgres_database
from tests.support.processes import Central, manage, manage_output, poll, stop

Status = Notification.Status
pytestmark = pytest.mark.usefixtures("operators_list")


# --- schedules ------------------------------------------------------------------------------------


def test_migrate_creates_the_schedules_and_running_it_again_changes_nothing(db):
    Schedule.objects.all().delete()
    call_command("migrate", verbosity=0)
    created = {s.name: (s.func, s.pk) for s in Schedule.objects.all()}
    assert set(created) == set(SCHEDULES)
    call_command("migrate", verbosity=0)
    assert {s.name: (s.func, s.pk) for s in Schedule.objects.all()} == created


def test_the_system_check_warns_when_a_schedule_is_missing(db):
    assert check_schedules_present() == []
    Schedule.objects.filter(name="outbox: dispatch sweep").delete()
    (warning,) = check_schedules_present()
    assert warning.id == "outbox.W001"
    assert "outbox: dispatch sweep" in warning.msg and "migrate" in str(warning.hint)


# --- knowing when work is due -----------------------------------------------------------------------


def test_the_next_wake_is_the_earliest_due_time_of_a_waiting_row(db):
    now = timezone.now()
    soon, later = queue(2)
    Notification.objects.filter(pk=soon.pk).update(status=Status.RETRYING, next_attempt_at=now + timedelta(seconds=5))
    Notification.objects.filter(pk=later.pk).update(status=Status.RETRYING, next_attempt_at=now + timedelta(seconds=50))
    assert dispatch_wake_at(now=now) == now + timedelta(seconds=5)
    Notification.objects.filter(pk=soon.pk).update(claimed_by="w1", claimed_until=now + timedelta(seconds=60))
    assert dispatch_wake_at(now=now) == now + timedelta(seconds=50)  # rows under a live claim are not waiting
    Notification.objects.update(status=Status.DELIVERED)
    assert dispatch_wake_at(now=now) is None


def test_a_row_due_in_the_past_wakes_the_worker_now(db):
    queue()
    now = timezone.now() + timedelta(seconds=1)
    assert dispatch_wake_at(now=now) == now


# --- waiting for it ----------------------------------------------------------------------------------


def test_the_waiting_worker_attempts_a_retry_when_it_is_due_and_not_before(smtp_server, smtp_config):
    store_policy(strategy="fixed", interval_seconds=1)
    smtp_server.behave("fail_first")
    (row,) = queue()
    waited = dispatch_wait(worker_id="waiter", time_budget=10)
    assert waited.held
    row = fresh(row)
    assert row.status == Status.DELIVERED and smtp_server.count == 1
    first, second = DeliveryAttempt.objects.filter(notification=row).order_by("started_at")
    assert first.failure_class == "provider_error"
    assert second.started_at >= first.started_at + timedelta(seconds=1)  # never before it was due
    assert waited.next_wake is None


def test_only_one_worker_waits_at_a_time(db):
    assert dispatch_timer_take(holder="first", seconds=30)
    assert not dispatch_timer_take(holder="second", seconds=30)
    assert dispatch_timer_take(holder="first", seconds=30)  # the holder keeps it
    waited = dispatch_wait(worker_id="second", time_budget=5)
    assert (waited.held, waited.passes) == (False, [])


def test_a_waiting_worker_gives_the_role_back_when_it_stops(db):
    stop_event = threading.Event()
    stop_event.set()
    assert dispatch_wait(worker_id="first", time_budget=5, stop=stop_event).held
    assert dispatch_timer_take(holder="second", seconds=5)


def test_a_task_whose_next_due_time_lies_beyond_its_budget_hands_the_wait_on(smtp_server, smtp_config, monkeypatch):
    monkeypatch.setattr(tasks, "task_time_budget", lambda: 1.0)
    (row,) = queue()
    Notification.objects.filter(pk=row.pk).update(
        status=Status.RETRYING, next_attempt_at=timezone.now() + timedelta(seconds=30)
    )
    tasks.dispatch_task()
    assert len(queued_dispatch_tasks()) == 1  # a follow-up will wait for the retry
    assert fresh(row).status == Status.RETRYING


def test_a_task_leaves_a_far_due_time_to_the_sweep(smtp_server, smtp_config, monkeypatch):
    monkeypatch.setattr(tasks, "task_time_budget", lambda: 1.0)
    (row,) = queue()
    Notification.objects.filter(pk=row.pk).update(
        status=Status.RETRYING, next_attempt_at=timezone.now() + timedelta(hours=2)
    )
    tasks.dispatch_task()
    assert queued_dispatch_tasks() == []


# --- a clean installation: migrate and qcluster, nothing else ----------------------------------------


@pytest.mark.slow
def test_after_only_migrate_a_real_qcluster_retries_a_transient_failure(transactional_db, smtp_server, tmp_path):
    """Another database, prepared only by ``migrate``; configured and fed as an administrator
    and a site would (the configuration file, a site key, the API); the worker is a real
    ``qcluster``. The first attempt is deferred (451), the retry delivers it."""
    postgres = database_url().startswith("postgres")
    if postgres:
        url = fresh_postgres_database(database_url(), "clean")  # migrated by the helper
    else:
        url = f"sqlite:///{tmp_path / 'clean.sqlite3'}"
        manage_output("migrate", "--noinput", "-v0", database=url)
    config = {
        "smtp": {
            "host": "127.0.0.1",
            "port": smtp_server.port,
            "security": "none",
            "from_address": "outbox@example.com",
            "timeout_seconds": 5,
        },
        "policies": {"email": {"strategy": "fixed", "interval_seconds": 2}},
        "lists": [{"name": "Operators", "email": ["op1@example.com"]}],
        "sites": [{"site_id": "plant-a", "name": "Plant A"}],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    manage_output("outbox_config", "import", str(tmp_path / "config.json"), database=url)
    key = manage_output("create_site_key", "plant-a", database=url).strip().splitlines()[-1]
    smtp_server.behave("fail_first")
    worker = manage("qcluster", database=url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Central(database=url, workers=1, OUTBOX_DISPATCH_TRIGGER="true") as central:
            notification_id = "8d2f4c1e-0b7a-4c55-9a7e-2d3f1e0c9b11"
            response = requests.post(
                f"{central.url}/api/v1/notifications/",
                json={
                    "notification_id": notification_id,
                    "list_name": "Operators",
                    "subject": "Pump 3 tripped",
                    "body": "Overcurrent.",
                },
                headers={"Authorization": f"Api-Key {key}"},
                timeout=10,
            )
            assert response.status_code == 201, response.text
            smtp_server.wait_for(1, timeout=60)
            record = {}

            def delivered() -> bool:
                record.update(
                    requests.get(
                        f"{central.url}/api/v1/notifications/{notification_id}/",
                        headers={"Authorization": f"Api-Key {key}"},
                        timeout=10,
                    ).json()
                )
                return record["status"] == "Delivered"

            poll(delivered, timeout=20, interval=0.2, message="the retried notification was not recorded Delivered")
    finally:
        stop(worker, timeout=30)
        if postgres:
            drop_postgres_database(url)
    assert smtp_server.deferred == {notification_id: 1}  # the first attempt was deferred …
    assert smtp_server.count_by_notification_id() == {notification_id: 1}  # … the retry delivered it once
    assert record["retry_count"] == 1
