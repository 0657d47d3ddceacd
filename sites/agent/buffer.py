"""The site's local buffer: one SQLite table of notifications central does not have yet.

Durability rule: a row is on disk (WAL journal, ``synchronous=FULL``) before :meth:`Buffer.insert`
returns, and it leaves the table only when central has acknowledged it (or an operator discards
it). Every thread gets its own connection (and a forked child process opens its own), so any
number of script threads and processes may write at once; SQLite's busy timeout serialises them.

Timestamps are stored as fixed-width ISO-8601 UTC text (``2026-11-21T10:00:00.000000Z``) so
that string order is time order and an operator can read the file with the ``sqlite3`` shell.

Runs on SQLite 3.26 and later. ``UPDATE … RETURNING`` (SQLite 3.35) is used where the library
has it; older libraries (RHEL 8 ships 3.26) take an equivalent count-then-update path inside the
same write transaction. ``OUTBOX_AGENT_SQLITE_NO_RETURNING=1`` forces that path (for tests).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

FORWARDING = "forwarding"
PARKED = "parked"

SCHEMA_VERSION = 2

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
CREATE TABLE IF NOT EXISTS outbox_parked_reports (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id TEXT NOT NULL UNIQUE,
    parked          INTEGER NOT NULL CHECK (parked IN (0, 1)),
    outcome         TEXT NOT NULL DEFAULT '',
    changed_at      TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS outbox_buffer_report_parked AFTER UPDATE OF status ON outbox_buffer
WHEN NEW.status = 'parked' AND OLD.status <> 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (NEW.notification_id, 1, '', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER IF NOT EXISTS outbox_buffer_report_retried AFTER UPDATE OF status ON outbox_buffer
WHEN OLD.status = 'parked' AND NEW.status <> 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (OLD.notification_id, 0, 'retried', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER IF NOT EXISTS outbox_buffer_report_discarded AFTER DELETE ON outbox_buffer
WHEN OLD.status = 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (OLD.notification_id, 0, 'discarded', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TABLE IF NOT EXISTS outbox_commands (
    command_id      TEXT PRIMARY KEY,
    action          TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    result          TEXT NOT NULL CHECK (result IN ('done', 'failed')),
    detail          TEXT NOT NULL DEFAULT '',
    executed_at     TEXT NOT NULL,
    acked_at        TEXT
);
CREATE TABLE IF NOT EXISTS outbox_agent_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# What version 2 adds to a version-1 file: rows that were already parked are reported too.
_UPGRADE_TO_2 = """
INSERT OR IGNORE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
SELECT notification_id, 1, '', strftime('%Y-%m-%dT%H:%M:%fZ', 'now') FROM outbox_buffer WHERE status = 'parked'
"""

# Executed commands are kept this long after central acknowledged them, so that a command
# central hands out again (its acknowledgement was lost) is recognised, not executed twice.
COMMAND_MEMORY_DAYS = 30

# SQLite caps the number of bound parameters per statement; stay well below it.
_CHUNK = 500

# The oldest SQLite the agent is tested against (RHEL 8), and the first with UPDATE … RETURNING.
MIN_SQLITE_VERSION = (3, 26, 0)
RETURNING_SQLITE_VERSION = (3, 35, 0)
ENV_NO_RETURNING = "OUTBOX_AGENT_SQLITE_NO_RETURNING"


def _statements(script: str) -> Iterator[str]:
    """The complete SQL statements of ``script`` (a trigger's body holds semicolons of its own).
    Run one by one because ``executescript`` would commit the surrounding transaction."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]}")


