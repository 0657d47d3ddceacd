"""The worker heartbeat: each worker process records that it runs, so that a fleet whose
workers stopped is noticed (docs/operations.md, "Worker heartbeat").

A django-q2 task process records itself when it starts (django-q2's ``post_spawn`` signal),
and every dispatch task — the every-minute sweep included — and purge task records what it
did when it starts and when it ends: one row per process (host, pid, cluster name) with
``last_seen_at`` on the database clock. The sweep runs a task every minute on one of the
workers, so while any worker runs, some row is at most about a minute old.

Readers: the gauge ``outbox_worker_last_seen_seconds`` (notifications.metrics), system check
``outbox.W004`` (notifications.checks) and the console's warning (the dashboard and the
Notification Outbox page), all from :func:`workers_last_seen`.

Web processes import this module (the readers); it imports nothing of the worker.
"""

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import DurationField, ExpressionWrapper, Max
from django.db.models.functions import Now
from django_q.conf import Conf

from notifications.clock import database_now
from notifications.models import WorkerProcess

logger = logging.getLogger(__name__)

# No worker seen for this long is worth a warning: the sweep runs a task every minute, so a
# running fleet is never silent for two.
WORKER_SILENT_SECONDS = 120
# Rows of processes not seen for this long are removed when a new worker process starts: the
# table holds about the fleet, not every process ever started.
WORKER_FORGET_AFTER = timedelta(days=1)
ACTION_LENGTH = WorkerProcess._meta.get_field("last_action").max_length or 300


def worker_process_identity() -> tuple[str, int, str]:
    """This process as the heartbeat names it: host name, process id, django-q2 cluster name."""
    return socket.gethostname()[:255], os.getpid(), str(Conf.CLUSTER_NAME)[:100]


def worker_process_record(*, action: str, busy: bool = False, started: bool = False) -> bool:
    """Record that this worker process ran ``action`` now and whether it is ``busy`` (running a
    task) from now on (``started``: the process has just started). Best effort: a database
    that does not answer (or a table not migrated yet) is logged and never stops the task.
    True when recorded."""
    host, pid, cluster = worker_process_identity()
    action = action[:ACTION_LENGTH]
    try:
        now = database_now()
        changes: dict[str, object] = {"last_seen_at": now, "last_action": action, "busy": busy}
        if started:
            changes["started_at"] = now
        mine = WorkerProcess.objects.filter(host=host, pid=pid, cluster=cluster)
        if mine.update(**changes):
            return True
        try:
            with transaction.atomic():
                WorkerProcess.objects.create(host=host, pid=pid, cluster=cluster, **{"started_at": now, **changes})
        except IntegrityError:
            mine.update(**changes)  # another thread of this process created it meanwhile
        # A new process: forget those long gone (a pid of a process that ended is reused).
        WorkerProcess.objects.filter(last_seen_at__lt=now - WORKER_FORGET_AFTER).delete()
    except DatabaseError:
        logger.warning("could not record the worker heartbeat (%s)", action, exc_info=True)
        return False
    return True


def worker_process_spawned(**kwargs: object) -> None:
    """django-q2's ``post_spawn`` receiver: a task process of a cluster has started."""
    worker_process_record(action="started, waiting for tasks", started=True)


def workers_idle() -> bool:
    """Whether some worker process is idle (not running a task), as the processes last
    reported. A process that ended while idle still counts until it is forgotten: this only
    ever makes the trigger ask once more (notifications.trigger)."""
    return WorkerProcess.objects.filter(busy=False).exists()


@dataclass(frozen=True)
class WorkerSighting:
    """The most recent worker activity: which process, when, what it did, and how long ago
    (seconds, on the database clock)."""

    host: str
    pid: int
    cluster: str
    last_seen_at: datetime
    last_action: str
    seconds_ago: float


def workers_last_seen() -> WorkerSighting | None:
    """The most recent worker activity, or None when no worker process has ever recorded one."""
    latest = WorkerProcess.objects.order_by("-last_seen_at").first()
    if latest is None:
        return None
    ago = max(0.0, (database_now() - latest.last_seen_at).total_seconds())
    return WorkerSighting(
        host=latest.host,
        pid=latest.pid,
        cluster=latest.cluster,
        last_seen_at=latest.last_seen_at,
        last_action=latest.last_action,
        seconds_ago=ago,
    )


def workers_last_seen_seconds() -> float:
    """Seconds since the most recent activity of any worker process, on the database clock
    (one query); infinity when none has ever run."""
    latest = WorkerProcess.objects.aggregate(
        ago=ExpressionWrapper(Now() - Max("last_seen_at"), output_field=DurationField())
    )["ago"]
    return float("inf") if latest is None else max(0.0, latest.total_seconds())


@dataclass(frozen=True)
class WorkerSilence:
    """No worker has run for ``WORKER_SILENT_SECONDS``: the last one seen (None: never)."""

    last: WorkerSighting | None

    def __str__(self) -> str:
        if self.last is None:
            return "No worker has run yet: nothing delivers notifications until a `manage.py qcluster` runs."
        minutes = int(self.last.seconds_ago // 60)
        return (
            f"No worker has run for {minutes} minute{'s' if minutes != 1 else ''}: the last one seen was "
            f"{self.last.host} (pid {self.last.pid}, cluster {self.last.cluster}) at "
            f"{self.last.last_seen_at:%Y-%m-%d %H:%M:%S} UTC ({self.last.last_action}). "
            "Nothing delivers notifications until a `manage.py qcluster` runs."
        )


def workers_silence(*, after_seconds: float = WORKER_SILENT_SECONDS) -> WorkerSilence | None:
    """A :class:`WorkerSilence` when no worker process has run for ``after_seconds`` (or ever),
    else None."""
    last = workers_last_seen()
    if last is not None and last.seconds_ago < after_seconds:
        return None
    return WorkerSilence(last=last)
