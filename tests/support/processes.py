"""Real processes for end-to-end tests: gunicorn serving central and manage.py commands,
pointed at the database the test uses."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.db import database_url

ROOT = Path(__file__).resolve().parents[2]


def child_env(*, database=None, **extra):
    env = dict(os.environ, DATABASE_URL=database or database_url(), LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
    env.update({key: str(value) for key, value in extra.items()})
    return env


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll(condition, *, timeout, message, interval=0.02):
    """Wait until ``condition()`` is true; fail with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(interval)


def manage(*args, database=None, **env):
    """Start ``manage.py args…`` as a child process (stdout/stderr captured)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args], env=child_env(database=database, **env), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop(process, *, sig=signal.SIGTERM, timeout=20):
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Central:
    """gunicorn serving the project on ``port`` (a free one unless given), as in production."""

    def __init__(self, *, port=None, workers=2, database=None, launcher=(), **env):
        """``launcher``: arguments run before ``-m gunicorn`` (e.g. a clock-skewing wrapper)."""
        self.launcher = [str(part) for part in launcher]
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers, self.database, self.env = workers, database, env
        self.process = None

    def start(self, timeout=30):
        self.process = subprocess.Popen(
            [sys.executable, *self.launcher, "-m", "gunicorn", "outbox_project.wsgi:application", "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(self.workers), "--log-level", "warning", "--graceful-timeout", "5"],
            env=child_env(database=self.database, **self.env), cwd=ROOT,
        )  # fmt: skip
        poll(self.healthy, timeout=timeout, interval=0.1, message="central (gunicorn) did not become healthy")
        return self

    def healthy(self):
        if self.process.poll() is not None:
            raise AssertionError(f"gunicorn exited with {self.process.returncode}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self):
        if self.process is not None:
            stop(self.process)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
