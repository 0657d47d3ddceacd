"""The worker heartbeat: every worker process records what it last ran; /metrics, the system
check and the console say when no worker has run for two minutes."""

import os
import socket
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from notifications import metrics, tasks
from notifications.checks import check_workers_running
from notifications.models import WorkerProcess
from notifications.workers import WORKER_FORGET_AFTER, worker_process_record, workers_last_seen
from tests.dispatch.conftest import queue
from tests.dispatch.test_worker import make_operators
from tests.observability.test_metrics import scrape

LAST_SEEN = ("outbox_worker_last_seen_seconds", ())


def seen_ago(seconds: float) -> None:
    """Every worker process's last activity moved ``seconds`` into the past."""
    for row in WorkerProcess.objects.all():
        WorkerProcess.objects.filter(pk=row.pk).update(last_seen_at=row.last_seen_at - timedelta(seconds=seconds))


@pytest.fixture(autouse=True)
def _metrics_open(settings):
    settings.OUTBOX_METRICS_TOKEN = ""
    settings.OUTBOX_METRICS_CACHE_SECONDS = 0
    metrics.kpi_cache.clear()


def test_a_dispatch_task_records_its_process_and_what_it_did(db, smtp_server, smtp_config):
    make_operators()
    queue(2)
    tasks.dispatch_task()
    row = WorkerProcess.objects.get()
    assert (row.host, row.pid) == (socket.gethostname(), os.getpid())
    assert row.last_action.startswith("dispatch sweep: claimed 2, delivered 2")
    assert row.started_at <= row.last_seen_at


def test_a_requested_task_and_a_purge_task_say_what_they_were(db, smtp_config):
    tasks.dispatch_task(request="0" * 32)
    assert WorkerProcess.objects.get().last_action.startswith("dispatch: claimed 0")
    tasks.purge_task()
    assert WorkerProcess.objects.get().last_action.startswith("retention purge: ")


def test_the_gauge_counts_the_seconds_since_any_worker_last_ran(db):
    assert scrape()[LAST_SEEN] == float("inf")  # no worker has ever run
    worker_process_record(action="dispatch: claimed 0")
    assert scrape()[LAST_SEEN] < 5
    seen_ago(300)
    assert 300 <= scrape()[LAST_SEEN] < 305


def test_the_gauge_follows_the_most_recent_of_many_processes(db):
    worker_process_record(action="dispatch: claimed 0")
    seen_ago(600)
    mine = WorkerProcess.objects.get()
    WorkerProcess.objects.create(
        host="worker-2",
        pid=7,
        cluster="outbox",
        started_at=mine.started_at,
        last_seen_at=mine.last_seen_at + timedelta(seconds=540),
        last_action="dispatch sweep",
    )
    assert 60 <= scrape()[LAST_SEEN] < 65
    last = workers_last_seen()
    assert last is not None and last.host == "worker-2"


def test_the_system_check_warns_when_no_worker_has_run_for_two_minutes(db):
    (never,) = check_workers_running(databases=["default"])
    assert never.id == "outbox.W004" and "No worker has run yet" in never.msg
    worker_process_record(action="dispatch sweep: claimed 0")
    assert check_workers_running(databases=["default"]) == []
    seen_ago(119)
    assert check_workers_running(databases=["default"]) == []
    seen_ago(2)
    (silent,) = check_workers_running(databases=["default"])
    assert silent.id == "outbox.W004"
    assert "No worker has run for 2 minutes" in silent.msg and socket.gethostname() in silent.msg
    assert "dispatch sweep: claimed 0" in silent.msg
    with pytest.raises(SystemCheckError, match=r"outbox\.W004"):
        call_command("check", "--database", "default", "--fail-level", "WARNING")
    call_command("check", "--fail-level", "WARNING")  # without the database: not checked


def test_a_new_worker_process_forgets_processes_not_seen_for_a_day(db):
    worker_process_record(action="dispatch: claimed 0")
    WorkerProcess.objects.update(pid=1)  # the process that wrote it is gone
    seen_ago(WORKER_FORGET_AFTER.total_seconds() + 60)
    worker_process_record(action="started, waiting for tasks", started=True)
    assert list(WorkerProcess.objects.values_list("pid", flat=True)) == [os.getpid()]


def test_a_process_that_records_again_keeps_one_row(db):
    for action in ("started, waiting for tasks", "dispatch: started", "dispatch: claimed 0"):
        worker_process_record(action=action)
    assert WorkerProcess.objects.get().last_action == "dispatch: claimed 0"


def test_a_task_marks_its_process_busy_until_it_ends(db, smtp_config, monkeypatch):
    seen: list[bool] = []

    def run() -> str:  # the task's work, replaced to look at the process's row while it runs
        seen.append(WorkerProcess.objects.get().busy)
        return "done"

    monkeypatch.setattr(tasks, "_dispatch_run", run)
    tasks.dispatch_task()
    assert seen == [True]
    row = WorkerProcess.objects.get()
    assert row.busy is False and row.last_action == "dispatch sweep: done"
