"""The one clock scheduling decisions use: the database's.

Web and worker processes run on many machines whose clocks drift; the database is the one
place they all share. Due times, leases, ingest times, attempt times and KPI ages are all
measured on the database's clock so that a process whose clock is an hour off neither steals
live leases nor schedules rows into the future. SQLite is embedded, so there the process
clock is the database clock.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from notifications.db import database_now

__all__ = ["DatabaseClock", "database_clock", "database_now"]


@dataclass(frozen=True)
class DatabaseClock:
    """The database's clock as an offset from this process's clock, read once: a dispatch batch
    needs the time for every result, and one query per batch is enough."""

    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        """The database's current time, estimated without a query."""
        return timezone.now() + self.offset


def database_clock() -> DatabaseClock:
    """Read the database clock once (one query on PostgreSQL) and keep its offset."""
    return DatabaseClock(offset=database_now() - timezone.now())
