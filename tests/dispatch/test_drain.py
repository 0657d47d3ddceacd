"""Every worker drains a backlog: a pass whose claim is full asks for another dispatch task at
once, through the trigger's own request state (one row: asked for, not yet started), so idle
workers join without waiting for the pass to end, and requests never pile up."""

import subprocess
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django_q.models import OrmQ

from notifications import tasks, trigger
from notifications.clock import database_now
from notifications.models import DeliveryAttempt, DispatchRequest, Notification, WorkerProcess
from notifications.workers import worker_process_record
from tests.dispatch.conftest import configure_smtp, queue, run_pass
from tests.dispatch.test_worker import make_operators, queued_dispatch_requests, queued_dispatch_tasks
from tests.support.processes import manage, poll, stop

Status = Notification.Status


def waiting_request() -> DispatchRequest:
    return DispatchRequest.objects.get(pk=DispatchRequest.SINGLETON_PK)


def age_request(seconds: float) -> None:
    """Move the waiting request ``seconds`` into the past, as if its task had not started."""
    DispatchRequest.objects.update(
        requested_at=F("requested_at") - timedelta(seconds=seconds),
        replace_after=F("replace_after") - timedelta(seconds=seconds),
    )


def request_start_seconds(request: DispatchRequest) -> float:
    """How long the request may wait for its task before it may be replaced."""
    assert request.requested_at is not None and request.replace_after is not None
    return (request.replace_after - request.requested_at).total_seconds()


# --- the request state --------------------------------------------------------------------------


def test_a_request_is_recorded_before_its_task_is_queued_and_names_it(db):
    assert trigger.dispatch_enqueue() is True
    request = waiting_request()
    assert queued_dispatch_requests() == [request.token]
    assert request.requested_at is not None and request.requested_at <= database_now()
    assert trigger.dispatch_enqueue() is False
    assert len(queued_dispatch_tasks()) == 1


def idle_worker_process() -> None:
    """A worker process of some cluster that has started and runs no task."""
    worker_process_record(action="started, waiting for tasks", started=True)


def test_a_request_whose_task_does_not_start_while_a_worker_is_idle_is_replaced_ever_later(db):
    """A task held by a cluster whose task processes are all busy must not keep idle ones out,
    nor may replacing it become a storm."""
    idle_worker_process()
    assert trigger.dispatch_enqueue() is True
    first = waiting_request()
    assert request_start_seconds(first) == trigger.REQUEST_START_SECONDS
    age_request(trigger.REQUEST_START_SECONDS - 0.2)
    assert trigger.dispatch_enqueue() is False  # not yet overdue
    age_request(0.3)
    assert trigger.dispatch_enqueue() is True
    second = waiting_request()
    assert second.token != first.token and second.reissued == 1
    assert request_start_seconds(second) == 2 * trigger.REQUEST_START_SECONDS
    for _ in range(10):
        age_request(trigger.REQUEST_START_MAX_SECONDS)
        assert trigger.dispatch_enqueue() is True
    assert request_start_seconds(waiting_request()) == trigger.REQUEST_START_MAX_SECONDS
    assert len(queued_dispatch_tasks()) == 12


def test_while_every_worker_process_is_busy_a_waiting_request_stays_until_taken_for_lost(db):
    worker_process_record(action="dispatch: started", busy=True)
    assert trigger.dispatch_enqueue() is True
    age_request(trigger.REQUEST_LOST_SECONDS - 1)
    assert trigger.dispatch_enqueue() is False  # nobody could take a second one either
    age_request(1)
    assert trigger.dispatch_enqueue() is True  # lost (a Redis restart, a killed worker)
    assert len(queued_dispatch_tasks()) == 2


def test_a_late_task_of_a_replaced_request_leaves_the_newer_request_waiting(db):
    idle_worker_process()
    assert trigger.dispatch_enqueue() is True
    age_request(trigger.REQUEST_START_SECONDS)
    assert trigger.dispatch_enqueue() is True
    old, new = queued_dispatch_requests()
    tasks.dispatch_task(request=old)
    assert waiting_request().token == new
    assert trigger.dispatch_enqueue() is False
    tasks.dispatch_task(request=new)
    assert waiting_request().requested_at is None and waiting_request().reissued == 0
    assert trigger.dispatch_enqueue() is True


