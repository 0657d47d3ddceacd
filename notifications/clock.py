"""The one clock scheduling decisions use: the database's.

Web and worker processes run on many machines whose clocks drift; the database is the one
place they all share. Due times, leases, ingest times and KPI ages are all measured with
``database_now()`` so that a process whose clock is an hour off neither steals live leases
nor schedules rows into the future. SQLite is embedded, so there the process clock is the
database clock.
"""

from django.db import connection
from django.utils import timezone


def database_now():
    """The database server's current time (aware, UTC)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]
