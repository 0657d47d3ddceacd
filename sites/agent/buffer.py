"""The site's local buffer: one SQLite table of notifications central does not have yet.

Durability rule: a row is on disk (WAL journal, ``synchronous=FULL``) before :meth:`Buffer.insert`
returns, and it leaves the table only when central has acknowledged it (or an operator discards
it). Every thread gets its own connection (and a forked child process opens its own), so any
number of script threads and processes may write at once; SQLite's busy timeout serialises them.

Timestamps are stored as fixed-width ISO-8601 UTC text (``2026-11-21T10:00:00.000000Z``) so
that string order is time order and an operator can read the file with the ``sqlite3`` shell.

Schema versions (``PRAGMA user_version``): 1 the table alone; 2 parked reports, commands and
agent state; 3 priority, per-row server-error back-off, the local fallback's delivery record,
watchdog pings, acknowledgements from central and the site's own acknowledge/clear calls. A
buffer is upgraded in place, in one transaction, the first time a newer agent opens it; rows
keep their state (a parked row stays parked) and read as priority ``normal``.

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
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

FORWARDING = "forwarding"
PARKED = "parked"

SCHEMA_VERSION = 3

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

# What version 3 adds. ALTER TABLE … ADD COLUMN gives every existing row the default, so an old
# row reads as priority "normal" with no server errors and no local delivery.
_UPGRADE_TO_3 = """
ALTER TABLE outbox_buffer ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal'
    CHECK (priority IN ('critical', 'high', 'normal', 'low'));
ALTER TABLE outbox_buffer ADD COLUMN server_errors INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_buffer ADD COLUMN server_error_since TEXT;
ALTER TABLE outbox_buffer ADD COLUMN local_state TEXT
    CHECK (local_state IN ('sending', 'ending', 'delivered', 'failed', 'unknown'));
ALTER TABLE outbox_buffer ADD COLUMN local_claim TEXT;
ALTER TABLE outbox_buffer ADD COLUMN local_claimed_until TEXT;
ALTER TABLE outbox_buffer ADD COLUMN local_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_buffer ADD COLUMN local_attempt_at TEXT;
ALTER TABLE outbox_buffer ADD COLUMN local_next_attempt_at TEXT;
ALTER TABLE outbox_buffer ADD COLUMN local_error TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox_buffer ADD COLUMN delivered_locally_at TEXT;
CREATE INDEX IF NOT EXISTS outbox_buffer_order ON outbox_buffer (status, {rank}, created_at);
CREATE INDEX IF NOT EXISTS outbox_buffer_server_errors ON outbox_buffer (server_errors) WHERE server_errors > 1;
CREATE INDEX IF NOT EXISTS outbox_buffer_local ON outbox_buffer (local_state) WHERE local_state IS NOT NULL;
CREATE TABLE IF NOT EXISTS outbox_watchdogs (
    name            TEXT PRIMARY KEY,
    every_seconds   INTEGER NOT NULL,
    list_name       TEXT NOT NULL,
    type            TEXT NOT NULL,
    pinged_at       TEXT NOT NULL,
    sent_pinged_at  TEXT
);
CREATE TABLE IF NOT EXISTS outbox_acknowledgements (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id       TEXT NOT NULL UNIQUE,
    notification_id  TEXT NOT NULL UNIQUE,
    acknowledged_at  TEXT,
    acknowledged_via TEXT NOT NULL DEFAULT '',
    acknowledged_by  TEXT NOT NULL DEFAULT '',
    note             TEXT NOT NULL DEFAULT '',
    received_at      TEXT NOT NULL,
    handed_over_at   TEXT
);
CREATE TABLE IF NOT EXISTS outbox_site_actions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id TEXT NOT NULL,
    action          TEXT NOT NULL CHECK (action IN ('ack', 'clear')),
    body            TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    not_found       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL,
    last_error      TEXT NOT NULL DEFAULT ''
);
"""

# The forwarder's order: most urgent first (critical 0 … low 3), then oldest.
RANK = "(CASE priority WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'normal' THEN 2 ELSE 3 END)"
_UPGRADE_TO_3 = _UPGRADE_TO_3.replace("{rank}", RANK)

# Local delivery states of a row (the fallback relay, sites/agent/fallback.py).
LOCAL_SENDING = "sending"  # claimed; talking to the relay, the message's end not sent yet
LOCAL_ENDING = "ending"  # the message's end is being sent: never sent again
LOCAL_DELIVERED = "delivered"  # the relay accepted it
LOCAL_FAILED = "failed"  # the relay refused it or could not be reached; tried again later
LOCAL_UNKNOWN = "unknown"  # the agent stopped while the relay had the message's end: not sent again

# Acknowledgements stored from central are kept this long (central stops handing a command out
# after 24 hours, so a command seen again within this time is always recognised).
ACKNOWLEDGEMENT_MEMORY_DAYS = 30

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


def parse_utc(text: str | None) -> datetime | None:
    """An aware UTC datetime from ISO-8601 text such as the buffer's (``…Z``) or central's
    (``…+00:00``); None for None or text that is not such a time. A time without a zone is
    taken as UTC."""
    if not text:
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    # Python 3.8–3.10 read fractions of exactly 3 or 6 digits only.
    head, dot, rest = value.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        value = head + "." + (rest[:digits] + "000000")[:6] + rest[digits:]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


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
    priority: str = "normal"
    server_errors: int = 0
    server_error_since: str | None = None
    local_state: str | None = None
    local_claim: str | None = None
    local_claimed_until: str | None = None
    local_attempts: int = 0
    local_attempt_at: str | None = None
    local_next_attempt_at: str | None = None
    local_error: str = ""
    delivered_locally_at: str | None = None


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


@dataclass(frozen=True)
class Acknowledgement:
    """Central's word that a person acknowledged a notification this site raised."""

    notification_id: str
    acknowledged_at: str | None
    acknowledged_via: str
    acknowledged_by: str
    note: str
    received_at: str  # when this site stored it (the site's clock)

    def as_dict(self) -> dict[str, str | None]:
        """The acknowledgement as a JSON-ready dict."""
        return {
            "notification_id": self.notification_id,
            "acknowledged_at": self.acknowledged_at,
            "acknowledged_via": self.acknowledged_via,
            "acknowledged_by": self.acknowledged_by,
            "note": self.note,
            "received_at": self.received_at,
        }


