"""The site's local buffer: one SQLite table of notifications central does not have yet.

Durability rule: a row is on disk (WAL journal, ``synchronous=FULL``) before :meth:`Buffer.insert`
returns, and it leaves the table only when central has acknowledged it (or an operator discards
it). Every thread gets its own connection (and a forked child process opens its own), so any
number of script threads and processes may write at once; SQLite's busy timeout serialises them.

Timestamps are stored as fixed-width ISO-8601 UTC text (``2026-11-21T10:00:00.000000Z``) so
that string order is time order and an operator can read the file with the ``sqlite3`` shell.
"""

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

FORWARDING = "forwarding"
PARKED = "parked"

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox_buffer (
    notification_id TEXT PRIMARY KEY,
    payload         TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    retry_count     INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    next_attempt_at TEXT NOT NULL,
    last_attempt_at TEXT,
    last_error      TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL DEFAULT 'forwarding' CHECK (status IN ('forwarding', 'parked'))
);
CREATE INDEX IF NOT EXISTS outbox_buffer_due ON outbox_buffer (status, next_attempt_at);
"""

# SQLite caps the number of bound parameters per statement; stay well below it.
_CHUNK = 500


def iso_utc(moment):
    """A datetime as fixed-width ISO-8601 UTC text with a trailing ``Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_now():
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class BufferedRow:
    """One row of the buffer, as read."""

    notification_id: str
    payload: str
    created_at: str
    retry_count: int
    next_attempt_at: str
    last_attempt_at: str | None
    last_error: str
    status: str


