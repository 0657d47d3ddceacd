"""The worker's django-q2 tasks. Only worker processes import this module (it imports the
dispatcher); web processes queue the tasks by dotted path through notifications.trigger.

* ``dispatch_task`` runs a time-boxed dispatch pass, then — if it is the one worker waiting
  for due times — sleeps until the next retry is due and runs a pass then, within the same
  time box. It is queued right after ingest commits and after operator actions (low latency),
  by the every-minute sweep schedule (the safety net: expired leases, lost triggers), by a pass
  whose claim finds more due than it takes (so that idle workers join a backlog at once), and
  by itself when work remains or a due time comes before the sweep could see it. A task asked
  for through the trigger carries its request's token and clears the request as it starts.
* ``purge_task`` runs the daily retention purge, time-boxed like a dispatch pass; while
  expired rows remain it queues itself again, so a purge longer than a task (the first one
  after an upgrade, a shorter retention) goes on in task-sized parts instead of being killed.
"""

from datetime import timedelta

from django_q.conf import Conf
from django_q.tasks import async_task

from notifications.clock import database_now
from notifications.dispatch.claim import worker_id_new
from notifications.dispatch.runner import dispatch_pass, dispatcher_process_settle
from notifications.dispatch.wait import dispatch_wait
from notifications.purge import notifications_purge
from notifications.schedules import PURGE_TASK
from notifications.trigger import dispatch_enqueue, dispatch_request_started
from notifications.workers import worker_process_record

# A due time nearer than this when a task ends gets a follow-up task to wait for it; a later
# one is left to a sweep (which runs every minute, sometimes half a minute late), whose task
# will be within this horizon of it.
WAKE_HORIZON_SECONDS = 150


def task_time_budget() -> float:
    """Seconds a task may keep working (a dispatch task claiming and waiting, a purge task
    deleting batches): half the task timeout, so that deliveries already started (each
    bounded by the SMTP timeout) finish well before django-q2 would kill the task — and the
    task always ends before its broker lease (``retry``)."""
    return max(1.0, Conf.TIMEOUT / 2 if Conf.TIMEOUT else 45.0)


def dispatch_task(request: str = "") -> str:
    """One time-boxed dispatch pass, then waiting for due times within the same budget. Queues
    a follow-up when rows are still due at the end, or when the next due time is near; asks
    for another task as soon as a claim finds a backlog. ``request``: the token of the trigger's
    request this task answers (empty for the sweep schedule's tasks)."""
    dispatcher_process_settle()  # a worker process's first task: its start-up is done
    if request:
        dispatch_request_started(token=request)
    name = "dispatch" if request else "dispatch sweep"
    worker_process_record(action=f"{name}: started", busy=True)
    report = "stopped by an error (see the failed tasks)"
    try:
        report = _dispatch_run()
    finally:
        worker_process_record(action=f"{name}: {report}")
    return report


def _dispatch_run() -> str:
    worker_id = worker_id_new("q")
    budget = task_time_budget()
    report = dispatch_pass(worker_id=worker_id, time_budget=budget, backlog=dispatch_enqueue)
    if report.more_due:
        dispatch_enqueue()
        return str(report)
    waited = dispatch_wait(worker_id=worker_id, time_budget=budget - report.seconds, backlog=dispatch_enqueue)
    near = waited.next_wake is not None and waited.next_wake <= database_now() + timedelta(seconds=WAKE_HORIZON_SECONDS)
    if waited.more_due or (waited.held and near):
        dispatch_enqueue()
    return "; ".join([str(report), *(f"at a due time: {passed}" for passed in waited.passes)])


def purge_task() -> str:
    """The retention purge within the task's time budget; queues a follow-up purge task when
    expired rows remain. Returns its report as text (kept in django-q2's task result)."""
    worker_process_record(action="retention purge: started", busy=True)
    outcome = "stopped by an error (see the failed tasks)"
    try:
        report = notifications_purge(time_budget=task_time_budget())
        if report.more:
            async_task(PURGE_TASK, task_name="purge")
        outcome = str(report)
    finally:
        worker_process_record(action=f"retention purge: {outcome}")
    return outcome