def iso_utc(moment: datetime) -> str:
    """A datetime as fixed-width ISO-8601 UTC text with a trailing ``Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def sqlite_has_returning() -> bool:
    """True when the linked SQLite library supports ``UPDATE … RETURNING`` (3.35+) and the
    fallback is not forced by ``OUTBOX_AGENT_SQLITE_NO_RETURNING``."""
    if os.environ.get(ENV_NO_RETURNING, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    return sqlite3.sqlite_version_info >= RETURNING_SQLITE_VERSION


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


@dataclass(frozen=True)
class ParkedReport:
    """A change of a row's parked state that central has not been told about yet.

    ``parked`` True: the row is parked now and ``row`` holds it; False: it left the parked
    state (``outcome`` ``retried`` or ``discarded``) and ``row`` is None.
    """

    report_id: int
    notification_id: str
    parked: bool
    outcome: str
    changed_at: str
    row: BufferedRow | None


@dataclass(frozen=True)
class CommandRecord:
    """An operator command from central as this site executed it."""

    command_id: str
    action: str
    notification_id: str
    result: str  # "done" or "failed"
    detail: str
    executed_at: str
    acked_at: str | None


COMMAND_ACTIONS = ("retry", "discard")


def _chunks(items: Iterable[str], size: int = _CHUNK) -> Iterator[list[str]]:
    listed = list(items)
    for start in range(0, len(listed), size):
        yield listed[start : start + size]


class Buffer:
    """The SQLite buffer file at ``path`` (created with its table on first use).

    ``use_returning`` None detects ``UPDATE … RETURNING`` support; False forces the fallback
    used on SQLite older than 3.35 (both paths give the same results).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        busy_timeout: float = 30.0,
        use_returning: bool | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.busy_timeout = float(busy_timeout)
        self.use_returning = sqlite_has_returning() if use_returning is None else bool(use_returning)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._create_schema()

    # --- connections ------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
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

    def close(self) -> None:
        """Close every connection this object opened in this process."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            with contextlib.suppress(sqlite3.Error):  # closing is best effort
                connection.close()
        self._local = threading.local()

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
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

    def _create_schema(self) -> None:
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

        def work(connection: sqlite3.Connection) -> None:
            (version,) = connection.execute("PRAGMA user_version").fetchone()
            if version >= SCHEMA_VERSION:
                return
            for statement in _statements(_SCHEMA):
                connection.execute(statement)
            if version < 2:
                connection.execute(_UPGRADE_TO_2)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._write(work)

    # --- writes -----------------------------------------------------------------------------

    def insert(self, *, notification_id: str, payload: str, created_at: str) -> None:
        """Durably add one row, due at once. Returns when the row is committed to disk."""
        self._connection().execute(
            "INSERT INTO outbox_buffer (notification_id, payload, created_at, next_attempt_at, status)"
            " VALUES (?, ?, ?, ?, 'forwarding')",
            (notification_id, payload, created_at, created_at),
        )

    def insert_many(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Add many ``(notification_id, payload, created_at)`` rows in one transaction (bench fill)."""

        def work(connection: sqlite3.Connection) -> None:
            connection.executemany(
                "INSERT INTO outbox_buffer (notification_id, payload, created_at, next_attempt_at, status)"
                " VALUES (?, ?, ?, ?, 'forwarding')",
                ((nid, payload, created, created) for nid, payload, created in rows),
            )

        self._write(work)

    def delete(self, notification_ids: Iterable[str]) -> int:
        """Remove rows central has acknowledged (whatever their status). Returns how many went."""
        ids = list(notification_ids)
        if not ids:
            return 0

        def work(connection: sqlite3.Connection) -> int:
            removed = 0
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                removed += connection.execute(
                    f"DELETE FROM outbox_buffer WHERE notification_id IN ({marks})", chunk
                ).rowcount
            return removed

        return self._write(work)

    def park(self, errors: dict[str, str], *, now: str) -> int:
        """Park forwarding rows: ``errors`` maps notification id to the reason. Returns how many."""
        if not errors:
            return 0

        def work(connection: sqlite3.Connection) -> int:
            parked = 0
            for notification_id, error in errors.items():
                parked += connection.execute(
                    "UPDATE outbox_buffer SET status = 'parked', last_error = ?, last_attempt_at = ?"
                    " WHERE notification_id = ? AND status = 'forwarding'",
                    (error, now, notification_id),
                ).rowcount
            return parked

        return self._write(work)

    def record_transient_failure(
        self, notification_ids: Iterable[str], *, error: str, now: str, next_attempt_at: str, max_retries: int
    ) -> tuple[int, int]:
        """Count one failed attempt on each forwarding row; park rows whose budget is spent.

        ``max_retries`` 0 means retry forever. Only rows still ``forwarding`` are touched, so
        an operator action that won a race is never overwritten. Returns
        ``(retrying, parked)`` counts.
        """
        ids = list(notification_ids)
        if not ids:
            return 0, 0
        exhausted = f"Retries exhausted after {max_retries} attempts; last error: {error}"
        # One statement decides each row's fate; the parameters say "park when the budget is
        # spent" in SQL so that both code paths below apply exactly the same rule.
        spent = "? > 0 AND retry_count + 1 >= ?"
        update = f"""
            UPDATE outbox_buffer SET
                retry_count = retry_count + 1,
                last_attempt_at = ?,
                next_attempt_at = ?,
                status = CASE WHEN {spent} THEN 'parked' ELSE 'forwarding' END,
                last_error = CASE WHEN {spent} THEN ? ELSE ? END
            WHERE status = 'forwarding' AND notification_id IN ({{marks}})
        """
        update_params = (now, next_attempt_at, max_retries, max_retries, max_retries, max_retries, exhausted, error)

        def with_returning(connection: sqlite3.Connection, chunk: list[str]) -> tuple[int, int]:
            marks = ",".join("?" * len(chunk))
            statuses = connection.execute(
                update.format(marks=marks) + " RETURNING status", (*update_params, *chunk)
            ).fetchall()
            parked = sum(1 for (status,) in statuses if status == PARKED)
            return len(statuses) - parked, parked

        def without_returning(connection: sqlite3.Connection, chunk: list[str]) -> tuple[int, int]:
            # Inside the BEGIN IMMEDIATE transaction no other writer can run between the count
            # and the update, so the count is exactly what the update parks.
            marks = ",".join("?" * len(chunk))
            (parked,) = connection.execute(
                f"SELECT COUNT(*) FROM outbox_buffer WHERE status = 'forwarding' AND notification_id IN ({marks})"
                f" AND {spent}",
                (*chunk, max_retries, max_retries),
            ).fetchone()
            touched = connection.execute(update.format(marks=marks), (*update_params, *chunk)).rowcount
            return touched - parked, parked

        apply = with_returning if self.use_returning else without_returning

        def work(connection: sqlite3.Connection) -> tuple[int, int]:
            retrying = parked = 0
            for chunk in _chunks(ids):
                chunk_retrying, chunk_parked = apply(connection, chunk)
                retrying += chunk_retrying
                parked += chunk_parked
            return retrying, parked

        return self._write(work)

    def retry(self, notification_id: str, *, now: str) -> bool:
        """Parked → forwarding, retry count reset, due at once. True if the row was parked."""
        cursor = self._connection().execute(
            "UPDATE outbox_buffer SET status = 'forwarding', retry_count = 0, next_attempt_at = ?"
            " WHERE notification_id = ? AND status = 'parked'",
            (now, notification_id),
        )
        return cursor.rowcount == 1

    def all_due(self, *, now: str) -> int:
        """Every forwarding row due at ``now`` (its back-off dropped, its retry count kept):
        a standby taking over does not wait out the dead primary's back-off. Returns how many
        rows were waiting."""
        return self._write(
            lambda connection: (
                connection.execute(
                    "UPDATE outbox_buffer SET next_attempt_at = ? WHERE status = 'forwarding' AND next_attempt_at > ?",
                    (now, now),
                ).rowcount
            )
        )

    def discard(self, notification_id: str) -> BufferedRow | None:
        """Delete a parked row. Returns the row as it was, or None if no parked row had that id."""

        def work(connection: sqlite3.Connection) -> BufferedRow | None:
            row = connection.execute(
                "SELECT * FROM outbox_buffer WHERE notification_id = ? AND status = 'parked'", (notification_id,)
            ).fetchone()
            if row is None:
                return None
            connection.execute("DELETE FROM outbox_buffer WHERE notification_id = ?", (notification_id,))
            return BufferedRow(**dict(row))

        return self._write(work)

    # --- commands from central and reports to it ----------------------------------------------

    def command_execute(self, *, command_id: str, action: str, notification_id: str, now: str) -> CommandRecord:
        """Execute an operator command once: retry (parked → forwarding, retry count reset, due
        at once) or discard (delete the parked row). The result is stored in the same
        transaction as the change, so a command seen again (after a restart, or because its
        acknowledgement was lost) is answered from the record and never executed twice.
        Returns the record (``result`` ``done`` or ``failed`` with a ``detail`` saying why), to be
        acknowledged."""

        def work(connection: sqlite3.Connection) -> CommandRecord:
            known = connection.execute("SELECT * FROM outbox_commands WHERE command_id = ?", (command_id,)).fetchone()
            if known is not None:
                # Central hands a command out until it has the result: if it is here again, the
                # acknowledgement did not arrive, so send the stored result once more.
                connection.execute("UPDATE outbox_commands SET acked_at = NULL WHERE command_id = ?", (command_id,))
                return CommandRecord(**{**dict(known), "acked_at": None})
            row = connection.execute(
                "SELECT status FROM outbox_buffer WHERE notification_id = ?", (notification_id,)
            ).fetchone()
            status = None if row is None else row[0]
            result, detail = "failed", ""
            if action not in COMMAND_ACTIONS:
                detail = f"unknown action {action[:40]!r}; this agent knows {', '.join(COMMAND_ACTIONS)}"
            elif status is None:
                detail = "not in this site's buffer (already forwarded or discarded, or never here)"
            elif status != PARKED:
                detail = "not parked at this site (it is being forwarded); nothing changed"
            elif action == "retry":
                connection.execute(
                    "UPDATE outbox_buffer SET status = 'forwarding', retry_count = 0, next_attempt_at = ?"
                    " WHERE notification_id = ? AND status = 'parked'",
                    (now, notification_id),
                )
                result, detail = "done", "forwarding again with the retry count reset"
            else:
                connection.execute(
                    "DELETE FROM outbox_buffer WHERE notification_id = ? AND status = 'parked'", (notification_id,)
                )
                result, detail = "done", "discarded at the site"
            connection.execute(
                "INSERT INTO outbox_commands (command_id, action, notification_id, result, detail, executed_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (command_id, action, notification_id, result, detail, now),
            )
            return CommandRecord(command_id, action, notification_id, result, detail, now, None)

        return self._write(work)

    def commands_unacknowledged(self) -> list[CommandRecord]:
        """Executed commands whose result central has not acknowledged yet, oldest first."""
        rows = (
            self._connection()
            .execute("SELECT * FROM outbox_commands WHERE acked_at IS NULL ORDER BY executed_at, command_id")
            .fetchall()
        )
        return [CommandRecord(**dict(row)) for row in rows]

    def command_acknowledged(self, command_id: str, *, now: str, forget_before: str) -> None:
        """Central has the result of ``command_id``; records acknowledged before
        ``forget_before`` are deleted (central no longer hands those commands out)."""

        def work(connection: sqlite3.Connection) -> None:
            connection.execute("UPDATE outbox_commands SET acked_at = ? WHERE command_id = ?", (now, command_id))
            connection.execute(
                "DELETE FROM outbox_commands WHERE acked_at IS NOT NULL AND acked_at < ?", (forget_before,)
            )

        self._write(work)

    def parked_reports(self, *, limit: int) -> list[ParkedReport]:
        """Up to ``limit`` pending parked-state changes, oldest first, with the parked rows."""
        rows = (
            self._connection()
            .execute(
                "SELECT r.id AS report_id, r.notification_id AS report_notification_id, r.parked, r.outcome,"
                " r.changed_at, b.* FROM outbox_parked_reports r"
                " LEFT JOIN outbox_buffer b ON b.notification_id = r.notification_id AND b.status = 'parked'"
                " ORDER BY r.id LIMIT ?",
                (limit,),
            )
            .fetchall()
        )
        reports = []
        for row in rows:
            values = dict(row)
            buffered = None
            if values["notification_id"] is not None:
                buffered = BufferedRow(**{name: values[name] for name in BufferedRow.__dataclass_fields__})
            parked = bool(values["parked"]) and buffered is not None
            reports.append(
                ParkedReport(
                    report_id=values["report_id"],
                    notification_id=values["report_notification_id"],
                    parked=parked,
                    outcome=values["outcome"] if not parked else "",
                    changed_at=values["changed_at"],
                    row=buffered if parked else None,
                )
            )
        return reports

    def parked_reports_sent(self, report_ids: Iterable[int]) -> int:
        """Forget reports central has taken. A report replaced meanwhile by a newer change of
        the same row has a new id and stays. Returns how many were removed."""
        ids = [str(report_id) for report_id in report_ids]
        if not ids:
            return 0

        def work(connection: sqlite3.Connection) -> int:
            removed = 0
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                removed += connection.execute(
                    f"DELETE FROM outbox_parked_reports WHERE id IN ({marks})", [int(i) for i in chunk]
                ).rowcount
            return removed

        return self._write(work)

    def state_get(self, name: str) -> str | None:
        """A value the agent keeps about itself (e.g. when it last forwarded), or None."""
        row = self._connection().execute("SELECT value FROM outbox_agent_state WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def state_set(self, name: str, value: str) -> None:
        """Store ``value`` under ``name`` (one autocommitted statement)."""
        self._connection().execute(
            "INSERT INTO outbox_agent_state (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    # --- reads ------------------------------------------------------------------------------

    def due(self, *, now: str, limit: int) -> list[BufferedRow]:
        """Up to ``limit`` forwarding rows whose next attempt is at or before ``now``, oldest first."""
        rows = (
            self._connection()
            .execute(
                "SELECT * FROM outbox_buffer WHERE status = 'forwarding' AND next_attempt_at <= ?"
                " ORDER BY next_attempt_at, created_at LIMIT ?",
                (now, limit),
            )
            .fetchall()
        )
        return [BufferedRow(**dict(row)) for row in rows]

    def get(self, notification_id: str) -> BufferedRow | None:
        """The row with this id, or None."""
        row = (
            self._connection()
            .execute("SELECT * FROM outbox_buffer WHERE notification_id = ?", (notification_id,))
            .fetchone()
        )
        return None if row is None else BufferedRow(**dict(row))

    def parked(self) -> list[BufferedRow]:
        """Every parked row, oldest first."""
        rows = (
            self._connection()
            .execute("SELECT * FROM outbox_buffer WHERE status = 'parked' ORDER BY created_at")
            .fetchall()
        )
        return [BufferedRow(**dict(row)) for row in rows]

    def counts(self) -> dict[str, int]:
        """``{"forwarding": n, "parked": m}``."""
        counts = {FORWARDING: 0, PARKED: 0}
        for status, count in self._connection().execute("SELECT status, COUNT(*) FROM outbox_buffer GROUP BY status"):
            counts[status] = count
        return counts

    def oldest_forwarding(self) -> str | None:
        """``created_at`` of the oldest row still forwarding, or None when there is none."""
        row = (
            self._connection()
            .execute("SELECT MIN(created_at) FROM outbox_buffer WHERE status = 'forwarding'")
            .fetchone()
        )
        return None if row is None else row[0]

    def quick_check(self) -> str:
        """SQLite's ``PRAGMA quick_check`` verdict: ``ok`` for a sound file, else the problems."""
        return str(self._connection().execute("PRAGMA quick_check").fetchone()[0])

    def journal_mode(self) -> str:
        """The journal mode the file is in (``wal`` when the buffer opened correctly)."""
        return str(self._connection().execute("PRAGMA journal_mode").fetchone()[0]).lower()

    def file_bytes(self) -> int:
        """Bytes on disk: the database file plus its write-ahead log and shared-memory index."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total