@dataclass(frozen=True)
class WatchdogPing:
    """The latest ping of one watchdog."""

    name: str
    every_seconds: int
    list_name: str
    type: str
    pinged_at: str
    sent_pinged_at: str | None


@dataclass(frozen=True)
class SiteAction:
    """An acknowledge or clear call of the plant's code, waiting to be sent to central."""

    action_id: int
    notification_id: str
    action: str  # "ack" or "clear"
    body: str  # the JSON body to post
    created_at: str
    not_found: int  # how many times central answered 404
    next_attempt_at: str
    last_error: str


COMMAND_ACTIONS = ("retry", "discard", "acknowledged")
# The fields of an "acknowledged" command that are stored for the plant's code.
ACKNOWLEDGEMENT_FIELDS = ("acknowledged_at", "acknowledged_via", "acknowledged_by", "note")


def _acknowledgement(row: sqlite3.Row) -> Acknowledgement:
    return Acknowledgement(
        notification_id=row["notification_id"],
        acknowledged_at=row["acknowledged_at"],
        acknowledged_via=row["acknowledged_via"],
        acknowledged_by=row["acknowledged_by"],
        note=row["note"],
        received_at=row["received_at"],
    )


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
            for statement in _statements(_UPGRADE_TO_3):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._write(work)

    # --- writes -----------------------------------------------------------------------------

    def insert(self, *, notification_id: str, payload: str, created_at: str, priority: str = "normal") -> None:
        """Durably add one row, due at once. Returns when the row is committed to disk."""
        self._connection().execute(
            "INSERT INTO outbox_buffer (notification_id, payload, created_at, next_attempt_at, status, priority)"
            " VALUES (?, ?, ?, ?, 'forwarding', ?)",
            (notification_id, payload, created_at, created_at, priority),
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

    def record_link_failure(
        self, notification_ids: Iterable[str], *, error: str, now: str, next_attempt_at: str
    ) -> int:
        """Central could not be reached for these rows (no answer, a timeout, a 5xx other than
        500, a proxy's error): the error and the next attempt are recorded, no retry is counted
        and nothing parks. Only rows still forwarding are touched. Returns how many."""
        ids = list(notification_ids)

        def work(connection: sqlite3.Connection) -> int:
            touched = 0
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                touched += connection.execute(
                    "UPDATE outbox_buffer SET last_error = ?, last_attempt_at = ?, next_attempt_at = ?"
                    f" WHERE status = 'forwarding' AND notification_id IN ({marks})",
                    (error, now, next_attempt_at, *chunk),
                ).rowcount
            return touched

        return self._write(work) if ids else 0

    def record_server_error(
        self, notification_id: str, *, error: str, now: datetime, first_interval: float, max_interval: float
    ) -> int | None:
        """Central answered 500 to this row: count it and put the next attempt off by a growing
        interval (``first_interval`` doubled for each further 500, at most ``max_interval``).
        Never parks. Returns the row's count of such answers, or None if it is not forwarding."""

        def work(connection: sqlite3.Connection) -> int | None:
            row = connection.execute(
                "SELECT server_errors FROM outbox_buffer WHERE notification_id = ? AND status = 'forwarding'",
                (notification_id,),
            ).fetchone()
            if row is None:
                return None
            count = int(row[0]) + 1
            # The exponent is bounded: 2**20 intervals is beyond any cap.
            seconds = min(first_interval * (2 ** min(count - 1, 20)), max(max_interval, first_interval))
            stamp = iso_utc(now)
            connection.execute(
                "UPDATE outbox_buffer SET server_errors = ?, server_error_since = COALESCE(server_error_since, ?),"
                " last_error = ?, last_attempt_at = ?, next_attempt_at = ? WHERE notification_id = ?",
                (count, stamp, error, stamp, iso_utc(now + timedelta(seconds=seconds)), notification_id),
            )
            return count

        return self._write(work)

    def server_error_summary(self) -> tuple[int, str | None, str]:
        """Rows central answered 500 to more than once: ``(count, the earliest first such
        answer, the last error of the row tried last)``."""
        # "server_errors > 1" is written out so the partial index can serve it (a bound parameter
        # would not prove the index's condition): a few rows read, whatever the backlog.
        connection = self._connection()
        count, since = connection.execute(
            "SELECT COUNT(*), MIN(server_error_since) FROM outbox_buffer INDEXED BY outbox_buffer_server_errors"
            " WHERE server_errors > 1 AND status = 'forwarding'"
        ).fetchone()
        last = connection.execute(
            "SELECT last_error FROM outbox_buffer INDEXED BY outbox_buffer_server_errors"
            " WHERE server_errors > 1 AND status = 'forwarding' ORDER BY last_attempt_at DESC LIMIT 1"
        ).fetchone()
        return int(count), since, "" if last is None else str(last[0])

    # --- the local fallback's delivery record ---------------------------------------------------

    def local_candidates(self, *, now: str, max_rank: int, limit: int) -> list[BufferedRow]:
        """Forwarding rows of rank ``max_rank`` or more urgent that the local relay may take now:
        never tried, or failed and due again, or claimed by an agent whose claim ran out before
        it sent the message's end. Most urgent first, then oldest."""
        rows = (
            self._connection()
            .execute(
                f"SELECT * FROM outbox_buffer WHERE status = 'forwarding' AND {RANK} <= ? AND ("
                " local_state IS NULL"
                " OR (local_state = 'failed' AND local_next_attempt_at <= ?)"
                " OR (local_state = 'sending' AND local_claimed_until <= ?))"
                f" ORDER BY {RANK}, created_at LIMIT ?",
                (max_rank, now, now, limit),
            )
            .fetchall()
        )
        return [BufferedRow(**dict(row)) for row in rows]

    def local_claim(self, notification_id: str, *, claim: str, now: str, until: str) -> bool:
        """Claim a row for local delivery (``claim``: a token unique to this attempt), if it is
        still a candidate (see :meth:`local_candidates`). True if this caller holds it now; two
        processes never both do."""
        cursor = self._connection().execute(
            "UPDATE outbox_buffer SET local_state = 'sending', local_claim = ?, local_claimed_until = ?,"
            " local_attempt_at = ?, local_attempts = local_attempts + 1"
            " WHERE notification_id = ? AND status = 'forwarding' AND ("
            " local_state IS NULL"
            " OR (local_state = 'failed' AND local_next_attempt_at <= ?)"
            " OR (local_state = 'sending' AND local_claimed_until <= ?))",
            (claim, until, now, notification_id, now, now),
        )
        return cursor.rowcount == 1

    def local_ending(self, notification_id: str, *, claim: str, until: str) -> bool:
        """Record, durably and before it is sent, that the message's end is about to go to the
        relay: from then on the row is never sent locally again. True only if ``claim`` still
        holds the row (it was not forwarded, or re-claimed after the claim ran out)."""
        cursor = self._connection().execute(
            "UPDATE outbox_buffer SET local_state = 'ending', local_claimed_until = ?"
            " WHERE notification_id = ? AND local_state = 'sending' AND local_claim = ?",
            (until, notification_id, claim),
        )
        return cursor.rowcount == 1

    def local_finish(
        self, notification_id: str, *, claim: str, state: str, now: str, error: str = "", retry_at: str | None = None
    ) -> bool:
        """The outcome of this claim's attempt: ``delivered`` (stamps ``delivered_locally_at``),
        ``failed`` (tried again from ``retry_at``) or ``unknown``. True if the row was still
        this claim's."""
        delivered_at = now if state == LOCAL_DELIVERED else None
        cursor = self._connection().execute(
            "UPDATE outbox_buffer SET local_state = ?, local_error = ?, local_next_attempt_at = ?,"
            " delivered_locally_at = COALESCE(?, delivered_locally_at), local_claimed_until = NULL"
            " WHERE notification_id = ? AND local_claim = ? AND local_state IN ('sending', 'ending')",
            (state, error, retry_at, delivered_at, notification_id, claim),
        )
        return cursor.rowcount == 1

    def local_expire_endings(self, *, now: str) -> int:
        """Rows whose message end went to the relay under a claim that ran out (the agent was
        stopped or killed waiting for the relay's answer) become ``unknown``: never sent again.
        Returns how many."""
        return (
            self._connection()
            .execute(
                "UPDATE outbox_buffer SET local_state = 'unknown', local_claimed_until = NULL,"
                " local_error = 'the agent stopped while the relay was receiving the message end; its answer is"
                " unknown, so it is not sent again' WHERE local_state = 'ending' AND local_claimed_until <= ?",
                (now,),
            )
            .rowcount
        )

    def local_counts(self) -> dict[str, int]:
        """How many buffered rows are in each local delivery state (absent states are 0)."""
        counts = dict.fromkeys((LOCAL_SENDING, LOCAL_ENDING, LOCAL_DELIVERED, LOCAL_FAILED, LOCAL_UNKNOWN), 0)
        for state, count in self._connection().execute(
            "SELECT local_state, COUNT(*) FROM outbox_buffer WHERE local_state IS NOT NULL GROUP BY local_state"
        ):
            counts[state] = count
        return counts

    # --- watchdogs ------------------------------------------------------------------------------

    def watchdog_ping(self, *, name: str, every_seconds: int, list_name: str, type: str, pinged_at: str) -> None:
        """Keep ``pinged_at`` as the latest ping of watchdog ``name`` (one row per name, one
        autocommitted statement)."""
        self._connection().execute(
            "INSERT INTO outbox_watchdogs (name, every_seconds, list_name, type, pinged_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET every_seconds = excluded.every_seconds,"
            " list_name = excluded.list_name, type = excluded.type, pinged_at = excluded.pinged_at",
            (name, every_seconds, list_name, type, pinged_at),
        )

    def watchdogs(self) -> list[WatchdogPing]:
        """Every watchdog's latest ping, by name."""
        rows = self._connection().execute("SELECT * FROM outbox_watchdogs ORDER BY name").fetchall()
        return [WatchdogPing(**dict(row)) for row in rows]

    def watchdogs_unsent(self) -> list[WatchdogPing]:
        """Watchdogs whose latest ping central has not taken yet, by name."""
        rows = (
            self._connection()
            .execute(
                "SELECT * FROM outbox_watchdogs WHERE sent_pinged_at IS NULL OR sent_pinged_at <> pinged_at"
                " ORDER BY name"
            )
            .fetchall()
        )
        return [WatchdogPing(**dict(row)) for row in rows]

    def watchdog_sent(self, name: str, *, pinged_at: str) -> None:
        """Central has taken the ping of ``pinged_at``; a newer ping stays to be sent."""
        self._connection().execute("UPDATE outbox_watchdogs SET sent_pinged_at = ? WHERE name = ?", (pinged_at, name))

    # --- acknowledgements from central -----------------------------------------------------------

    def acknowledgements(
        self, *, since: str | None = None, consume: bool = False, now: str = ""
    ) -> list[Acknowledgement]:
        """Stored acknowledgements in the order they arrived, those received after ``since``
        (the site's clock, ISO-8601 UTC text) when given; ``received_at`` grows in that order,
        so the last one seen is a safe ``since`` for the next call. ``consume``: only those not
        handed over yet, marked handed over (at ``now``) in the same transaction, so no caller
        in any process ever gets one twice."""

        def work(connection: sqlite3.Connection) -> list[Acknowledgement]:
            where: list[str] = []
            params: list[str] = []
            if since is not None:
                where.append("received_at > ?")
                params.append(since)
            if consume:
                where.append("handed_over_at IS NULL")
            query = "SELECT * FROM outbox_acknowledgements"
            if where:
                query += " WHERE " + " AND ".join(where)
            rows = connection.execute(query + " ORDER BY id", params).fetchall()
            if consume and rows:
                for chunk in _chunks([str(row["id"]) for row in rows]):
                    marks = ",".join("?" * len(chunk))
                    connection.execute(
                        f"UPDATE outbox_acknowledgements SET handed_over_at = ? WHERE id IN ({marks})",
                        (now, *[int(i) for i in chunk]),
                    )
            return [_acknowledgement(row) for row in rows]

        if consume:
            return self._write(work)
        return work(self._connection())

    def acknowledgement_for(self, notification_id: str) -> Acknowledgement | None:
        """The stored acknowledgement of ``notification_id``, or None."""
        row = (
            self._connection()
            .execute("SELECT * FROM outbox_acknowledgements WHERE notification_id = ?", (notification_id,))
            .fetchone()
        )
        return None if row is None else _acknowledgement(row)

    # --- the site's own acknowledge / clear calls ---------------------------------------------------

    def site_action_add(self, *, notification_id: str, action: str, body: str, now: str) -> None:
        """Buffer an acknowledge (``ack``) or clear (``clear``) call for central, durably."""
        self._connection().execute(
            "INSERT INTO outbox_site_actions (notification_id, action, body, created_at, next_attempt_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (notification_id, action, body, now, now),
        )

    def site_actions_due(self, *, now: str, limit: int) -> list[SiteAction]:
        """Calls due at ``now`` whose notification has reached central (it is no longer in this
        buffer), oldest first."""
        rows = (
            self._connection()
            .execute(
                "SELECT id AS action_id, notification_id, action, body, created_at, not_found, next_attempt_at,"
                " last_error FROM outbox_site_actions a WHERE next_attempt_at <= ?"
                " AND NOT EXISTS (SELECT 1 FROM outbox_buffer b WHERE b.notification_id = a.notification_id)"
                " ORDER BY id LIMIT ?",
                (now, limit),
            )
            .fetchall()
        )
        return [SiteAction(**dict(row)) for row in rows]

    def site_actions_waiting(self) -> int:
        """How many acknowledge/clear calls are buffered."""
        return int(self._connection().execute("SELECT COUNT(*) FROM outbox_site_actions").fetchone()[0])

    def site_action_sent(self, action_id: int) -> None:
        """Central took the call (or it was dropped): forget it."""
        self._connection().execute("DELETE FROM outbox_site_actions WHERE id = ?", (action_id,))

    def site_action_retry(self, action_id: int, *, error: str, next_attempt_at: str, not_found: bool) -> None:
        """Try the call again from ``next_attempt_at``; ``not_found`` counts a 404."""
        self._connection().execute(
            "UPDATE outbox_site_actions SET last_error = ?, next_attempt_at = ?, not_found = not_found + ?"
            " WHERE id = ?",
            (error, next_attempt_at, 1 if not_found else 0, action_id),
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

    def command_execute(
        self,
        *,
        command_id: str,
        action: str,
        notification_id: str,
        now: str,
        details: dict[str, str | None] | None = None,
    ) -> CommandRecord:
        """Execute an operator command once: retry (parked → forwarding, retry count reset, due
        at once), discard (delete the parked row) or acknowledged (store central's
        acknowledgement, ``details``, for the plant's code). The result is stored in the same
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
            if action == "acknowledged":
                result, detail = self._store_acknowledgement(
                    connection, command_id=command_id, notification_id=notification_id, now=now, details=details or {}
                )
            else:
                result, detail = self._execute_operator_action(
                    connection, action=action, notification_id=notification_id, now=now
                )
            connection.execute(
                "INSERT INTO outbox_commands (command_id, action, notification_id, result, detail, executed_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (command_id, action, notification_id, result, detail, now),
            )
            return CommandRecord(command_id, action, notification_id, result, detail, now, None)

        return self._write(work)

    @staticmethod
    def _execute_operator_action(
        connection: sqlite3.Connection, *, action: str, notification_id: str, now: str
    ) -> tuple[str, str]:
        row = connection.execute(
            "SELECT status FROM outbox_buffer WHERE notification_id = ?", (notification_id,)
        ).fetchone()
        status = None if row is None else row[0]
        if action not in COMMAND_ACTIONS:
            return "failed", f"unknown action {action[:40]!r}; this agent knows {', '.join(COMMAND_ACTIONS)}"
        if status is None:
            return "failed", "not in this site's buffer (already forwarded or discarded, or never here)"
        if status != PARKED:
            return "failed", "not parked at this site (it is being forwarded); nothing changed"
        if action == "retry":
            connection.execute(
                "UPDATE outbox_buffer SET status = 'forwarding', retry_count = 0, next_attempt_at = ?"
                " WHERE notification_id = ? AND status = 'parked'",
                (now, notification_id),
            )
            return "done", "forwarding again with the retry count reset"
        connection.execute(
            "DELETE FROM outbox_buffer WHERE notification_id = ? AND status = 'parked'", (notification_id,)
        )
        return "done", "discarded at the site"

    @staticmethod
    def _store_acknowledgement(
        connection: sqlite3.Connection,
        *,
        command_id: str,
        notification_id: str,
        now: str,
        details: dict[str, str | None],
    ) -> tuple[str, str]:
        # received_at only grows, in the order acknowledgements are stored (the write lock
        # serialises them), even when the clock steps back or two forwarders share the buffer:
        # a reader that passes the last received_at it saw as ``since`` never misses one.
        latest = connection.execute("SELECT MAX(received_at) FROM outbox_acknowledgements").fetchone()[0]
        received_at = now
        if latest is not None and latest >= now:
            previous = parse_utc(latest)
            if previous is not None:
                received_at = iso_utc(previous + timedelta(microseconds=1))
        # A notification is acknowledged at most once; a second command for it (central sent a
        # new one after the first expired) leaves the stored acknowledgement as it is.
        stored = connection.execute(
            "INSERT OR IGNORE INTO outbox_acknowledgements (command_id, notification_id, acknowledged_at,"
            " acknowledged_via, acknowledged_by, note, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                command_id,
                notification_id,
                details.get("acknowledged_at"),
                details.get("acknowledged_via") or "",
                details.get("acknowledged_by") or "",
                details.get("note") or "",
                received_at,
            ),
        ).rowcount
        received = parse_utc(now)
        if received is not None:
            forget_before = iso_utc(received - timedelta(days=ACKNOWLEDGEMENT_MEMORY_DAYS))
            connection.execute("DELETE FROM outbox_acknowledgements WHERE received_at < ?", (forget_before,))
        if stored:
            return "done", "stored at the site for the plant's code"
        return "done", "already stored at the site (acknowledged before); nothing changed"

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

    def state_delete(self, name: str) -> None:
        """Forget the value under ``name``."""
        self._connection().execute("DELETE FROM outbox_agent_state WHERE name = ?", (name,))

    # --- reads ------------------------------------------------------------------------------

    def due(self, *, now: str, limit: int, lane: str | None = None) -> list[BufferedRow]:
        """Up to ``limit`` forwarding rows whose next attempt is at or before ``now``, most
        urgent first, then oldest. ``lane`` ``"critical"`` takes only critical rows, ``"other"``
        every other priority, None all. A row whose message end the local relay is receiving
        right now waits for the relay's answer (so central learns it was delivered locally)."""
        # Written on the rank expression, so the order index bounds each lane's scan.
        lanes = {None: "", "critical": f" AND {RANK} = 0", "other": f" AND {RANK} >= 1"}
        rows = (
            self._connection()
            .execute(
                # The order index gives the rows in sending order, so LIMIT stops the scan early;
                # left to itself the planner may pick the due-time index and sort a whole backlog.
                "SELECT * FROM outbox_buffer INDEXED BY outbox_buffer_order"
                " WHERE status = 'forwarding' AND next_attempt_at <= ?"
                f"{lanes[lane]} AND (local_state IS NOT 'ending' OR local_claimed_until <= ?)"
                f" ORDER BY {'created_at' if lane == 'critical' else RANK + ', created_at'} LIMIT ?",
                (now, now, limit),
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
