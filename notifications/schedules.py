"""The worker's django-q2 schedules, declared once and registered idempotently.

* **dispatch sweep**, every minute: retries that became due, leases that expired, triggers
  that were lost.
* **retention purge**, daily at 03:00 UTC.
* **watchdogs**, every minute: the sites' watchdogs judged (sites.watchdogs), notifications
  raised for those that fell silent or ping again, and for sites that fell silent.

Both are created (or brought up to date) by every ``migrate`` — a ``post_migrate`` handler calls
:func:`schedules_ensure` — so a deployment needs no step of its own; ``setup_schedules`` does the
same by hand, and system check ``outbox.W001`` warns when one is missing.

Schedules name their tasks by dotted path; databases keep those paths, so they must not move.
"""

from datetime import UTC, datetime, timedelta
from datetime import time as dt_time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone
from django_q.models import Schedule

from notifications.trigger import DISPATCH_TASK

PURGE_TASK = "notifications.tasks.purge_task"
WATCHDOGS_TASK = "sites.tasks.watchdogs_task"

SCHEDULES: dict[str, dict[str, Any]] = {
    "outbox: dispatch sweep": {"func": DISPATCH_TASK, "schedule_type": Schedule.MINUTES, "minutes": 1},
    "outbox: retention purge": {"func": PURGE_TASK, "schedule_type": Schedule.DAILY, "first_run_hour": 3},
    "outbox: watchdogs": {"func": WATCHDOGS_TASK, "schedule_type": Schedule.MINUTES, "minutes": 1},
}


def schedule_functions_allowed() -> frozenset[str]:
    """The dotted paths a schedule may run: the outbox's own tasks, declared above. Nothing
    else may be scheduled from the console (notifications/admin/worker.py)."""
    return frozenset(spec["func"] for spec in SCHEDULES.values())


def _next_daily(hour: int) -> datetime:
    now = timezone.now()
    run = datetime.combine(now.date(), dt_time(hour), tzinfo=UTC)
    return run if run > now else run + timedelta(days=1)


def schedules_ensure() -> dict[str, str]:
    """Create or update the schedules declared above; idempotent (run at every deployment).
    Returns ``{name: "created" | "updated" | "unchanged"}``."""
    outcome = {}
    for name, declared in SCHEDULES.items():
        spec = dict(declared)
        first_run_hour = spec.pop("first_run_hour", None)
        wanted = {
            "func": spec["func"],
            "schedule_type": spec["schedule_type"],
            "minutes": spec.get("minutes"),
            "repeats": -1,
        }
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


def schedules_missing() -> list[str]:
    """The names of the declared schedules that do not exist in the database."""
    present = set(Schedule.objects.filter(name__in=list(SCHEDULES)).values_list("name", flat=True))
    return [name for name in SCHEDULES if name not in present]


def schedules_after_migrate(*, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """``post_migrate`` handler: ensure the schedules in the default database once django-q2's
    tables exist there (a partial ``migrate`` that has not created them yet is left alone)."""
    if using != DEFAULT_DB_ALIAS:
        return  # django-q2's ORM broker and schedules live in the default database
    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return
    schedules_ensure()
