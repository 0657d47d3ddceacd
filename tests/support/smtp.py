"""A real SMTP server on loopback (aiosmtpd) whose behaviour a test sets.

    with SmtpServer() as smtp:                      # accepts everything
        smtp.behave("4xx")                           # 451 at DATA
        smtp.behave("5xx")                           # 554 at DATA
        smtp.behave("refuse", refuse={"b@x.org"})   # 550 for those recipients at RCPT TO
        smtp.behave("hang", hang_seconds=30)         # never answers DATA
        smtp.behave("drop")                          # closes the connection at DATA
        smtp.behave("accept", delay_seconds=0.05)    # accepts, slowly
        smtp.wait_for(3)                             # three messages received (or fails)
        smtp.count_by_notification_id()             # Counter of X-Notification-Id values

Options: ``security="starttls"`` or ``"tls"`` (a self-signed certificate for 127.0.0.1 whose
file is ``smtp.ca_file``: point SSL_CERT_FILE at it), ``auth=("user", "password")``.

Also runnable as a sink for benchmarks, counting messages by X-Notification-Id:
``python -m tests.support.smtp --port 2526 --ids-file ids.txt`` (ids written on SIGTERM).
"""

import argparse
import asyncio
import collections
import datetime
import ipaddress
import logging
import re
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

MODES = ("accept", "4xx", "5xx", "refuse", "hang", "drop")
ID_HEADER = re.compile(rb"^X-Notification-Id:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list
    content: bytes
    notification_id: str | None

    @property
    def message(self):
        return message_from_bytes(self.content, policy=default_policy)


class _Handler:
    def __init__(self, server):
        self.server = server

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        with self.server._lock:
            self.server.sessions.add(id(session))
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        owner = self.server
        if owner.mode == "refuse" and address.lower() in owner.refuse:
            return f"{owner.refuse_code} mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        owner = self.server
        mode = owner.mode
        if mode == "4xx":
            return owner.code_4xx
        if mode == "5xx":
            return owner.code_5xx
        if mode == "hang":
            await asyncio.sleep(owner.hang_seconds)
            return "451 4.3.0 too late"
        if mode == "drop":
            server.transport.abort()
            await asyncio.sleep(3600)  # cancelled when aiosmtpd notices the lost connection
        if owner.delay_seconds:
            await asyncio.sleep(owner.delay_seconds)
        owner._record(envelope)
        return "250 OK queued"


class SmtpServer:
    """A controllable aiosmtpd server on 127.0.0.1 (a free port unless given)."""

    def __init__(self, *, port=0, security="none", auth=None, keep_content=True):
        self.host = "127.0.0.1"
        self.port = port or _free_port()
        self.security = security
        self.auth = auth
        self.keep_content = keep_content
        self.mode = "accept"
        self.refuse = set()
        self.refuse_code = 550
        self.code_4xx = "451 4.3.0 try again later"
        self.code_5xx = "554 5.7.1 message rejected"
        self.hang_seconds = 30.0
        self.delay_seconds = 0.0
        self.received = []
        self.ids = collections.Counter()
        self.sessions = set()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.ca_file = None
        self._tmp = None
        self._controller = None

    # --- behaviour ------------------------------------------------------------------------

    def behave(self, mode, *, refuse=(), refuse_code=550, hang_seconds=None, delay_seconds=0.0):
        """Set what the server does next; ``delay_seconds`` slows every accepted DATA."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.refuse = {address.lower() for address in refuse}
        self.refuse_code = refuse_code
        self.delay_seconds = delay_seconds
        if hang_seconds is not None:
            self.hang_seconds = hang_seconds
        return self

    def _record(self, envelope):
        content = envelope.original_content or envelope.content
        header_end = content.find(b"\r\n\r\n")
        match = ID_HEADER.search(content, 0, header_end if header_end >= 0 else len(content))
        notification_id = match.group(1).decode() if match else None
        with self._arrived:
            self.ids[notification_id] += 1
            if self.keep_content:
                self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), content, notification_id))
            self._arrived.notify_all()

    # --- what was received ----------------------------------------------------------------

    @property
    def count(self):
        with self._lock:
            return sum(self.ids.values())

    @property
    def connections(self):
        """Distinct SMTP sessions that sent at least one MAIL FROM."""
        with self._lock:
            return len(self.sessions)

    def count_by_notification_id(self):
        with self._lock:
            return collections.Counter(self.ids)

    def wait_for(self, count, timeout=10.0):
        """Block until ``count`` messages have arrived; AssertionError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while sum(self.ids.values()) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"expected {count} messages, got {sum(self.ids.values())}")
                self._arrived.wait(remaining)

    def reset(self):
        with self._lock:
            self.received.clear()
            self.ids.clear()
            self.sessions.clear()

    # --- life cycle -----------------------------------------------------------------------

    def start(self):
        logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every command
        kwargs = {}
        if self.security in ("starttls", "tls"):
            context = self._tls_context()
            if self.security == "tls":
                kwargs["ssl_context"] = context
            else:
                kwargs["tls_context"] = context
        if self.auth:
            user, password = self.auth
            kwargs.update(auth_require_tls=False, authenticator=_Authenticator(user, password))
        self._controller = Controller(_Handler(self), hostname=self.host, port=self.port, ready_timeout=10,
                                      **kwargs)  # fmt: skip
        self._controller.start()
        return self

    def stop(self):
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _tls_context(self):
        cert, key = _self_signed_certificate()
        self._tmp = tempfile.TemporaryDirectory(prefix="smtp-tls-")
        cert_file, key_file = Path(self._tmp.name) / "cert.pem", Path(self._tmp.name) / "key.pem"
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        self.ca_file = str(cert_file)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context


class _Authenticator:
    def __init__(self, user, password):
        self.user, self.password = user.encode(), password.encode()

    def __call__(self, server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
            self.user,
            self.password,
        )
        return AuthResult(success=ok, handled=False)


@contextmanager
def silent_port():
    """A port that accepts TCP connections but never says a word (an SMTP server that hangs
    before its greeting). Yields the port number."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def closed_port():
    """A port nothing listens on (connection refused)."""
    return _free_port()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed_certificate():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)  # fmt: skip
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()),  # fmt: skip
    )


def main(argv=None):
    """Run an accepting sink until SIGTERM/SIGINT; then write every received X-Notification-Id
    (one line per message) to --ids-file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids-file", required=True)
    args = parser.parse_args(argv)
    server = SmtpServer(port=args.port, keep_content=False).start()
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Set from another thread: Event.set() inside a handler can deadlock with wait().
        signal.signal(signum, lambda *_: threading.Thread(target=stopped.set, daemon=True).start())
    print("ready", flush=True)
    stopped.wait()
    server.stop()
    with open(args.ids_file, "w") as out:
        for notification_id, count in server.count_by_notification_id().items():
            out.write(f"{notification_id}\n" * count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
