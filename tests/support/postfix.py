"""A real Postfix relay for tests, configured like a corporate submission server.

    from tests.support.postfix import PostfixRelay, postfix_or_skip

    postfix_or_skip()                      # skips without Postfix; FAILS under CI=true
    with SmtpServer() as sink, PostfixRelay(sink=sink) as relay:
        relay.host, relay.port             # 127.0.0.1 and a free port (STARTTLS required)
        relay.ca_file                      # the test CA's certificate (PEM): SmtpConfiguration.ca_file
        relay.username, relay.password     # a Cyrus SASL (sasldb) account; AUTH is required to relay
        relay.add_user("other", "pw")      # another account
        relay.log_count("authentication failed")  # lines of Postfix's log holding that text
        relay.wait_until_idle()            # the queue is empty (everything handed to the sink)

What it runs: ``postfix -c <tmp>/etc start`` with its own configuration, queue and data
directories under a temporary directory (the system's Postfix is never touched or started),
``smtpd`` on 127.0.0.1 only, TLS required before anything else (``smtpd_tls_security_level =
encrypt``) with a server certificate issued by a CA the fixture generates, SASL required for
relaying (``permit_sasl_authenticated``, no ``mynetworks``), AUTH PLAIN and LOGIN over Cyrus
SASL with a sasldb file, and everything relayed to ``sink`` (an aiosmtpd server from
tests/support/smtp.py) through ``relayhost``.

Options (keyword arguments of :class:`PostfixRelay`): ``recipient_limit`` (50, Postfix's
``smtpd_recipient_limit``), ``message_size_limit`` (10 MB), ``reject_non_fqdn_helo`` (False:
with True, ``smtpd_helo_restrictions = reject_non_fqdn_helo_hostname``), ``policy`` (a
:class:`PolicyService`: every recipient is checked with ``check_policy_service`` first),
``extra`` (more main.cf parameters, a dict).

    with PolicyService() as policy, PostfixRelay(sink=sink, policy=policy) as relay:
        policy.action = "451 4.3.5 Policy service unavailable"   # every RCPT TO answered so
        policy.action = "DUNNO"                                  # no opinion: relayed again

Needs Debian's ``postfix``, ``sasl2-bin`` and ``libsasl2-modules`` and root (Postfix's master
runs as root and drops to the ``postfix`` user). :func:`postfix_or_skip` skips a test with the
reason when Postfix is not installed, unless CI=true is set: then a missing Postfix fails.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import pytest

from tests.support.processes import free_port
from tests.support.smtp import SmtpServer

POSTFIX = "/usr/sbin/postfix"
POSTCONF = "/usr/sbin/postconf"
SASLPASSWD2 = "/usr/sbin/saslpasswd2"
REALM = "outbox.test"


def postfix_missing() -> str | None:
    """Why a real Postfix cannot run here, or None."""
    for program in (POSTFIX, POSTCONF, SASLPASSWD2):
        if not os.access(program, os.X_OK):
            return f"{program} is not installed (Debian packages postfix, sasl2-bin, libsasl2-modules)"
    if not Path("/usr/lib/x86_64-linux-gnu/sasl2").exists() and not list(Path("/usr/lib").glob("*/sasl2/libplain*")):
        return "Cyrus SASL modules are not installed (libsasl2-modules)"
    if os.geteuid() != 0:
        return "Postfix's master must be started as root"
    return None


def postfix_or_skip() -> None:
    """Skip the calling test when Postfix cannot run, with the reason; under CI=true fail
    instead (CI installs it: .ci/run)."""
    reason = postfix_missing()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but a real Postfix cannot run: {reason}")
    pytest.skip(reason)


class PolicyService:
    """A Postfix policy delegation server on loopback (the protocol of Postfix's
    SMTPD_POLICY_README: a request is ``name=value`` lines ended by an empty line, the answer
    ``action=…`` and an empty line; a connection carries many requests). It answers every
    request with ``action``, which a test may change at any time; ``requests`` counts them."""

    def __init__(self) -> None:
        self.action = "DUNNO"
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            while not self._closed.is_set():
                request = []
                for raw in lines:
                    line = raw.rstrip(b"\r\n")
                    if not line:
                        break
                    request.append(line)
                else:
                    return  # Postfix closed the connection
                with self._lock:
                    self.requests += 1
                    action = self.action
                conn.sendall(f"action={action}\n\n".encode())

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class PostfixRelay:
    """A Postfix instance relaying to ``sink``; a context manager (start/stop)."""

    def __init__(
        self,
        *,
        sink: SmtpServer,
        username: str = "outbox",
        password: str = "relay-pw-1",
        recipient_limit: int = 50,
        message_size_limit: int = 10_000_000,
        reject_non_fqdn_helo: bool = False,
        policy: PolicyService | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.sink = sink
        self.host = "127.0.0.1"
        self.port = free_port()
        self.username, self.password = username, password
        self.recipient_limit = recipient_limit
        self.message_size_limit = message_size_limit
        self.reject_non_fqdn_helo = reject_non_fqdn_helo
        self.policy = policy
        self.extra = extra or {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.root = Path()
        self.ca_file = ""
        self._started = False

    # --- paths ----------------------------------------------------------------------------

    @property
    def config_dir(self) -> Path:
        return self.root / "etc"

    @property
    def log_file(self) -> Path:
        return self.root / "maillog"

    @property
    def sasldb(self) -> Path:
        return self.root / "sasl" / "sasldb2"

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> Self:
        self._tmp = tempfile.TemporaryDirectory(prefix="postfix-test-")
        self.root = Path(self._tmp.name)
        os.chmod(self.root, 0o755)  # the postfix user reads its files below
        for name in ("etc", "queue", "data", "sasl", "tls"):  # sasl: the sasldb file
            (self.root / name).mkdir()
        shutil.chown(self.root / "data", "postfix")  # Postfix's own state (the TLS session cache)
        self._write_tls()
        self._write_sasl()
        self._write_config()
        self._postfix("check")
        self._postfix("start")
        self._started = True
        self._wait_listening()
        return self

    def stop(self) -> None:
        if self._started:
            self._postfix("stop", check=False)
            self._wait_stopped()
            self._started = False
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- accounts and observations --------------------------------------------------------

    def add_user(self, username: str, password: str) -> None:
        """Create (or change the password of) a SASL account."""
        subprocess.run(
            [SASLPASSWD2, "-p", "-c", "-f", str(self.sasldb), "-u", REALM, "-a", "smtpd", username],
            input=password.encode(),
            check=True,
            capture_output=True,
        )
        shutil.chown(self.sasldb, "root", "postfix")
        os.chmod(self.sasldb, 0o640)

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_count(self, text: str) -> int:
        """How many lines of Postfix's log contain ``text``."""
        return sum(1 for line in self.log_text().splitlines() if text in line)

    def wait_until_idle(self, timeout: float = 20.0) -> None:
        """Wait until Postfix's queue is empty (every message relayed or bounced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(
                p.is_file()
                for name in ("incoming", "active", "deferred", "maildrop")
                for p in (self.root / "queue" / name).rglob("*")
            ):
                return
            time.sleep(0.1)
        raise AssertionError(f"Postfix's queue did not empty within {timeout} s:\n{self.log_text()[-3000:]}")

    # --- set-up ---------------------------------------------------------------------------

    def _postfix(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(
            [POSTFIX, "-c", str(self.config_dir), *args], check=False, capture_output=True, timeout=60
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"postfix {' '.join(args)} failed ({result.returncode}): {result.stderr.decode(errors='replace')}"
                f"{result.stdout.decode(errors='replace')}"
                f"\n{self.log_text()[-3000:]}"
            )
        return result

    def _postconf(self, *args: str) -> None:
        subprocess.run([POSTCONF, "-c", str(self.config_dir), *args], check=True, capture_output=True)

    def _wait_listening(self) -> None:
        import socket

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.settimeout(0.5)
                if probe.connect_ex((self.host, self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"Postfix did not listen on {self.host}:{self.port}:\n{self.log_text()[-3000:]}")

    def _wait_stopped(self) -> None:
        pid_file = self.root / "queue" / "pid" / "master.pid"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and pid_file.exists():
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, 0)
            except (ValueError, ProcessLookupError, FileNotFoundError):
                return
            time.sleep(0.1)

    def _write_tls(self) -> None:
        ca_cert, server_cert, server_key = ca_and_server_certificate()
        tls = self.root / "tls"
        (tls / "ca.pem").write_bytes(ca_cert)
        (tls / "server.pem").write_bytes(server_cert)
        (tls / "server.key").write_bytes(server_key)
        os.chmod(tls / "server.key", 0o600)
        self.ca_file = str(tls / "ca.pem")

    def _write_sasl(self) -> None:
        # Debian's Postfix reads the Cyrus configuration from <config_directory>/sasl/smtpd.conf
        # (cyrus_sasl_config_path is not consulted).
        (self.config_dir / "sasl").mkdir()
        (self.config_dir / "sasl" / "smtpd.conf").write_text(
            f"pwcheck_method: auxprop\nauxprop_plugin: sasldb\nmech_list: PLAIN LOGIN\nsasldb_path: {self.sasldb}\n"
        )
        os.chmod(self.root / "sasl", 0o755)
        self.add_user(self.username, self.password)

    def _write_config(self) -> None:
        etc = self.config_dir
        shutil.copy("/usr/share/postfix/master.cf.dist", etc / "master.cf")
        (etc / "main.cf").write_text("")
        parameters: dict[str, Any] = {
            "compatibility_level": "3.6",
            "config_directory": str(etc),
            "queue_directory": str(self.root / "queue"),
            "data_directory": str(self.root / "data"),
            "mail_owner": "postfix",
            "setgid_group": "postdrop",
            "maillog_file": str(self.log_file),
            "maillog_file_prefixes": str(self.root),
            "inet_interfaces": "127.0.0.1",
            "inet_protocols": "ipv4",
            "myhostname": f"relay.{REALM}",
            "mydomain": REALM,
            "myorigin": REALM,
            "mydestination": "",
            "local_transport": "error:no local delivery",
            "alias_maps": "",
            "alias_database": "",
            "mynetworks": "127.0.0.1/32",
            "relayhost": f"[{self.sink.host}]:{self.sink.port}",
            "smtp_tls_security_level": "none",
            "smtp_dns_support_level": "disabled",
            "smtpd_peername_lookup": "no",
            "smtputf8_enable": "yes",
            "smtpd_tls_security_level": "encrypt",
            "smtpd_tls_auth_only": "yes",
            "smtpd_tls_cert_file": str(self.root / "tls" / "server.pem"),
            "smtpd_tls_key_file": str(self.root / "tls" / "server.key"),
            "smtpd_sasl_auth_enable": "yes",
            "smtpd_sasl_type": "cyrus",
            "smtpd_sasl_path": "smtpd",
            "smtpd_sasl_local_domain": REALM,
            "smtpd_sasl_security_options": "noanonymous",
            "smtpd_relay_restrictions": "permit_sasl_authenticated, reject",
            "smtpd_recipient_restrictions": (
                f"check_policy_service inet:127.0.0.1:{self.policy.port}, " if self.policy else ""
            )
            + "permit_sasl_authenticated, reject",
            "smtpd_helo_required": "yes",
            "smtpd_helo_restrictions": "reject_non_fqdn_helo_hostname" if self.reject_non_fqdn_helo else "",
            "smtpd_recipient_limit": str(self.recipient_limit),
            "message_size_limit": str(self.message_size_limit),
            # A test sends bursts from one address: no rate limits or error penalties to wait out.
            "smtpd_error_sleep_time": "0",
            "smtpd_soft_error_limit": "1000",
            "smtpd_hard_error_limit": "1000",
            "smtpd_client_connection_rate_limit": "0",
            "smtpd_client_auth_rate_limit": "0",
            "queue_run_delay": "1s",
            "minimal_backoff_time": "1s",
            "maximal_backoff_time": "2s",
            "biff": "no",
            **self.extra,
        }
        self._postconf(*(f"{name}={value}" for name, value in parameters.items()))
        # Our own smtpd port instead of 25, nothing chrooted (the queue is in a temporary
        # directory), and the log service that writes maillog_file.
        self._postconf("-X", "-M", "smtp/inet")
        self._postconf("-M", f"{self.host}:{self.port}/inet={self.host}:{self.port} inet n - n - - smtpd")
        self._postconf("-F", "*/*/chroot=n")
        master = (etc / "master.cf").read_text()
        if "postlog" not in master:
            (etc / "master.cf").write_text(
                master + "postlog   unix-dgram n  -       n       -       1       postlogd\n"
            )


def ca_and_server_certificate() -> tuple[bytes, bytes, bytes]:
    """A CA certificate, and a server certificate for 127.0.0.1 and localhost it signed (with
    the server's key), all PEM (tests/agent/certs.py makes them)."""
    from tests.agent.certs import ca_and_server_pem

    return ca_and_server_pem()
