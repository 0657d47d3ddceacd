"""Waiting for the next due time (docs/architecture.md, "Timing"): one worker at a time holds
the waiting role and runs a pass when a row falls due, so that a retry is attempted when it is
due rather than at the next sweep.
"""

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from notifications.clock import database_now
from notifications.dispatch.claim import dispatch_wake_at
from notifications.dispatch.runner import PassReport, dispatch_pass
from notifications.models import DispatchTimer

# How often a waiting worker looks again for an earlier due time (an operator's Retry now, a
# probe that became possible); a due time it knows of is slept to exactly.
WAKE_POLL_SECONDS = 1.0
# After a pass that found nothing to claim at a wake time (rows another worker took first).
IDLE_PAUSE_SECONDS = 0.1


def dispatch_timer_take(*, holder: str, seconds: float) -> bool:
    """Become (or stay) the one worker that waits for due times, for ``seconds``; False while
    another holds it. A lease: a waiter that dies frees it when its time is up."""
    now = database_now()
    until = now + timedelta(seconds=seconds)
    free = Q(until__isnull=True) | Q(until__lt=now) | Q(holder=holder)
    if DispatchTimer.objects.filter(free, pk=DispatchTimer.SINGLETON_PK).update(holder=holder[:64], until=until):
        return True
    try:
        with transaction.atomic():
            DispatchTimer.objects.create(pk=DispatchTimer.SINGLETON_PK, holder=holder[:64], until=until)
    except IntegrityError:
        return False  # it exists and someone else holds it
    return True


def dispatch_timer_release(*, holder: str) -> None:
    """Give the waiting role back, if ``holder`` has it."""
    DispatchTimer.objects.filter(pk=DispatchTimer.SINGLETON_PK, holder=holder[:64]).update(holder="", until=None)


@dataclass
class WaitReport:
    """What :func:`dispatch_wait` did: ``held`` the waiting role (else another worker waits),
    the passes it ran at wake times, and ``next_wake`` (when a claim could next take a row,
    as known when it stopped; None when nothing waits)."""

    held: bool = False
    passes: list[PassReport] = field(default_factory=list)
    next_wake: datetime | None = None
    more_due: bool = False


def dispatch_wait(
    *, worker_id: str, time_budget: float, stop: threading.Event | None = None, **pass_options: Any
) -> WaitReport:
    """Wait for due times for at most ``time_budget`` seconds and run a pass at each, so that a
    retry is attempted when it is due rather than at the next sweep. Only one worker waits at
    a time (:func:`dispatch_timer_take`); the others return at once (``held`` False).

    Returns when nothing waits any more, when the next wake time is beyond the budget, when
    the budget is spent or ``stop`` is set. ``pass_options`` go to :func:`dispatch_pass`.
    """
    stop = stop or threading.Event()
    report = WaitReport()
    deadline = time.monotonic() + time_budget
    if time_budget <= 0 or not dispatch_timer_take(holder=worker_id, seconds=time_budget + 5):
        report.next_wake = dispatch_wake_at() if time_budget <= 0 else None
        return report
    report.held = True
    try:
        while not stop.is_set():
            now = database_now()
            report.next_wake = dispatch_wake_at(now=now)
            left = deadline - time.monotonic()
            if report.next_wake is None or left <= 0:
                break
            until_wake = (report.next_wake - now).total_seconds()
            if until_wake > left:
                break
            if until_wake > 0:
                stop.wait(min(until_wake, WAKE_POLL_SECONDS))
                continue
            passed = dispatch_pass(worker_id=worker_id, time_budget=left, stop=stop, **pass_options)
            report.passes.append(passed)
            if passed.more_due:
                report.more_due = True
                break
            if passed.claimed == 0:
                stop.wait(IDLE_PAUSE_SECONDS)
    finally:
        dispatch_timer_release(holder=worker_id)
    return report
