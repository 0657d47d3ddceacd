"""Real processes, shared by the tests, the benchmarks and the chaos suite: gunicorn serving
central, ``manage.py`` commands (dispatchers, the django-q2 worker, one-off commands) and an
SMTP sink in a process of its own, each pointed at a given database.

``database`` is a DATABASE_URL; left out, it is the database the calling process's Django
connection uses (the test database, inside a test).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from tests.support.db import database_url

ROOT = Path(__file__).resolve().parents[2]
PIPE = subprocess.PIPE


def child_env(*, database: str | None = None, **extra: Any) -> dict[str, str]:
    """The environment of a child process: this one's, pointed at ``database``, logging warnings
    and errors only, the repository importable, and ``extra`` variables (as strings)."""
    env = dict(
        os.environ,
        DATABASE_URL=database or database_url(),
        DJANGO_SETTINGS_MODULE="outbox_project.settings",
        LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    env.update({key: str(value) for key, value in extra.items()})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll(condition: Callable[[], object], *, timeout: float, message: str, interval: float = 0.02) -> None:
    """Wait until ``condition()`` is true; AssertionError with ``message`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(interval)


def manage(
    *args: str,
    database: str | None = None,
    launcher: Iterable[object] = (),
    stdout: int | IO[Any] | None = PIPE,
    stderr: int | IO[Any] | None = PIPE,
    **env: Any,
) -> "subprocess.Popen[str]":
    """Start ``manage.py args…`` as a child process; output is captured (text) unless
    ``stdout``/``stderr`` say otherwise (``None``: inherited, ``subprocess.DEVNULL``).
    ``launcher``: arguments run before manage.py (e.g. chaos/skewed.py and its skew)."""
    return subprocess.Popen(
        [sys.executable, *(str(part) for part in launcher), str(ROOT / "manage.py"), *args],
        env=child_env(database=database, **env),
        cwd=ROOT,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )


def settings_refusal(**env: Any) -> str:
    """Run ``manage.py check`` with the environment variables ``env`` (on a SQLite database it
    never creates) and return its standard error; AssertionError if it did not fail. For
    settings that must stop a process at start, naming the variable."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        cwd=ROOT,
        env=child_env(database="sqlite:///unused.sqlite3", **env),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0, f"manage.py check accepted {env}"
    return done.stderr


def manage_output(*args: str, database: str | None = None, timeout: float = 600, **env: Any) -> str:
    """Run ``manage.py args…`` to completion and return its standard output; RuntimeError with
    its standard error if it fails."""
    process = manage(*args, database=database, **env)
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} exited with {process.returncode}:\n{err}")
    return out


def stop(process: "subprocess.Popen[Any]", *, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Send ``sig`` and wait; SIGKILL if the process is still running after ``timeout`` s."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


class Central:
    """gunicorn serving the project on ``port`` (a free one unless given), as in production:
    with the project's gunicorn.conf.py (its worker class and application)."""

    def __init__(
        self,
        *,
        port: int | None = None,
        workers: int = 2,
        database: str | None = None,
        launcher: Iterable[object] = (),
        options: Iterable[str] = (),
        stderr: int | IO[Any] | None = None,
        stdout: int | IO[Any] | None = None,
        **env: Any,
    ) -> None:
        """``launcher``: arguments run before ``-m gunicorn`` (e.g. a clock-skewing wrapper);
        ``options``: further gunicorn options (e.g. ``["--worker-class", "sync"]``, which
        override gunicorn.conf.py); ``stderr``, ``stdout``: where the server's logs and any
        other output go (inherited by default; a file to read them); ``env``: extra
        environment variables (settings) for the server."""
        self.stderr, self.stdout = stderr, stdout
        self.launcher = [str(part) for part in launcher]
        self.options = list(options)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers, self.database, self.env = workers, database, env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> Self:
        """Start gunicorn and wait until /healthz answers 200."""
        self.process = subprocess.Popen(
            [
                sys.executable,
                *self.launcher,
                "-m",
                "gunicorn",
                # The application and worker class are the production ones, from gunicorn.conf.py.
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(self.workers),
                "--log-level",
                "warning",
                "--graceful-timeout",
                "5",
                *self.options,
            ],
            env=child_env(database=self.database, **self.env),
            cwd=ROOT,
            stderr=self.stderr,
            stdout=self.stdout,
        )
        try:
            poll(self.healthy, timeout=timeout, interval=0.1, message="central (gunicorn) did not become healthy")
        except AssertionError:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        """True when /healthz answers 200; AssertionError if gunicorn has exited."""
        assert self.process is not None, "central was not started"
        if self.process.poll() is not None:
            raise AssertionError(f"gunicorn exited with {self.process.returncode}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


class SmtpSink:
    """An SMTP sink in a process of its own: ``python -m <module> --port P --ids-file F``, which
    prints "ready" once listening and, on SIGTERM, writes every received X-Notification-Id to F
    (one line per message). The aiosmtpd server of tests/support/smtp.py by default."""

    def __init__(self, module: str = "tests.support.smtp", *arguments: str) -> None:
        """``arguments``: extra options for the sink (e.g. bench.sink's ``--fail-first``)."""
        self.port = free_port()
        descriptor, name = tempfile.mkstemp(prefix="sink-ids-")
        os.close(descriptor)
        self.ids_file = Path(name)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(self.port), "--ids-file", str(self.ids_file), *arguments],
            cwd=ROOT,
            stdout=PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            stop(self.process)
            raise RuntimeError(f"the SMTP sink ({module}) did not start")

    def stop(self) -> list[str]:
        """Stop the sink; every X-Notification-Id it received, once per message."""
        self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=60)
        ids = self.ids_file.read_text().split()
        self.ids_file.unlink()
        return ids