def test_a_broker_that_refuses_the_task_leaves_no_request_behind(db, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")  # a broker outage cannot be produced with the ORM broker

    monkeypatch.setattr(trigger, "async_task", refuse)
    with pytest.raises(ConnectionError):
        trigger.dispatch_enqueue()
    assert waiting_request().requested_at is None
    monkeypatch.undo()
    assert trigger.dispatch_enqueue() is True


def test_the_sweep_task_leaves_a_waiting_request_alone(db, smtp_config):
    assert trigger.dispatch_enqueue() is True
    tasks.dispatch_task()  # the every-minute schedule's task carries no request
    assert waiting_request().requested_at is not None
    assert trigger.dispatch_enqueue() is False


# --- a pass that finds a backlog ------------------------------------------------------------------


def test_a_pass_whose_claim_is_full_asks_for_another_task_at_once_and_only_once(smtp_server, smtp_config):
    make_operators()
    queue(30)
    waiting_after_each_batch = []
    report = run_pass(
        batch_size=5,
        concurrency=2,
        backlog=trigger.dispatch_enqueue,
        progress=lambda _report: waiting_after_each_batch.append(len(queued_dispatch_tasks())),
    )
    assert report.delivered == 30
    assert waiting_after_each_batch[0] == 1  # asked while its first batch was delivered, not at the end
    assert len(queued_dispatch_tasks()) == 1  # many full claims, one waiting task


def test_a_pass_that_takes_everything_due_asks_for_no_other_task(smtp_server, smtp_config):
    make_operators()
    queue(3)
    report = run_pass(batch_size=5, backlog=trigger.dispatch_enqueue)
    assert report.delivered == 3
    assert not OrmQ.objects.exists()


def test_a_task_that_finds_nothing_due_asks_for_nothing(db, smtp_config):
    tasks.dispatch_task()
    assert not OrmQ.objects.exists()


def test_asking_for_help_that_fails_does_not_stop_the_pass(smtp_server, smtp_config):
    make_operators()
    queue(12)

    def broken() -> None:
        raise RuntimeError("broker unreachable")

    report = run_pass(batch_size=5, backlog=broken)
    assert report.delivered == 12 and smtp_server.count == 12


# --- real workers -------------------------------------------------------------------------------------


def deliveries_by_pid(ids: list[str]) -> Counter[int]:
    """Deliveries per worker process, from the attempts' worker ids (``q:<host>:<pid>:<pass>``)."""
    workers = DeliveryAttempt.objects.filter(notification_id__in=ids, outcome="success").values_list(
        "worker", flat=True
    )
    return Counter(int(worker.split(":")[2]) for worker in workers)


def backlog_drained_by_two_clusters(smtp_server, *, count: int, **broker: str) -> tuple[Counter[int], set[int]]:
    """Queue ``count`` rows, start two qclusters of two task processes each (4 deliveries at a
    time per process), wait until all four processes have started, ask for one dispatch task
    and let them drain the backlog. Returns the deliveries per process id and the process ids
    of the four task processes (from their heartbeats)."""
    configure_smtp(smtp_server)
    make_operators()
    smtp_server.behave("accept", delay_seconds=0.05)  # a relay's pace: one process alone takes a while
    ids = [str(row.pk) for row in queue(count)]
    cluster = broker.pop("OUTBOX_Q_CLUSTER_NAME", "outbox")
    env = {"OUTBOX_Q_WORKERS": "2", "OUTBOX_CONCURRENCY": "4", "OUTBOX_Q_CLUSTER_NAME": cluster, **broker}
    clusters = [manage("qcluster", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **env) for _ in range(2)]
    try:
        poll(
            lambda: WorkerProcess.objects.filter(cluster=cluster).count() == 4,
            timeout=60,
            message="the four task processes did not record their start",
        )
        trigger.dispatch_enqueue()  # one request, as one ingest would make
        poll(
            lambda: Notification.objects.filter(pk__in=ids, status=Status.DELIVERED).count() == count,
            timeout=120,
            message="the backlog was not drained",
        )
    finally:
        for process in clusters:
            stop(process, timeout=60)
    assert smtp_server.count_by_notification_id() == dict.fromkeys(ids, 1)
    pids = set(WorkerProcess.objects.filter(cluster=cluster).values_list("pid", flat=True))
    return deliveries_by_pid(ids), pids


@pytest.mark.slow
def test_every_task_process_of_two_qclusters_delivers_part_of_a_backlog(transactional_db, smtp_server):
    # Enough rows that the backlog outlasts the moment a busy machine takes to bring the last
    # task process in (800 were drained by three of four processes in one CI run).
    delivered, pids = backlog_drained_by_two_clusters(smtp_server, count=2400)
    assert set(delivered) == pids, f"deliveries per process {dict(delivered)}, task processes {sorted(pids)}"
    assert sum(delivered.values()) == 2400


@pytest.mark.parametrize("state", ["no row yet", "free row"])
def test_many_processes_asking_at_once_queue_one_task(transactional_db, state):
    """Web processes and passes ask concurrently, each on its own database connection: one
    request is recorded and one task queued, whether the row exists yet or not."""
    if state == "free row":
        DispatchRequest.objects.create(pk=DispatchRequest.SINGLETON_PK)
    start = threading.Barrier(8)

    def ask() -> bool:
        start.wait()
        try:
            return trigger.dispatch_enqueue()
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: ask(), range(8)))
    assert answers.count(True) == 1
    assert queued_dispatch_requests() == [waiting_request().token]