def _chunks(items, size=_CHUNK):
    items = list(items)
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Buffer:
    """The SQLite buffer file at ``path`` (created with its table on first use)."""

    def __init__(self, path, *, busy_timeout=30.0):
        self.path = os.fspath(path)
        self.busy_timeout = float(busy_timeout)
        self._local = threading.local()
        self._connections = []
        self._connections_lock = threading.Lock()
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._create_schema()

    # --- connections ------------------------------------------------------------------------

    def _connection(self):
        """This thread's connection (a new one after a fork: a SQLite handle must not cross it)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None and self._local.pid == os.getpid():
            return connection
        connection = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        connection.row_factory = sqlite3.Row
        connection.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        # FULL: the WAL is fsynced at every commit, so a returned send survives a power cut,
        # not only a process kill.
        connection.execute("PRAGMA synchronous = FULL")
        self._local.connection = connection
        self._local.pid = os.getpid()
        with self._connections_lock:
            self._connections.append(connection)
        return connection

    def close(self):
        """Close every connection this object opened in this process."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.close()
            except sqlite3.Error:  # pragma: no cover - closing is best effort
                pass
        self._local = threading.local()

    def _write(self, work):
        """Run ``work(connection)`` in one ``BEGIN IMMEDIATE`` transaction and return its result."""
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            result = work(connection)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return result

    def _create_schema(self):
        connection = self._connection()
        # Switching to WAL needs a moment of exclusive access; when many processes open a new
        # buffer at once some are told "locked" without the busy handler, so retry briefly.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise sqlite3.OperationalError(f"could not switch {self.path} to WAL (mode is {mode})")
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self._write(lambda c: [c.execute(s) for s in _SCHEMA.split(";") if s.strip()])
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # --- writes -----------------------------------------------------------------------------

    def insert(self, *, notification_id, payload, created_at):
        """Durably add one row, due at once. Returns when the row is committed to disk."""
        self._connection().execute(
            "INSERT INTO outbox_buffer (notification_id, payload, created_at, next_attempt_at, status)"
            " VALUES (?, ?, ?, ?, 'forwarding')",
            (notification_id, payload, created_at, created_at),
        )

    def insert_many(self, rows):
        """Add many ``(notification_id, payload, created_at)`` rows in one transaction (bench fill)."""

        def work(connection):
            connection.executemany(
                "INSERT INTO outbox_buffer (notification_id, payload, created_at, next_attempt_at, status)"
                " VALUES (?, ?, ?, ?, 'forwarding')",
                ((nid, payload, created, created) for nid, payload, created in rows),
            )

        self._write(work)

    def delete(self, notification_ids):
        """Remove rows central has acknowledged (whatever their status). Returns how many went."""
        ids = list(notification_ids)
        if not ids:
            return 0

        def work(connection):
            removed = 0
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                removed += connection.execute(
                    f"DELETE FROM outbox_buffer WHERE notification_id IN ({marks})", chunk
                ).rowcount
            return removed

        return self._write(work)

    def park(self, errors, *, now):
        """Park forwarding rows: ``errors`` maps notification id to the reason. Returns how many."""
        if not errors:
            return 0

        def work(connection):
            parked = 0
            for notification_id, error in errors.items():
                parked += connection.execute(
                    "UPDATE outbox_buffer SET status = 'parked', last_error = ?, last_attempt_at = ?"
                    " WHERE notification_id = ? AND status = 'forwarding'",
                    (error, now, notification_id),
                ).rowcount
            return parked

        return self._write(work)

    def record_transient_failure(self, notification_ids, *, error, now, next_attempt_at, max_retries):
        """Count one failed attempt on each forwarding row; park rows whose budget is spent.

        ``max_retries`` 0 means retry forever. Only rows still ``forwarding`` are touched, so
        an operator action that won a race is never overwritten. Returns
        ``(retrying, parked)`` counts.
        """
        ids = list(notification_ids)
        if not ids:
            return 0, 0
        exhausted = f"Retries exhausted after {max_retries} attempts; last error: {error}"

        def work(connection):
            retrying = parked = 0
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                statuses = connection.execute(
                    f"""
                    UPDATE outbox_buffer SET
                        retry_count = retry_count + 1,
                        last_attempt_at = ?,
                        next_attempt_at = ?,
                        status = CASE WHEN ? > 0 AND retry_count + 1 >= ? THEN 'parked' ELSE 'forwarding' END,
                        last_error = CASE WHEN ? > 0 AND retry_count + 1 >= ? THEN ? ELSE ? END
                    WHERE status = 'forwarding' AND notification_id IN ({marks})
                    RETURNING status
                    """,
                    (now, next_attempt_at, max_retries, max_retries, max_retries, max_retries, exhausted, error,
                     *chunk),
                ).fetchall()  # fmt: skip
                for (status,) in statuses:
                    if status == PARKED:
                        parked += 1
                    else:
                        retrying += 1
            return retrying, parked

        return self._write(work)

    def retry(self, notification_id, *, now):
        """Parked → forwarding, retry count reset, due at once. True if the row was parked."""
        cursor = self._connection().execute(
            "UPDATE outbox_buffer SET status = 'forwarding', retry_count = 0, next_attempt_at = ?"
            " WHERE notification_id = ? AND status = 'parked'",
            (now, notification_id),
        )
        return cursor.rowcount == 1

    def discard(self, notification_id):
        """Delete a parked row. Returns the row as it was, or None if no parked row had that id."""

        def work(connection):
            row = connection.execute(
                "SELECT * FROM outbox_buffer WHERE notification_id = ? AND status = 'parked'", (notification_id,)
            ).fetchone()
            if row is None:
                return None
            connection.execute("DELETE FROM outbox_buffer WHERE notification_id = ?", (notification_id,))
            return BufferedRow(**dict(row))

        return self._write(work)

    # --- reads ------------------------------------------------------------------------------

    def due(self, *, now, limit):
        """Up to ``limit`` forwarding rows whose next attempt is at or before ``now``, oldest first."""
        rows = self._connection().execute(
            "SELECT * FROM outbox_buffer WHERE status = 'forwarding' AND next_attempt_at <= ?"
            " ORDER BY next_attempt_at, created_at LIMIT ?",
            (now, limit),
        ).fetchall()
        return [BufferedRow(**dict(row)) for row in rows]

    def get(self, notification_id):
        row = self._connection().execute(
            "SELECT * FROM outbox_buffer WHERE notification_id = ?", (notification_id,)
        ).fetchone()
        return None if row is None else BufferedRow(**dict(row))

    def parked(self):
        rows = self._connection().execute(
            "SELECT * FROM outbox_buffer WHERE status = 'parked' ORDER BY created_at"
        ).fetchall()
        return [BufferedRow(**dict(row)) for row in rows]

    def counts(self):
        """``{"forwarding": n, "parked": m}``."""
        counts = {FORWARDING: 0, PARKED: 0}
        for status, count in self._connection().execute(
            "SELECT status, COUNT(*) FROM outbox_buffer GROUP BY status"
        ):
            counts[status] = count
        return counts
