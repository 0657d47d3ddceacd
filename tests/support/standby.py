"""The standby drill, shared by the standby test, the agent benchmark and the chaos suite: a
primary site (a sending script, the agent's forwarder and Litestream replicating the buffer to
a replica directory) that dies at once with its disk, and a standby that restores the buffer
from the replica and forwards it.

The RPO is what the drill measures: the time between the death and the earliest
acknowledged ``send()`` that the restore does not hold (0 when it holds every one).
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sites.agent.standby import find_litestream
from tests.support.processes import PIPE, ROOT


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "sites.agent", *args]


def _env(**extra: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    env.update({key: str(value) for key, value in extra.items()})
    return env


class PrimarySite:
    """Everything on the primary machine, under ``directory``; the replica is ``replica``."""

    def __init__(self, directory: Path, replica: Path, *, central_url: str, key: str, interval: float = 0.05):
        self.directory, self.replica = directory, replica
        self.db = directory / "buffer.sqlite3"
        self.central_url, self.key, self.interval = central_url, key, interval
        self.acks: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self.processes: list[subprocess.Popen[Any]] = []

    def start(self, *, forward: bool = True) -> "PrimarySite":
        """Litestream first (replicating from the first row), then the forwarder and the sender."""
        self.directory.mkdir(parents=True, exist_ok=True)
        env = _env(OUTBOX_AGENT_DB=self.db, OUTBOX_CENTRAL_URL=self.central_url, OUTBOX_SITE_KEY=self.key)
        config = self.directory / "litestream.yml"
        config.write_text(
            subprocess.run(
                _agent("standby-config", "--replica", str(self.replica)),
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )
        # The buffer exists before Litestream starts, as on a site that already ran the agent.
        subprocess.run(_agent("stats"), env=env, cwd=ROOT, capture_output=True, check=True, timeout=60)
        self.litestream = subprocess.Popen(
            [find_litestream(), "replicate", "-config", str(config)], stdout=subprocess.DEVNULL, stderr=PIPE
        )
        self.processes.append(self.litestream)
        if forward:
            command = _agent("forward", "--quiet", "--sweep-interval", "1", "--retry-interval", "1")
            command += ["--max-retries", "0", "--heartbeat-interval", "1", "--timeout", "2"]
            self.processes.append(
                subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        self.sender = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.agent_sender",
                "--db",
                str(self.db),
                "--interval",
                str(self.interval),
            ],
            env=env,
            cwd=ROOT,
            stdout=PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.processes.append(self.sender)
        self._reader = threading.Thread(target=self._read_acks, daemon=True)
        self._reader.start()
        return self

    def _read_acks(self) -> None:
        assert self.sender.stdout is not None
        for line in self.sender.stdout:
            notification_id, moment = line.split()
            with self._lock:
                self.acks.append((notification_id, float(moment)))

    def acknowledged(self) -> list[tuple[str, float]]:
        """``(id, unix time)`` of every send the primary acknowledged so far."""
        with self._lock:
            return list(self.acks)

    def die(self) -> float:
        """SIGKILL every process of the primary and delete its disk (the whole directory);
        returns the moment of death (unix time, taken before the first kill)."""
        died = time.time()
        for process in self.processes:
            process.send_signal(signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=30)
        self._reader.join(timeout=30)  # the acknowledgements already in the pipe, to its end
        shutil.rmtree(self.directory)
        return died


def restore(db: Path, replica: Path) -> str:
    """``python -m sites.agent restore`` of ``replica`` into ``db``; returns its output."""
    done = subprocess.run(
        _agent("--db", str(db), "restore", "--replica", str(replica)),
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"restore failed ({done.returncode}): {done.stdout}{done.stderr}")
    return done.stdout


def measured_rpo(acks: list[tuple[str, float]], *, died: float, kept: set[str]) -> float:
    """Seconds between the death and the earliest acknowledged send not in ``kept``; 0.0 when
    every acknowledged send was kept."""
    lost = [moment for notification_id, moment in acks if notification_id not in kept]
    return round(max(0.0, died - min(lost)), 3) if lost else 0.0
