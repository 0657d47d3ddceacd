"""``doctor``: can this site's agent do its job? One line per check, OK / WARN / FAIL.

Checks, in order: the Python and SQLite the agent runs on, the buffer file (journal mode, rows
waiting, parked rows), how forwarding stands as the forwarder last recorded it in the buffer
(held by a refused key, central unreachable, rate-limited, rows central keeps failing on), free
disk next to the buffer, whether central answers (its health check), whether central accepts
the site key (an authenticated read that changes nothing), the clock skew against central's
``Date`` header, and — when one is configured — the local fallback relay (it is connected to,
greeted and logged in to, then left: nothing is sent) and what it has done. Nothing is sent and
nothing in the buffer changes (a buffer file that does not exist yet is not created).
"""

from __future__ import annotations

import os
import platform
import shutil
import smtplib
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from sites.agent.buffer import LOCAL_FAILED, MIN_SQLITE_VERSION, Buffer, iso_utc, sqlite_has_returning, utc_now
from sites.agent.central import CentralClient, CentralResponse, CentralUnreachable
from sites.agent.fallback import FallbackConfig, relay_check
from sites.agent.state import LinkState

OK, WARN, FAIL = "OK", "WARN", "FAIL"

# Free space next to the buffer below which a site should act (a notification is ~1 KiB).
DISK_FAIL_BYTES = 50 * 1024 * 1024
DISK_WARN_BYTES = 500 * 1024 * 1024
# Clock skew against central: timestamps the site stamps (site_enqueued_at) become misleading,
# and far enough off, certificate validity checks fail.
SKEW_WARN_SECONDS = 10.0
SKEW_FAIL_SECONDS = 300.0
# A row this old still waiting to be forwarded means forwarding is not happening.
STALE_BACKLOG = timedelta(hours=1)


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    level: str  # OK, WARN or FAIL
    detail: str

    def line(self) -> str:
        """``OK   central: …`` as printed."""
        return f"{self.level:<4} {self.name}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        """The check as a JSON-ready dict."""
        return asdict(self)


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover - the loop returns


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def check_runtime() -> Check:
    """The interpreter and platform (always OK: informative for support)."""
    return Check("python", OK, f"Python {platform.python_version()} on {platform.system() or sys.platform}")


def check_sqlite() -> Check:
    """SQLite library version: OK from 3.26 (the oldest tested), WARN below."""
    version = sqlite3.sqlite_version
    returning = "UPDATE … RETURNING" if sqlite_has_returning() else "the pre-3.35 update path"
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        minimum = ".".join(str(part) for part in MIN_SQLITE_VERSION)
        return Check("sqlite", WARN, f"SQLite {version} is older than {minimum}, the oldest the agent is tested with")
    return Check("sqlite", OK, f"SQLite {version} (uses {returning})")


def check_buffer(db_path: str | None, *, now: datetime, fallback: FallbackConfig | None = None) -> list[Check]:
    """The buffer file: journal mode (WAL expected), what it holds, and how forwarding stands
    (with the local fallback's record when ``fallback`` is configured)."""
    if not db_path:
        return [Check("buffer", FAIL, "not configured: set OUTBOX_AGENT_DB or pass --db")]
    if not os.path.exists(db_path):
        directory = _existing_parent(db_path)
        if os.access(directory, os.W_OK):
            return [Check("buffer", WARN, f"{db_path} does not exist yet; it is created by the first send")]
        return [Check("buffer", FAIL, f"{db_path} does not exist and {directory} is not writable by this user")]
    try:
        buffer = Buffer(db_path)
    except (sqlite3.Error, OSError) as error:
        return [Check("buffer", FAIL, f"cannot open {db_path}: {type(error).__name__}: {error}")]
    try:
        mode = buffer.journal_mode()
        counts = buffer.counts()
        oldest = buffer.oldest_forwarding()
        size = buffer.file_bytes()
        forwarding_check = check_forwarding(buffer, now=now)
        local = check_fallback_record(buffer, fallback, now=now) if fallback is not None else []
    except sqlite3.Error as error:
        return [Check("buffer", FAIL, f"cannot read {db_path}: {type(error).__name__}: {error}")]
    finally:
        buffer.close()
    checks = []
    if mode == "wal":
        checks.append(Check("journal", OK, "journal_mode=wal, synchronous=FULL"))
    else:
        checks.append(
            Check("journal", FAIL, f"journal_mode={mode}; the agent needs wal (is the file on a network share?)")
        )
    forwarding, parked = counts["forwarding"], counts["parked"]
    detail = f"{db_path}: {forwarding} buffered, {parked} parked, {_size(size)} on disk"
    level = OK
    if oldest is not None:
        age = (now - datetime.strptime(oldest, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=now.tzinfo)).total_seconds()
        detail += f"; oldest buffered {_age(max(age, 0))} ago"
        if age > STALE_BACKLOG.total_seconds():
            level = WARN
            detail += " (is a forwarder running?)"
    if parked:
        level = WARN
        detail += "; parked rows need an operator (see `parked`)"
    checks.append(Check("buffer", level, detail))
    checks.append(forwarding_check)
    checks.extend(local)
    return checks


def check_forwarding(buffer: Buffer, *, now: datetime) -> Check:
    """How forwarding stands, as the forwarder (whatever process runs it) last recorded it."""
    snapshot = LinkState(buffer=buffer, clock=lambda: now).snapshot()
    rows, since, last_error = buffer.server_error_summary()
    last_forward = buffer.state_get("last_forward_at")
    if snapshot.key_refused is not None:
        return Check(
            "forwarding",
            FAIL,
            f"held since {snapshot.key_refused.get('since')}: central refused the site key at the last attempt "
            f"({snapshot.key_refused.get('detail')}); nothing is parked or lost — fix OUTBOX_SITE_KEY or "
            "reactivate the site at central",
        )
    problems = []
    if snapshot.unreachable_since is not None:
        problems.append(
            f"central unreachable since {iso_utc(snapshot.unreachable_since)} "
            f"({_age(snapshot.unreachable_for())}): {snapshot.last_error}; nothing parks for an outage"
        )
    if snapshot.rate_limited:
        problems.append(snapshot.rate_limit_line())
    if rows:
        problems.append(
            f"{rows} notification(s) central answered 500 to more than once since {since}, retried with back-off "
            f"(last: {last_error})"
        )
    if problems:
        return Check("forwarding", WARN, "; ".join(problems))
    if last_forward:
        return Check("forwarding", OK, f"last forward to central at {last_forward}")
    return Check("forwarding", OK, "nothing forwarded from this buffer yet; no problem recorded")


def check_fallback_record(buffer: Buffer, fallback: FallbackConfig, *, now: datetime) -> list[Check]:
    """What the local fallback has done: active or not, delivered, failing."""
    snapshot = LinkState(buffer=buffer, clock=lambda: now).snapshot()
    failing = buffer.local_counts()[LOCAL_FAILED]
    delivered = snapshot.fallback["delivered"]
    active = snapshot.unreachable_since is not None and snapshot.unreachable_for() >= fallback.after_seconds
    if failing:
        return [
            Check(
                "fallback",
                FAIL,
                f"{failing} notification(s) the local relay could not take (retried every retry interval); last "
                f"error at {snapshot.fallback['last_error_at']}: {snapshot.fallback['last_error']}",
            )
        ]
    state = "ACTIVE: central is unreachable, urgent notifications go to the local relay" if active else "standing by"
    level = WARN if active else OK
    return [Check("fallback", level, f"{state}; {delivered} delivered locally so far")]


def _existing_parent(path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    return directory


def check_disk(db_path: str | None) -> Check:
    """Free space on the buffer's file system: FAIL under 50 MiB, WARN under 500 MiB."""
    directory = _existing_parent(db_path or os.getcwd())
    try:
        usage = shutil.disk_usage(directory)
    except OSError as error:
        return Check("disk", WARN, f"cannot read free space of {directory}: {error}")
    percent = 100.0 * usage.free / usage.total if usage.total else 0.0
    detail = f"{_size(usage.free)} free of {_size(usage.total)} ({percent:.0f}%) at {directory}"
    if usage.free < DISK_FAIL_BYTES:
        return Check("disk", FAIL, detail + " — the buffer cannot grow")
    if usage.free < DISK_WARN_BYTES:
        return Check("disk", WARN, detail)
    return Check("disk", OK, detail)


def check_central(
    client: CentralClient | None, *, config_error: str | None, clock: Callable[[], datetime]
) -> list[Check]:
    """Reachability (health check), key validity (authenticated read) and clock skew."""
    if client is None:
        problem = config_error or "not configured: set OUTBOX_CENTRAL_URL and OUTBOX_SITE_KEY"
        return [
            Check("central", FAIL, problem),
            Check("key", WARN, "not checked: central is not configured"),
            Check("clock", WARN, "not checked: central is not configured"),
        ]
    skews: list[float] = []

    def timed(call: Callable[[], CentralResponse]) -> CentralResponse:
        before = clock()
        started = time.monotonic()
        response = call()
        elapsed = time.monotonic() - started
        central_date = response.date()
        if central_date is not None:
            # Date has whole seconds and is stamped while the request is in flight.
            skews.append((central_date - (before + timedelta(seconds=elapsed / 2))).total_seconds())
        return response

    checks = []
    try:
        health = timed(client.get_health)
    except CentralUnreachable as error:
        return [
            Check("central", FAIL, str(error)),
            Check("key", WARN, "not checked: central is unreachable"),
            Check("clock", WARN, "not checked: central is unreachable"),
        ]
    where = f"{client.base_url} ({client.route})"
    if health.status == 200:
        checks.append(Check("central", OK, f"{where} answers; its database is up"))
    elif health.status == 503:
        checks.append(Check("central", WARN, f"{where} answers but reports {health.describe()}; forwarding will retry"))
    else:
        checks.append(
            Check("central", WARN, f"{where} answered {health.describe()} to /healthz; is the URL's path prefix right?")
        )

    try:
        answer = timed(client.check_key)
    except CentralUnreachable as error:
        checks.append(Check("key", FAIL, f"not checked: {error}"))
    else:
        if answer.status == 200:
            checks.append(Check("key", OK, "central accepts the site key"))
        elif answer.status == 401:
            checks.append(Check("key", FAIL, f"central refused the key ({answer.describe()}); check OUTBOX_SITE_KEY"))
        elif answer.status == 403:
            checks.append(
                Check("key", FAIL, f"central refused this site ({answer.describe()}); is the site active at central?")
            )
        else:
            checks.append(Check("key", WARN, f"could not be confirmed: {answer.describe()}"))

    if not skews:
        checks.append(Check("clock", WARN, "central sent no Date header; skew unknown"))
    else:
        skew = min(skews, key=abs)
        relation = "ahead of" if skew < 0 else "behind"
        detail = f"this site's clock is {abs(skew):.0f} s {relation} central's"
        if abs(skew) > SKEW_FAIL_SECONDS:
            checks.append(Check("clock", FAIL, detail + " — fix the time sync (NTP) on this host"))
        elif abs(skew) > SKEW_WARN_SECONDS:
            checks.append(Check("clock", WARN, detail + " — check the time sync (NTP) on this host"))
        else:
            checks.append(Check("clock", OK, f"within {max(abs(skew), 1):.0f} s of central's"))
    return checks


def check_relay(fallback: FallbackConfig | None, *, fallback_error: str | None) -> list[Check]:
    """The local fallback relay answers and lets the agent in (nothing is sent)."""
    if fallback_error is not None:
        return [Check("relay", FAIL, f"the fallback configuration is wrong: {fallback_error}")]
    if fallback is None:
        return []
    settings = fallback.smtp
    try:
        name = relay_check(settings)
    except (OSError, smtplib.SMTPException) as error:
        return [
            Check(
                "relay",
                FAIL,
                f"the local fallback relay {settings.display} cannot be used: {type(error).__name__}: {error}",
            )
        ]
    return [
        Check(
            "relay",
            OK,
            f"{settings.display} answers ({name}); after {fallback.after_seconds:g} s without central, "
            f"{fallback.min_priority} and more urgent notifications go to {', '.join(settings.to)}",
        )
    ]


def doctor_run(
    *,
    db_path: str | None,
    client: CentralClient | None,
    config_error: str | None = None,
    clock: Callable[[], datetime] = utc_now,
    fallback: FallbackConfig | None = None,
    fallback_error: str | None = None,
) -> list[Check]:
    """Every check, in report order. ``client`` None means central is not configured;
    ``config_error`` then says why (e.g. a CA file that cannot be loaded). ``fallback``: the
    local relay to check, when one is configured (``fallback_error``: why its configuration
    was refused)."""
    checks = [check_runtime(), check_sqlite()]
    checks.extend(check_buffer(db_path, now=clock(), fallback=fallback))
    checks.append(check_disk(db_path))
    checks.extend(check_central(client, config_error=config_error, clock=clock))
    checks.extend(check_relay(fallback, fallback_error=fallback_error))
    return checks


def doctor_failed(checks: list[Check]) -> bool:
    """True when any check failed."""
    return any(check.level == FAIL for check in checks)
