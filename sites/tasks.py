"""The worker's django-q2 task for sites: judging the watchdogs (sites.watchdogs), queued every
minute by the schedule "outbox: watchdogs" (notifications.schedules)."""

from sites.watchdogs import watchdogs_evaluate


def watchdogs_task() -> str:
    """Judge every watchdog once; returns what was raised, as text (kept in django-q2's task
    result)."""
    return str(watchdogs_evaluate())
