"""A host's metrics directory (PROMETHEUS_MULTIPROC_DIR) kept to the live processes' files and
one archive.

In prometheus-client's multiprocess mode every process counts into files of its own
(``counter_<pid>.db``, ``histogram_<pid>.db``) and a scrape sums every file in the directory,
those of processes that ended long ago too: their counts belong to the totals (a counter that
goes down reads as a reset to Prometheus). Left alone, the directory grows by a set of files
for every process ever started — each gunicorn worker, each django-q2 worker, each command that
counted — and every scrape reads them all (250 ms at 5,000 files).

:func:`metrics_files_compact` merges the counter, histogram and summary files of processes that
are no longer alive into one archive file per kind (``counter_archive.db``, …), summing each
series, and removes them: the totals a scrape reports are the same before and after. The
``live…`` gauge files of those processes are removed as prometheus-client's
``mark_process_dead`` removes them (a live gauge counts live processes only). Other gauge files
are left: what an ended process's gauge means depends on its mode (Outbox keeps none: its
gauges are read from the database at scrape time).

The archive is written aside and moved into place, then the merged files are removed, while
an exclusive lock on the directory's ``.lock`` file is held; scrapes read under a shared lock
(:class:`MetricsFilesCollector`), so a scrape sees the files before or after a compaction,
never half-way. A process killed between the two steps leaves the merged files to be counted
twice (never lost) until the directory is emptied.

Every Outbox process compacts when it starts (``NotificationsConfig.ready``: web workers and
every ``manage.py`` command, ``qcluster`` included), and gunicorn's master whenever one of its
workers ends (gunicorn.conf.py). Processes that share a directory must see each other's process
ids — one host, or one container: a process another one cannot see would be taken for ended.

This module imports nothing of Django: gunicorn's master uses it.
"""

import fcntl
import logging
import os
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger(__name__)

# Kinds whose values add up across processes; their files are merged into the archive.
ARCHIVED = ("counter", "histogram", "summary")
PROCESS_FILE = re.compile(r"^(counter|histogram|summary)_(\d+)\.db$")
LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")
LOCK_FILE = ".lock"


@dataclass
class Compaction:
    """What one compaction did: the files merged into the archive, the ended processes they
    (or their live-gauge files) belonged to, and files it could not read (left in place)."""

    merged: list[str] = field(default_factory=list)
    processes: set[int] = field(default_factory=set)
    unreadable: list[str] = field(default_factory=list)


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def metrics_directory_locked(directory: Path, *, shared: bool, required: bool = True) -> Iterator[None]:
    """Hold the directory's lock: shared for reading the files, exclusive for compacting them.
    When the lock file cannot be opened (a directory this user may not write to): OSError, or
    no lock at all unless ``required``."""
    try:
        descriptor = os.open(directory / LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        if required:
            raise
        yield
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _read(path: Path) -> list[tuple[str, float, float]]:
    """Every (key, value, timestamp) of one file."""
    return [(key, value, stamp) for key, value, stamp, _ in MmapedDict.read_all_values_from_file(str(path))]


def metrics_files_compact(*, directory: str | Path) -> Compaction:
    """Merge the files of ended processes in ``directory`` into its archive (module docstring).
    Never raises for the directory's content: a file it cannot read is left in place and
    listed in the result; a directory it cannot lock is left alone."""
    directory = Path(directory)
    result = Compaction()
    try:
        with metrics_directory_locked(directory, shared=False):
            names = os.listdir(directory)
            for name in names:
                match = LIVE_GAUGE_FILE.match(name)
                if match and not process_alive(int(match[1])):
                    multiprocess.mark_process_dead(int(match[1]), str(directory))
                    result.processes.add(int(match[1]))
            for kind in ARCHIVED:
                _kind_compact(directory, kind=kind, names=names, result=result)
    except OSError as exc:
        result.unreadable.append(f"{directory}: {exc}")
    return result


def _kind_compact(directory: Path, *, kind: str, names: list[str], result: Compaction) -> None:
    ended = []
    for name in sorted(names):
        match = PROCESS_FILE.match(name)
        if match and match[1] == kind and not process_alive(int(match[2])):
            ended.append((directory / name, int(match[2])))
    if not ended:
        return
    archive = directory / f"{kind}_archive.db"
    totals: dict[str, list[float]] = {}
    sources = [(archive, None)] if archive.exists() else []
    merged = []
    for path, pid in sources + ended:
        try:
            values = _read(path)
        except (OSError, RuntimeError, ValueError, struct.error) as exc:  # a truncated or corrupt file
            result.unreadable.append(f"{path.name}: {exc}")
            if pid is None:
                return  # without the archive's own values nothing can be merged into it
            continue
        for key, value, stamp in values:
            total = totals.setdefault(key, [0.0, 0.0])
            total[0] += value
            total[1] = max(total[1], stamp)
        if pid is not None:
            merged.append((path, pid))
    if not merged:
        return
    # Not *.db: a scrape never reads the draft.
    draft = directory / f"{kind}_archive.db.draft"
    draft.unlink(missing_ok=True)
    written = MmapedDict(str(draft))
    try:
        for key, (value, stamp) in totals.items():
            written.write_value(key, value, stamp)
    finally:
        written.close()
    os.replace(draft, archive)
    for path, pid in merged:
        path.unlink(missing_ok=True)
        result.merged.append(path.name)
        result.processes.add(pid)


def metrics_files_compact_at_start() -> None:
    """Compact PROMETHEUS_MULTIPROC_DIR, if set and present, logging what was merged (DEBUG: it
    happens at most starts) and what could not be read (WARNING). For a process's start."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if not directory or not os.path.isdir(directory):
        return
    result = metrics_files_compact(directory=directory)
    if result.merged:
        logger.debug(
            "Merged %d metrics files of %d ended processes into the archive of %s",
            len(result.merged),
            len(result.processes),
            directory,
        )
    if result.unreadable:
        logger.warning("Metrics files left as they are (not readable): %s", "; ".join(result.unreadable))


class MetricsFilesCollector(MultiProcessCollector):
    """prometheus-client's collector of the multiprocess files, reading them while no
    compaction runs (under the directory's shared lock; without the lock when it cannot be
    opened, as prometheus-client alone would)."""

    def __init__(self, registry: CollectorRegistry | None, *, directory: str | Path) -> None:
        super().__init__(registry, path=str(directory))
        self.directory = Path(directory)

    def collect(self) -> Any:
        with metrics_directory_locked(self.directory, shared=True, required=False):
            return list(super().collect())
