"""The coalesced dispatch trigger: what ingest calls once notifications are committed, and how a
dispatch pass that finds a backlog asks other workers to join it.

Web processes import this module and nothing of the worker: it only queues django-q2 tasks
by their dotted path. ``dispatch_request()`` must cost the request nothing and must not queue
one broker task per notification: it only sets a flag for a background thread of this
process, which, at most once per ``TRIGGER_DEBOUNCE`` seconds, calls :func:`dispatch_enqueue`.

**The request state.** :func:`dispatch_enqueue` queues a dispatch task only when no task it
asked for is waiting. That state is our own: one row (``DispatchRequest``) that a conditional
update sets before the task is queued (the task carries the request's token) and that the task
clears when it starts (:func:`dispatch_request_started`). A waiting task sees every row
committed before it starts, so a burst of 1,000 notifications, or many passes finding a
backlog at once, queue one task, however many processes ask.

A request whose task has not started within ``REQUEST_START_SECONDS`` may be replaced by a new
one while some worker process is idle (as the worker heartbeat says: notifications.workers),
and each replacement in a row waits twice as long (up to ``REQUEST_START_MAX_SECONDS``)
before it may be replaced in turn. A task starts within a fraction of a second when a worker
is free; one that does not was taken by a django-q2 cluster whose task processes are all busy
— each cluster's "pusher" takes tasks from the broker ahead of its workers — while another
cluster's processes may be idle, or it was lost (a Redis restart, a worker killed as it took
it). Replacing it lets the idle ones join. While every worker process is busy a request is
not replaced (nobody could take the new one either) until ``REQUEST_LOST_SECONDS``, the bound
for a lost task; so the tasks asked for while every worker is busy stay a handful, never a
storm, and each later finds the backlog (or nothing) and ends.

The row lives in the database whichever broker carries the tasks: a dispatch task can do
nothing without the database, so its request state there adds no dependency, and there is one
way of keeping it for both brokers.
"""

import logging
import os
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django_q.tasks import async_task

from notifications.clock import database_now
from notifications.models import DispatchRequest
from notifications.workers import workers_idle

logger = logging.getLogger(__name__)

# The worker's task, by the dotted path stored in the broker and in schedules: it must not move.
DISPATCH_TASK = "notifications.tasks.dispatch_task"
TRIGGER_DEBOUNCE = 0.05  # seconds between two enqueue checks of one process
TRIGGER_IDLE_CLOSE = 2.0  # the trigger thread closes its database connection when idle this long
# A requested task normally starts within a poll of the broker (0.2 s); one that has not
# started after this may be replaced while a worker process is idle, after twice as long the
# next time, and so on up to the maximum.
REQUEST_START_SECONDS = 0.5
REQUEST_START_MAX_SECONDS = 8.0
# Whatever the workers say, a request not started after this is taken for lost.
REQUEST_LOST_SECONDS = 60.0


def _replace_after(now: datetime, reissued: int) -> datetime:
    seconds = min(REQUEST_START_SECONDS * 2**reissued, REQUEST_START_MAX_SECONDS)
    return now + timedelta(seconds=seconds)


def dispatch_request_open(*, token: str) -> bool:
    """Record a dispatch request named ``token`` unless one is waiting that may not be replaced
    yet; True when this one was recorded (its task is then to be queued by the caller)."""
    now = database_now()
    fields = ("token", "requested_at", "replace_after", "reissued")
    current = DispatchRequest.objects.filter(pk=DispatchRequest.SINGLETON_PK).values(*fields).first()
    if current is None:
        try:
            with transaction.atomic():
                DispatchRequest.objects.create(
                    pk=DispatchRequest.SINGLETON_PK, token=token, requested_at=now, replace_after=_replace_after(now, 0)
                )
        except IntegrityError:
            return False  # another process recorded one just now
        return True
    waiting = current["requested_at"] is not None
    if waiting and not _replaceable(current, now=now):
        return False
    reissued = current["reissued"] + 1 if waiting else 0
    # Only if nobody changed it since it was read: of two processes, one records its request.
    return bool(
        DispatchRequest.objects.filter(
            pk=DispatchRequest.SINGLETON_PK, token=current["token"], requested_at=current["requested_at"]
        ).update(token=token, requested_at=now, replace_after=_replace_after(now, reissued), reissued=reissued)
    )


def _replaceable(request: dict[str, Any], *, now: datetime) -> bool:
    """A waiting request may give way to a new one: lost, or not started in time while some
    worker process is idle."""
    if now - request["requested_at"] >= timedelta(seconds=REQUEST_LOST_SECONDS):
        return True
    return request["replace_after"] <= now and workers_idle()


def dispatch_request_started(*, token: str) -> bool:
    """A task of the request ``token`` starts: clear the request (unless a newer one replaced
    it). True if it was the waiting one."""
    return bool(
        DispatchRequest.objects.filter(pk=DispatchRequest.SINGLETON_PK, token=token).update(
            token="", requested_at=None, replace_after=None, reissued=0
        )
    )


def dispatch_enqueue() -> bool:
    """Queue a dispatch task unless one asked for is waiting; True if one was queued."""
    token = uuid.uuid4().hex
    if not dispatch_request_open(token=token):
        return False
    try:
        async_task(DISPATCH_TASK, request=token, task_name="dispatch")
    except BaseException:
        dispatch_request_started(token=token)  # nothing was queued: the next request may try
        raise
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
