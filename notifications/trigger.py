"""The coalesced dispatch trigger: what ingest calls once notifications are committed.

Web processes import this module and nothing of the worker: it only queues django-q2 tasks
by their dotted path. ``dispatch_request()`` must cost the request nothing and must not queue
one broker task per notification: it only sets a flag for a background thread of this
process, which, at most once per ``TRIGGER_DEBOUNCE`` seconds, queues a dispatch task —
unless one is already waiting in the broker, since a waiting task will see every row
committed before it starts. So a burst of 1,000 notifications queues a handful of tasks,
however many web processes share the load.
"""

import logging
import os
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

logger = logging.getLogger(__name__)

# The worker's task, by the dotted path stored in the broker and in schedules: it must not move.
DISPATCH_TASK = "notifications.tasks.dispatch_task"
TRIGGER_DEBOUNCE = 0.05  # seconds between two enqueue checks of one process
TRIGGER_IDLE_CLOSE = 2.0  # the trigger thread closes its database connection when idle this long


def dispatch_waiting() -> bool:
    """True if a dispatch task is queued and not yet picked up by a worker.

    django-q2's ORM broker marks a task taken by moving its ``lock`` into the future; a task
    whose lock is in the past is waiting. The Redis broker's list holds only waiting tasks
    (a worker pops the one it takes). Only waiting tasks (a handful) are decoded.
    """
    for payload in _waiting_payloads(limit=20):
        try:
            if SignedPackage.loads(payload).get("func") == DISPATCH_TASK:
                return True
        except Exception:  # noqa: BLE001 - a foreign or corrupt package (BadSignature, unpickling errors) is not ours
            continue
    return False


def _waiting_payloads(*, limit: int) -> list[Any]:
    """The first ``limit`` tasks waiting in the broker, as stored (signed packages)."""
    if Conf.ORM:
        waiting = OrmQ.objects.using(Conf.ORM).filter(key=Conf.CLUSTER_NAME, lock__lte=timezone.now())
        return list(waiting.values_list("payload", flat=True)[:limit])
    broker = _redis_broker()
    return list(broker.connection.lrange(broker.list_key, 0, limit - 1))


_brokers: dict[int, Any] = {}


def _redis_broker() -> Any:
    """This process's Redis broker (one connection pool per process: never shared across a fork)."""
    pid = os.getpid()
    if pid not in _brokers:
        _brokers.clear()
        _brokers[pid] = get_broker()
    return _brokers[pid]


def dispatch_enqueue() -> bool:
    """Queue a dispatch task unless one is already waiting; True if one was queued."""
    if dispatch_waiting():
        return False
    async_task(DISPATCH_TASK, task_name="dispatch")
    return True


class _Trigger:
    """One per process: a flag and a daemon thread that turns the flag into at most one
    enqueue check per debounce interval. Started lazily (and again after a fork)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def request(self) -> None:
        if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                    self._event = threading.Event()
                    self._thread = threading.Thread(target=self._run, name="dispatch-trigger", daemon=True)
                    self._pid = os.getpid()
                    self._thread.start()
        self._event.set()

    def _run(self) -> None:
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


def dispatch_request() -> None:
    """Ask for a dispatch soon (call after the notifications are committed). Costs the caller
    no query; see the module docstring."""
    if getattr(settings, "OUTBOX_DISPATCH_TRIGGER", True):
        _trigger.request()
