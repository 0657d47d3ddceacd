"""A PgBouncer of its own, in transaction pooling mode, in front of a PostgreSQL server.

    with PgBouncer(upstream="postgres://postgres@127.0.0.1:5432") as bouncer:
        url = bouncer.url("outbox")      # postgres://postgres@127.0.0.1:<its port>/outbox

Its configuration, log and pid file live in a temporary directory; every database name is
passed through to the upstream server (``* =``), clients are trusted (like the upstream's
loopback connections in tests), and any user listed is accepted. Debian's ``pgbouncer``
package provides the binary (``PGBOUNCER`` names another). PgBouncer refuses to run as root:
as root it is started as the ``postgres`` user (``-u``).

Also runnable: ``python -m tests.support.pgbouncer --upstream URL`` prints the port and runs
until interrupted.
"""

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlparse

from tests.support.processes import free_port, stop


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    named = os.environ.get("PGBOUNCER")
    if named:
        return named
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(path, os.X_OK)), None
    )


class PgBouncer:
    """PgBouncer in transaction mode on 127.0.0.1:``port`` in front of ``upstream``."""

    def __init__(self, *, upstream: str, port: int | None = None, pool_size: int = 20) -> None:
        parsed = urlparse(upstream)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 5432
        self.user = parsed.username or "postgres"
        self.port = port or free_port()
        self.pool_size = pool_size
        self.directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database}"

    def config(self) -> str:
        d = self.directory
        return "\n".join(
            [
                "[databases]",
                f"* = host={self.upstream_host} port={self.upstream_port}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {d / 'userlist.txt'}",
                "pool_mode = transaction",
                "max_client_conn = 1000",
                f"default_pool_size = {self.pool_size}",
                # As docs/deployment.md has it: after a failed server login, retry in 1 s.
                "server_login_retry = 1",
                # psycopg sends none of these, Django's backend neither; harmless if a tool does.
                "ignore_startup_parameters = extra_float_digits,options",
                f"logfile = {d / 'pgbouncer.log'}",
                f"pidfile = {d / 'pgbouncer.pid'}",
                f"admin_users = {self.user}",
                "",
            ]
        )

    def userlist(self) -> str:
        """The content of ``userlist.txt``: the user, any password (clients are trusted)."""
        return f'"{self.user}" ""\n'

    def start(self, timeout: float = 15) -> Self:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        (self.directory / "pgbouncer.ini").write_text(self.config())
        (self.directory / "userlist.txt").write_text(self.userlist())
        command = [binary, str(self.directory / "pgbouncer.ini")]
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.directory, account.pw_uid, account.pw_gid)
            for path in self.directory.iterdir():
                os.chown(path, account.pw_uid, account.pw_gid)
            command[1:1] = ["-u", "postgres"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.process.poll() is not None:
                _, err = self.process.communicate()
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: {err.decode()}{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not listen on port {self.port}: {self.log()}")
            time.sleep(0.05)
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, sig=signal.SIGTERM, timeout=10)  # SIGTERM: immediate shutdown
            self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    with PgBouncer(upstream=args.upstream, port=args.port) as bouncer:
        print(bouncer.port, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
