"""A real SMTP server on loopback (aiosmtpd) whose behaviour a test sets.

    with SmtpServer() as smtp:                      # accepts everything
        smtp.behave("4xx")                           # 451 at DATA
        smtp.behave("5xx")                           # 554 at DATA
        smtp.behave("refuse", refuse={"b@x.org"})   # 550 for those recipients at RCPT TO
        smtp.behave("hang", hang_seconds=30)         # never answers DATA
        smtp.behave("drop")                          # closes the connection at DATA
        smtp.behave("queue_drop")                    # keeps the message, then closes without a reply
        smtp.behave("accept", delay_seconds=0.05)    # accepts, slowly
        smtp.poison_marker = "POISON"                # accepts those with a NUL in the 250 reply
        smtp.behave("drop", only_for={"b@x.org"})    # 4xx/5xx/hang/drop only for messages to those
        smtp.behave("4xx", reply="421 4.7.0 slow down")  # this reply at DATA (also "5xx")
        smtp.behave("mail", reply="553 5.7.1 sender refused")  # this reply at MAIL FROM
        smtp.behave("throttle", limit=5, window_seconds=1)  # 421 4.7.0 at DATA above 5 a second
        smtp.behave("fail_first")                    # 451 at DATA for each message's first try
        smtp.wait_for(3)                             # three messages received (or fails)
        smtp.count_by_notification_id()             # Counter of X-Notification-Id values
        smtp.accepted_times                          # monotonic time of every accepted message
        smtp.rcpt_limit = 50                         # 452 4.5.3 for the 51st RCPT TO of a transaction
        smtp.too_many_reply = "552 5.5.3 Too many"   # … or this reply instead
        smtp.greylist = {"b@x.org"}                  # 450 4.7.1 at its first RCPT TO, accepted after
        smtp.rcpt_reply = "451 4.3.5 Server configuration problem"  # this answer to every RCPT TO
        smtp.rcpt_replies = {"b@x.org": "450 4.2.0 Greylisted"}    # this answer to these recipients
        smtp.copies_by_recipient()                  # Counter: messages received per envelope recipient

Options: ``pipelining=True`` advertises PIPELINING (RFC 2920: clients then write MAIL FROM,
RCPT TO and DATA together; aiosmtpd reads them in order either way); ``smtputf8=True`` offers SMTPUTF8; ``auth_mechanisms={"NTLM": handler}`` adds AUTH
mechanisms (an aiosmtpd ``auth_<NAME>(server, args)`` coroutine each) and
``auth_exclude=("PLAIN", "LOGIN")`` removes built-in ones; ``smtp.mail_options`` lists the
MAIL FROM parameters of every transaction, ``smtp.auth_attempts`` counts AUTH commands
checked by the password authenticator and ``smtp.auth_log`` records each one as
``(mechanism, login, password)``; ``smtp.ehlos`` counts EHLO commands (clients that got past
the greeting). ``security="starttls"`` or ``"tls"`` (a self-signed certificate for 127.0.0.1 whose
file is ``smtp.ca_file``: point SSL_CERT_FILE at it), ``auth=("user", "password")`` (a failed
login is answered ``smtp.auth_failure_reply``, 535 by default). ``replying_port(greeting)``
is a port whose server greets with a refusal (421 or 554) and says nothing else.

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any, Self

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support.processes import free_port

MODES = ("accept", "4xx", "5xx", "refuse", "hang", "drop", "queue_drop", "mail", "throttle", "fail_first")
TOO_MANY_RECIPIENTS_REPLY = "452 4.5.3 Error: too many recipients"  # Postfix's words
THROTTLE_REPLY = "421 4.7.0 Too many messages, slow down"
ID_HEADER = re.compile(rb"^X-Notification-Id:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    notification_id: str | None

    @property
    def message(self) -> EmailMessage:
        return message_from_bytes(self.content, policy=default_policy)


class _Handler:
    def __init__(self, server: "SmtpServer") -> None:
        self.server = server

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        with self.server._lock:
            self.server.ehlos += 1
        if self.server.pipelining:
            responses.insert(-1, "250-PIPELINING")
        return responses

    async def handle_MAIL(self, server: Any, session: Any, envelope: Any, address: str, mail_options: list[str]) -> str:
        with self.server._lock:
            self.server.sessions.add(id(session))
            self.server.mail_options.append(list(mail_options))
        if self.server.mode == "mail":
            return self.server.mail_reply
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]) -> str:
        owner = self.server
        if owner.rcpt_limit and len(envelope.rcpt_tos) >= owner.rcpt_limit:
            with owner._lock:
                owner.too_many += 1
            return owner.too_many_reply
        if owner.mode == "refuse" and address.lower() in owner.refuse:
            return f"{owner.refuse_code} mailbox unavailable"
        answer = owner.rcpt_replies.get(address.lower(), owner.rcpt_reply)
        if answer:
            return answer
        with owner._lock:
            greylisted = address.lower() in owner.greylist and address.lower() not in owner.greylisted
            if greylisted:
                owner.greylisted.add(address.lower())
        if greylisted:
            return f"450 4.7.1 <{address}>: Recipient address rejected: Greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        owner = self.server
        mode = owner.mode
        if owner.only_for and not owner.only_for & {address.lower() for address in envelope.rcpt_tos}:
            mode = "accept"
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
        if mode == "queue_drop":
            # A relay that queued the message and lost the connection before it could say so.
            owner._record(envelope)
            server.transport.abort()
            await asyncio.sleep(3600)
        if owner.delay_seconds:
            await asyncio.sleep(owner.delay_seconds)
        if mode == "fail_first":
            notification_id = owner.notification_id_of(envelope)
            with owner._lock:
                first = owner.deferred[notification_id] == 0
                if first:
                    owner.deferred[notification_id] += 1
            if first:
                return owner.code_4xx
        # Checked and recorded in one step of the event loop: concurrent sessions cannot both
        # squeeze under the limit.
        if mode == "throttle" and owner.accepted_within(owner.throttle_window) >= owner.throttle_limit:
            with owner._lock:
                owner.throttled += 1
            return THROTTLE_REPLY
        owner._record(envelope)
        content = envelope.original_content or envelope.content or b""
        if owner.poison_marker and owner.poison_marker.encode() in content:
            return owner.poison_reply
        return "250 OK queued"


class SmtpServer:
    """A controllable aiosmtpd server on 127.0.0.1 (a free port unless given)."""

    def __init__(
        self,
        *,
        port: int = 0,
        security: str = "none",
        auth: tuple[str, str] | None = None,
        keep_content: bool = True,
        smtputf8: bool = False,
        pipelining: bool = False,
        auth_mechanisms: dict[str, Any] | None = None,
        auth_exclude: Iterable[str] = (),
    ) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.security = security
        self.auth = auth
        self.keep_content = keep_content
        self.smtputf8 = smtputf8
        self.pipelining = pipelining
        self.auth_mechanisms = auth_mechanisms or {}
        self.auth_exclude = list(auth_exclude)
        self.mail_options: list[list[str]] = []
        self.auth_attempts = 0
        self.auth_log: list[tuple[str, bytes, bytes]] = []  # (mechanism, login, password) per AUTH
        self.ehlos = 0
        self.mode = "accept"
        self.refuse: set[str] = set()
        self.only_for: set[str] = set()
        self.refuse_code = 550
        self.code_4xx = "451 4.3.0 try again later"
        self.code_5xx = "554 5.7.1 message rejected"
        self.hang_seconds = 30.0
        self.delay_seconds = 0.0
        # A message whose content holds poison_marker is accepted with poison_reply (a 250 whose
        # text a database cannot store as it is).
        self.poison_marker: str | None = None
        self.poison_reply = "250 2.0.0 queued as \x00ABC"
        self.mail_reply = "553 5.7.1 sender not allowed"
        self.throttle_limit = 0
        self.throttle_window = 1.0
        self.throttled = 0  # messages refused by the throttle
        self.auth_failure_reply: str | None = None  # None: aiosmtpd's 535
        self.rcpt_limit = 0  # most recipients in one transaction (0: no limit)
        self.too_many_reply = TOO_MANY_RECIPIENTS_REPLY  # the answer to one more
        self.too_many = 0  # RCPT TO answered 452 4.5.3
        self.greylist: set[str] = set()  # refused with 450 4.7.1 the first time, lower-case
        self.greylisted: set[str] = set()  # those refused once already
        # A relay whose lookup table or policy service is down answers every recipient alike.
        self.rcpt_reply: str | None = None
        self.rcpt_replies: dict[str, str] = {}  # per recipient (lower-case)
        self.accepted_times: list[float] = []
        self.deferred: collections.Counter[str | None] = collections.Counter()  # by mode fail_first
        self.received: list[Received] = []
        self.ids: collections.Counter[str | None] = collections.Counter()
        # Copies per (notification id, envelope recipient), kept even without the content.
        self.copies: collections.Counter[tuple[str | None, str]] = collections.Counter()
        self.sessions: set[int] = set()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.ca_file: str | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._controller: Controller | None = None

    # --- behaviour ------------------------------------------------------------------------

    def behave(
        self,
        mode: str,
        *,
        refuse: Iterable[str] = (),
        refuse_code: int = 550,
        hang_seconds: float | None = None,
        delay_seconds: float = 0.0,
        only_for: Iterable[str] = (),
        reply: str | None = None,
        limit: int = 0,
        window_seconds: float = 1.0,
    ) -> Self:
        """Set what the server does next; ``delay_seconds`` slows every accepted DATA.
        ``only_for``: the mode's DATA behaviour applies only to messages with one of these
        envelope recipients; other messages are accepted. ``reply``: the answer of modes "4xx",
        "5xx" (at DATA) and "mail" (at MAIL FROM); ``limit`` and ``window_seconds``: the rate of
        mode "throttle"."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if reply is not None:
            if mode == "4xx":
                self.code_4xx = reply
            elif mode == "5xx":
                self.code_5xx = reply
            elif mode == "mail":
                self.mail_reply = reply
            else:
                raise ValueError("reply applies to modes 4xx, 5xx and mail")
        if mode == "throttle":
            if limit < 1:
                raise ValueError("mode throttle needs a limit of at least 1")
            self.throttle_limit, self.throttle_window = limit, window_seconds
        self.mode = mode
        self.only_for = {address.lower() for address in only_for}
        self.refuse = {address.lower() for address in refuse}
        self.refuse_code = refuse_code
        self.delay_seconds = delay_seconds
        if hang_seconds is not None:
            self.hang_seconds = hang_seconds
        return self

    @staticmethod
    def notification_id_of(envelope: Any) -> str | None:
        """The message's X-Notification-Id (None without one)."""
        content = envelope.original_content or envelope.content
        header_end = content.find(b"\r\n\r\n")
        match = ID_HEADER.search(content, 0, header_end if header_end >= 0 else len(content))
        return match.group(1).decode() if match else None

    def _record(self, envelope: Any) -> None:
        content = envelope.original_content or envelope.content
        notification_id = self.notification_id_of(envelope)
        with self._arrived:
            self.ids[notification_id] += 1
            self.copies.update((notification_id, address.lower()) for address in envelope.rcpt_tos)
            self.accepted_times.append(time.monotonic())
            if self.keep_content:
                self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), content, notification_id))
            self._arrived.notify_all()

    # --- what was received ----------------------------------------------------------------

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self.ids.values())

    @property
    def connections(self) -> int:
        """Distinct SMTP sessions that sent at least one MAIL FROM."""
        with self._lock:
            return len(self.sessions)

    def accepted_within(self, seconds: float) -> int:
        """Messages accepted in the last ``seconds``."""
        since = time.monotonic() - seconds
        with self._lock:
            return sum(1 for moment in self.accepted_times if moment >= since)

    def most_accepted_in_any(self, seconds: float) -> int:
        """The most messages accepted within any window of ``seconds`` so far."""
        with self._lock:
            times = sorted(self.accepted_times)
        most, start = 0, 0
        for end, moment in enumerate(times):
            while moment - times[start] >= seconds:
                start += 1
            most = max(most, end - start + 1)
        return most

    def copies_by_recipient(self) -> collections.Counter[str]:
        """Messages received per envelope recipient (lower-case)."""
        with self._lock:
            return collections.Counter(address.lower() for item in self.received for address in item.rcpt_tos)

    def count_by_notification_id(self) -> collections.Counter[str | None]:
        """Messages received per notification id (one message may reach several recipients)."""
        with self._lock:
            return collections.Counter(self.ids)

    def copies_by_notification_and_recipient(self) -> collections.Counter[tuple[str | None, str]]:
        """Copies received per (notification id, envelope recipient in lower case): a
        notification sent in two transactions, some recipients in each, is one copy each."""
        with self._lock:
            return collections.Counter(self.copies)

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` messages have arrived; AssertionError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while sum(self.ids.values()) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"expected {count} messages, got {sum(self.ids.values())}")
                self._arrived.wait(remaining)

    def reset(self) -> None:
        with self._lock:
            self.received.clear()
            self.ids.clear()
            self.copies.clear()
            self.sessions.clear()
            self.mail_options.clear()
            self.auth_attempts = 0
            self.auth_log.clear()
            self.ehlos = 0
            self.accepted_times.clear()
            self.deferred.clear()
            self.throttled = 0
            self.too_many = 0
            self.greylisted.clear()

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> Self:
        # aiosmtpd logs every command, and a deprecation warning of its own at every login.
        logging.getLogger("mail.log").setLevel(logging.ERROR)
        kwargs: dict[str, Any] = {}
        if self.security in ("starttls", "tls"):
            context = self._tls_context()
            if self.security == "tls":
                kwargs["ssl_context"] = context
            else:
                kwargs["tls_context"] = context
        if self.auth:
            user, password = self.auth
            kwargs.update(auth_require_tls=False, authenticator=_Authenticator(self, user, password))
        handler = _Handler(self)
        for name, method in self.auth_mechanisms.items():
            setattr(handler, f"auth_{name.replace('-', '__')}", method)
        if self.auth_mechanisms or self.auth_exclude:
            kwargs.update(auth_require_tls=False, auth_exclude_mechanism=self.auth_exclude)
        controller = Controller(
            handler,
            hostname=self.host,
            port=self.port,
            ready_timeout=10,
            enable_SMTPUTF8=self.smtputf8,
            **kwargs,
        )
        controller.start()
        self._controller = controller
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _tls_context(self) -> ssl.SSLContext:
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
    def __init__(self, owner: SmtpServer, user: str, password: str) -> None:
        self.owner = owner
        self.user, self.password = user.encode(), password.encode()

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: object) -> AuthResult:
        with self.owner._lock:
            self.owner.auth_attempts += 1
            if isinstance(auth_data, LoginPassword):
                self.owner.auth_log.append((mechanism, auth_data.login, auth_data.password))
        ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
            self.user,
            self.password,
        )
        return AuthResult(success=ok, handled=False, message=None if ok else self.owner.auth_failure_reply)


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections but never says a word (an SMTP server that hangs
    before its greeting). Yields the port number."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@contextmanager
def serving_port(session: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A port on 127.0.0.1 whose server runs ``session(connection, stopping)`` for each
    connection in turn, on one thread (a client gone mid-session ends it quietly); every
    connection stays open until the port closes, when ``stopping`` is set and every connection
    is shut down, which ends a session waiting on it at once. Yields the port number. For
    servers that misbehave the way real ones can."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(0.1)  # so that the serving thread notices the end
    stopping = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)
            with suppress(OSError):
                session(conn, stopping)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopping.set()
        for conn in held:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=10)
        listener.close()
        for conn in held:
            conn.close()


@contextmanager
def replying_port(greeting: str) -> Iterator[int]:
    """A port whose server greets every connection with ``greeting`` (e.g. "554 5.7.1 no
    service for you") and then only listens until the client goes. Yields the port number."""

    def session(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(greeting.encode() + b"\r\n")
        while conn.recv(1024):
            pass

    with serving_port(session) as port:
        yield port


def closed_port() -> int:
    """A port nothing listens on (connection refused)."""
    return free_port()


def _self_signed_certificate() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def main(argv: list[str] | None = None) -> int:
    """Run an accepting sink until SIGTERM/SIGINT; then write every received X-Notification-Id
    (one line per message) to --ids-file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids-file", required=True)
    args = parser.parse_args(argv)
    # Blocked before the server's thread starts (threads inherit the mask), taken with sigwait:
    # no handler runs, so nothing interrupts a wait half-way.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = SmtpServer(port=args.port, keep_content=False).start()
    print("ready", flush=True)
    signal.sigwait(stop_signals)
    server.stop()
    with open(args.ids_file, "w") as out:
        for notification_id, count in server.count_by_notification_id().items():
            out.write(f"{notification_id}\n" * count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
