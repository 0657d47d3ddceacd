"""Worker tasks (django-q2) and the coalesced dispatch trigger.

* ``dispatch_task`` runs one time-boxed dispatch pass. It is queued right after ingest commits
  (low latency) and by the every-minute sweep schedule (retries that became due, leases that
  expired, triggers that were lost).
* ``purge_task`` runs the daily retention purge.
* ``dispatch_request()`` is what ingest calls after commit. It must cost the request nothing
  and must not queue one broker task per notification: it only sets a flag for a background
  thread of this process, which, at most once per ``TRIGGER_DEBOUNCE`` seconds, queues a
  dispatch task — unless one is already waiting in the broker, since a waiting task will see
  every row committed before it starts. So a burst of 1,000 notifications queues a handful
  of tasks, however many web processes share the load.
"""

import logging
import os
import threading
import time
from datetime import datetime, timedelta
from datetime import time as dt_time
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import BadSignature, SignedPackage
from django_q.tasks import async_task

from notifications.dispatch import dispatch_pass, worker_id_new
from notifications.purge import notifications_purge

logger = logging.getLogger(__name__)

DISPATCH_TASK = "notifications.tasks.dispatch_task"
PURGE_TASK = "notifications.tasks.purge_task"
TRIGGER_DEBOUNCE = 0.05  # seconds between two enqueue checks of one process
TRIGGER_IDLE_CLOSE = 2.0  # the trigger thread closes its database connection when idle this long


def task_time_budget():
    """Seconds a dispatch pass inside a task may keep claiming: half the task timeout, so that
    deliveries already started (each bounded by the SMTP timeout) finish well before django-q2
    would kill the task — and the task always ends before its broker lease (``retry``)."""
    return max(1.0, Conf.TIMEOUT / 2 if Conf.TIMEOUT else 45.0)


def dispatch_task():
    """One time-boxed dispatch pass; if rows are still due when time is up, queue a follow-up so
    a backlog keeps draining without waiting for the sweep."""
    report = dispatch_pass(worker_id=worker_id_new("q"), time_budget=task_time_budget())
    if report.more_due:
        dispatch_enqueue()
    return str(report)


def purge_task():
    return str(notifications_purge())


# --- the coalesced trigger --------------------------------------------------------------------


def dispatch_waiting():
    """True if a dispatch task is queued and not yet picked up by a worker.

    django-q2's ORM broker marks a task taken by moving its ``lock`` into the future; a task
    whose lock is in the past is waiting. Only waiting tasks (a handful) are decoded.
    """
    now = timezone.now()
    waiting = OrmQ.objects.using(Conf.ORM).filter(key=Conf.CLUSTER_NAME, lock__lte=now).values_list("payload", flat=True)
    for payload in waiting[:20]:
        try:
            if SignedPackage.loads(payload).get("func") == DISPATCH_TASK:
                return True
        except (BadSignature, Exception):  # a foreign or corrupt package is not ours
            continue
    return False


def dispatch_enqueue():
    """Queue a dispatch task unless one is already waiting; True if one was queued."""
    if dispatch_waiting():
        return False
    async_task(DISPATCH_TASK, task_name="dispatch")
    return True


class _Trigger:
    """One per process: a flag and a daemon thread that turns the flag into at most one
    enqueue check per debounce interval. Started lazily (and again after a fork)."""

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        self._pid = None

    def request(self):
        if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                    self._event = threading.Event()
                    self._thread = threading.Thread(target=self._run, name="dispatch-trigger", daemon=True)
                    self._pid = os.getpid()
                    self._thread.start()
        self._event.set()

    def _run(self):
        while True:
            if not self._event.wait(TRIGGER_IDLE_CLOSE):
                connection.close()  # idle: give the connection back
                continue
            self._event.clear()
            try:
                close_old_connections()
                dispatch_enqueue()
            except Exception:
                # The every-minute sweep delivers anything a lost trigger would have.
                logger.exception("could not queue a dispatch task")
                connection.close()
            time.sleep(TRIGGER_DEBOUNCE)


_trigger = _Trigger()


def dispatch_request():
    """Ask for a dispatch soon (call after the notifications are committed). Costs the caller
    no query; see the module docstring."""
    if getattr(settings, "OUTBOX_DISPATCH_TRIGGER", True):
        _trigger.request()


# --- schedules --------------------------------------------------------------------------------


def _next_daily(hour):
    now = timezone.now()
    run = datetime.combine(now.date(), dt_time(hour), tzinfo=dt_timezone.utc)
    return run if run > now else run + timedelta(days=1)


SCHEDULES = {
    # The sweeper: retries that became due, expired leases, lost triggers.
    "outbox: dispatch sweep": {"func": DISPATCH_TASK, "schedule_type": Schedule.MINUTES, "minutes": 1},
    "outbox: retention purge": {"func": PURGE_TASK, "schedule_type": Schedule.DAILY, "first_run_hour": 3},
}


def schedules_ensure():
    """Create or update the schedules declared above; idempotent (run at every deployment).
    Returns ``{name: "created" | "updated" | "unchanged"}``."""
    outcome = {}
    for name, spec in SCHEDULES.items():
        spec = dict(spec)
        first_run_hour = spec.pop("first_run_hour", None)
        wanted = {"func": spec["func"], "schedule_type": spec["schedule_type"], "minutes": spec.get("minutes"),
                  "repeats": -1}  # fmt: skip
        existing = Schedule.objects.filter(name=name).order_by("pk")
        schedule = existing.first()
        if schedule is None:
            next_run = _next_daily(first_run_hour) if first_run_hour is not None else timezone.now()
            Schedule.objects.create(name=name, next_run=next_run, **wanted)
            outcome[name] = "created"
            continue
        existing.exclude(pk=schedule.pk).delete()  # duplicates from an older, non-idempotent setup
        changed = [field for field, value in wanted.items() if getattr(schedule, field) != value]
        if changed:
            for field in changed:
                setattr(schedule, field, wanted[field])
            schedule.save(update_fields=changed)
        outcome[name] = "updated" if changed else "unchanged"
    return outcome
