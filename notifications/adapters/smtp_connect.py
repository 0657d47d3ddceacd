"""Opening an SMTP connection the way the configuration says: TCP (or implicit TLS), the
greeting, EHLO with our name, STARTTLS, EHLO again, and authentication.

The email adapter's session calls :func:`smtp_open` for every new connection, for deliveries
and for the console's "Send test email" alike, so both go through one code path.

* **Trust and identity.** Server certificates are verified against the system's trust store
  plus, when set, the configuration's ``ca_file`` (a private CA); ``client_cert`` and
  ``client_key`` present a client certificate; ``local_hostname`` is the name sent with EHLO
  (default: this host's fully qualified name).
* **A fast answer to a wrong port.** A server that sends nothing within
  :data:`GREETING_FIRST_BYTE_SECONDS` after the TCP connection is usually an implicit-TLS
  port (465) spoken to in plain text; the connection fails then, not after the full timeout.
  Only the first byte is awaited that briefly: relays that pause mid-greeting (Postfix's
  postscreen) have the configured timeout for the rest.
* **One AUTH, one mechanism.** smtplib's ``login`` tries every common mechanism in turn, two
  or three failed logins per connection; here one mechanism is chosen from what the server
  offers and tried once. A session (one dispatch pass) remembers an authentication failure
  (:class:`AuthGate`) and fails its later connections with it without connecting again, and
  connections wait for the first AUTH of the pass to succeed before trying theirs, so a wrong
  password costs one failed login per pass, never a burst that locks the account.
* **Waits in the kernel once connected.** A plaintext connection, once it is set up, waits for
  the server with the kernel's own socket timeouts (``SO_RCVTIMEO``/``SO_SNDTIMEO``) on a
  blocking socket instead of Python's: each read or write is then one system call instead of
  a ``poll`` and the call, and a thread gives up the interpreter lock once per call instead of
  twice. With eight delivery threads, measured on two cores, that is a third less CPU a
  message (:func:`transfer_mode`). This is how a connection waits when its conversation runs
  blocking (notifications.adapters.smtp_steps: the console's test email, or dispatch with
  ``OUTBOX_DELIVERY_LOOP=false``); a dispatch pass's own loop makes the socket non-blocking. Writes larger than :data:`KERNEL_SEND_BYTES` keep Python's
  timeout, which bounds the whole write (the kernel's restarts whenever the server reads a
  little). TLS connections keep Python's timeouts: on a blocking TLS socket a read that timed
  out in the kernel would be retried by the ssl module, never raised.
"""

import contextlib
import io
import smtplib
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from notifications.adapters.base import DeliveryError, FailureClass

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# How long the server may stay silent before its first byte (see the module docstring).
GREETING_FIRST_BYTE_SECONDS = 5.0
# The implicit-TLS submission port (RFC 8314).
IMPLICIT_TLS_PORT = 465
# Password mechanisms in the order they are preferred when the connection is encrypted;
# without encryption CRAM-MD5 (which does not send the password) comes first.
PASSWORD_MECHANISMS = ("PLAIN", "LOGIN", "CRAM-MD5")
# Kernel socket timeouts (see the module docstring) are set as a Linux ``struct timeval``;
# elsewhere connections keep Python's timeouts.
KERNEL_TIMEOUTS = sys.platform.startswith("linux")
# Writes larger than this (a message with attachments) use Python's timeout even then: it
# bounds the whole write, where the kernel's restarts with every piece the server takes. A
# write this small goes into the socket's buffer at once (Linux starts it at 16 KiB).
KERNEL_SEND_BYTES = 16 * 1024
# The shortest kernel timeout set (zero would mean "wait for ever").
MIN_KERNEL_TIMEOUT = 0.001


class ConnectFailure(smtplib.SMTPException):
    """A connection could not be opened, with the DeliveryError already classified (and given
    its hint). An smtplib exception so that every ``except smtplib.SMTPException`` around a
    connection catches it; the adapter's ``classify`` hands back ``error`` as it is."""

    def __init__(self, error: DeliveryError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class ConnectSettings:
    """What opening a connection needs, copied from the SMTP configuration so that worker
    threads never touch the database."""

    host: str
    port: int
    security: str
    timeout: float
    username: str = ""
    password: str = ""
    local_hostname: str = ""
    ca_file: str = ""
    client_cert: str = ""
    client_key: str = ""
    auth_method: str = "password"
    oauth_tenant_id: str = ""
    oauth_client_id: str = ""
    oauth_client_secret: str = ""
    oauth_client_certificate: str = ""
    oauth_authority: str = ""

    @classmethod
    def of(cls, config: Any) -> "ConnectSettings":
        """The settings of an SmtpConfiguration (saved or not)."""
        return cls(
            host=config.host,
            port=config.port,
            security=config.security,
            timeout=config.timeout_seconds,
            username=config.username,
            password=config.password,
            local_hostname=config.local_hostname,
            ca_file=config.ca_file,
            client_cert=config.client_cert,
            client_key=config.client_key,
            auth_method=config.auth_method,
            oauth_tenant_id=config.oauth_tenant_id,
            oauth_client_id=config.oauth_client_id,
            oauth_client_secret=config.oauth_client_secret,
            oauth_client_certificate=config.oauth_client_certificate,
            oauth_authority=config.oauth_authority,
        )

    @property
    def authenticates(self) -> bool:
        return bool(self.username)

    @property
    def ehlo_name(self) -> str:
        return self.local_hostname or default_local_hostname()


class AuthGate:
    """One session's memory of authentication: the first AUTH runs alone (other connections
    wait for its outcome) and a failure is kept, so that no later connection of the session
    tries again. A new session (the next dispatch pass) tries once more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proven = False
        self.failure: DeliveryError | None = None

    def run(self, authenticate: Callable[[], None], classify: Callable[[BaseException], DeliveryError]) -> None:
        """Call ``authenticate`` unless an earlier AUTH of the session failed (then raise
        ConnectFailure with that failure again); a failure is classified and remembered."""
        if self._proven:
            self._attempt(authenticate, classify)
            return
        with self._lock:
            if self.failure is not None:
                raise ConnectFailure(self.failure)
            self._attempt(authenticate, classify)
            self._proven = True

    def _attempt(self, authenticate: Callable[[], None], classify: Callable[[BaseException], DeliveryError]) -> None:
        try:
            authenticate()
        except ConnectFailure as failure:
            self.failure = failure.error
            raise
        except (smtplib.SMTPException, OSError) as exc:
            error = classify(exc)
            if error.failure_class in (FailureClass.AUTH, FailureClass.CONFIGURATION):
                self.failure = error
            raise ConnectFailure(error) from exc

    def check(self) -> None:
        """Raise ConnectFailure when the session already knows that AUTH fails."""
        failure = self.failure
        if failure is not None:
            raise ConnectFailure(failure)


@lru_cache(maxsize=4096)
def _quoted(address: str) -> str:
    """smtplib's ``quoteaddr`` (``<address>`` as MAIL FROM and RCPT TO write it), remembered:
    it parses the address with email.utils.parseaddr, which cost a fifth of a delivery's CPU
    when done for every command of every message to the same few addresses."""
    return smtplib.quoteaddr(address)


class _QuotingOnce:
    """``mail`` and ``rcpt`` exactly as smtplib writes them, with the address quoted by
    :func:`_quoted`; and the same commands as lines, for writing several at once
    (the email adapter's pipelined transaction, RFC 2920)."""

    def mail_command(self: Any, sender: str, options: Sequence[str] = ()) -> str:
        optionlist = ""
        if options and self.does_esmtp:
            if any(option.lower() == "smtputf8" for option in options):
                if not self.has_extn("smtputf8"):
                    raise smtplib.SMTPNotSupportedError("SMTPUTF8 not supported by server")
                self.command_encoding = "utf-8"
            optionlist = " " + " ".join(options)
        return _line(f"mail FROM:{_quoted(sender)}{optionlist}")

    def rcpt_command(self: Any, recip: str, options: Sequence[str] = ()) -> str:
        optionlist = " " + " ".join(options) if options and self.does_esmtp else ""
        return _line(f"rcpt TO:{_quoted(recip)}{optionlist}")

    def mail(self: Any, sender: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        self.send(self.mail_command(sender, options))
        return self.getreply()

    def rcpt(self: Any, recip: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        self.send(self.rcpt_command(recip, options))
        return self.getreply()


def _line(command: str) -> str:
    """``command`` as a line, refused (ValueError, as smtplib's putcmd refuses it) when it holds
    a line break: it would be a second command."""
    if "\r" in command or "\n" in command:
        raise ValueError(f"command and arguments contain prohibited newline characters: {command!r}")
    return f"{command}\r\n"


class _Receiver(io.RawIOBase):
    """The reading side of a plaintext connection (smtplib reads replies through a buffered
    reader over it): ``recv_into``, with a read that timed out in the kernel (``EAGAIN`` once
    ``SO_RCVTIMEO`` has passed, see :func:`transfer_mode`) raised as the TimeoutError a Python
    timeout raises, so both read the same to the caller (a failure of class timeout).

    ``wait_until`` (a ``time.monotonic()`` time, set by :func:`reply_wait`) lets the reads wait
    longer than the connection's timeout: a read that timed out waits again for what is left,
    and only then fails. The answer to a message's end usually comes well within the
    connection's timeout, so the longer wait costs no system call unless it is needed."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.wait_until: float | None = None
        self.extended = False  # SO_RCVTIMEO was changed for a longer wait

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                return self._sock.recv_into(buffer)
            except BlockingIOError as exc:
                left = 0.0 if self.wait_until is None else self.wait_until - time.monotonic()
                if left < MIN_KERNEL_TIMEOUT:
                    raise TimeoutError("timed out") from exc
                _kernel_timeout(self._sock, socket.SO_RCVTIMEO, left)
                self.extended = True


class _SMTP(_QuotingOnce, smtplib.SMTP):
    """smtplib.SMTP waiting only :data:`GREETING_FIRST_BYTE_SECONDS` for the greeting's first
    byte, and able to wait with kernel timeouts once set up (:func:`transfer_mode`)."""

    _greeting = False
    kernel_timeouts = False  # set by transfer_mode
    receiver: _Receiver | None = None  # the reading side of a plaintext connection

    def connect(self, host: str = "localhost", port: int = 0, source_address: Any = None) -> tuple[int, bytes]:
        self._greeting = True
        try:
            return super().connect(host, port, source_address)
        finally:
            self._greeting = False

    def getreply(self) -> tuple[int, bytes]:
        if self._greeting and self.sock is not None and not isinstance(self.sock, ssl.SSLSocket):
            self._greeting = False
            wait = min(GREETING_FIRST_BYTE_SECONDS, self.timeout) if self.timeout else GREETING_FIRST_BYTE_SECONDS
            self.sock.settimeout(wait)
            try:
                self.sock.recv(1, socket.MSG_PEEK)
            except TimeoutError as exc:
                raise NoGreeting(wait) from exc
            finally:
                self.sock.settimeout(self.timeout)
        if self.file is None and self.sock is not None and not isinstance(self.sock, ssl.SSLSocket):
            self.receiver = _Receiver(self.sock)
            self.file = io.BufferedReader(self.receiver)
        return super().getreply()

    def send(self, s: "ReadableBuffer | str") -> None:
        sock = self.sock
        if self.kernel_timeouts and sock is not None and len(s) > KERNEL_SEND_BYTES:  # type: ignore[arg-type]
            # The kernel's timeout is per call and restarts whenever the server takes a little:
            # a server reading a byte at a time would hold a large message past the lease.
            # Python's bounds the whole write.
            sock.settimeout(self.timeout)
            try:
                super().send(s)
            finally:
                if self.sock is not None:
                    self.sock.settimeout(None)
            return
        try:
            super().send(s)
        except smtplib.SMTPServerDisconnected as exc:
            if isinstance(exc.__context__, BlockingIOError):  # SO_SNDTIMEO passed: a timeout
                raise smtplib.SMTPServerDisconnected("Server not connected: timed out") from TimeoutError("timed out")
            raise


def transfer_mode(smtp: smtplib.SMTP) -> None:
    """Once ``smtp`` is set up (greeted, EHLO, authenticated): a plaintext connection waits
    from now on with the kernel's timeouts, ``smtp.timeout`` for every read and write, on a
    blocking socket (see the module docstring). A TLS connection, or one on a system other
    than Linux, is left as it is."""
    sock = smtp.sock
    if not (KERNEL_TIMEOUTS and isinstance(smtp, _SMTP) and smtp.timeout and sock is not None):
        return
    if isinstance(sock, ssl.SSLSocket):
        return
    _kernel_timeout(sock, socket.SO_SNDTIMEO, smtp.timeout)
    _kernel_timeout(sock, socket.SO_RCVTIMEO, smtp.timeout)
    sock.settimeout(None)
    smtp.kernel_timeouts = True


@contextlib.contextmanager
def reply_wait(smtp: smtplib.SMTP, seconds: float) -> Iterator[None]:
    """Within: reads of ``smtp`` wait up to ``seconds`` (the answer to a message's end), then
    the connection's timeout again, in whichever way the connection waits
    (:func:`transfer_mode`)."""
    receiver = getattr(smtp, "receiver", None)
    if not getattr(smtp, "kernel_timeouts", False) or receiver is None:
        if smtp.sock is not None:
            smtp.sock.settimeout(seconds)
        try:
            yield
        finally:
            if smtp.sock is not None:
                smtp.sock.settimeout(smtp.timeout)
        return
    receiver.wait_until = time.monotonic() + seconds
    if seconds < smtp.timeout and smtp.sock is not None:  # shorter than the connection's: at once
        _kernel_timeout(smtp.sock, socket.SO_RCVTIMEO, seconds)
        receiver.extended = True
    try:
        yield
    finally:
        receiver.wait_until = None
        if receiver.extended and smtp.sock is not None:
            _kernel_timeout(smtp.sock, socket.SO_RCVTIMEO, smtp.timeout)
        receiver.extended = False


def _kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """Set ``option`` (SO_RCVTIMEO or SO_SNDTIMEO) to ``seconds``, never to zero (which would
    mean "wait for ever")."""
    micros = max(int(seconds * 1_000_000), int(MIN_KERNEL_TIMEOUT * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("@ll", micros // 1_000_000, micros % 1_000_000))


class _SMTP_SSL(_QuotingOnce, smtplib.SMTP_SSL):
    pass


class NoGreeting(TimeoutError):
    """The server said nothing within the greeting's first-byte wait."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no greeting within {seconds:g} s")
        self.seconds = seconds


def tls_context(settings: ConnectSettings) -> ssl.SSLContext:
    """The client TLS context: the system's trust store, plus ``ca_file``; the client
    certificate when configured. Raises DeliveryError (configuration) naming a file that does
    not load."""
    context = ssl.create_default_context()
    try:
        if settings.ca_file:
            context.load_verify_locations(cafile=settings.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise DeliveryError(
            f"The CA file {settings.ca_file!r} of the SMTP configuration cannot be loaded: {exc}",
            failure_class=FailureClass.CONFIGURATION,
            detail={"stage": "connect"},
        ) from exc
    try:
        if settings.client_cert:
            context.load_cert_chain(settings.client_cert, settings.client_key or None)
    except (OSError, ssl.SSLError) as exc:
        raise DeliveryError(
            f"The client certificate {settings.client_cert!r} (key {settings.client_key or 'in the same file'!r}) "
            f"of the SMTP configuration cannot be loaded: {exc}",
            failure_class=FailureClass.CONFIGURATION,
            detail={"stage": "connect"},
        ) from exc
    return context


def smtp_open(
    settings: ConnectSettings,
    *,
    context: ssl.SSLContext | None,
    gate: AuthGate,
    classify: Callable[[BaseException], DeliveryError],
    token: Callable[[], str] | None = None,
) -> smtplib.SMTP:
    """A connected, greeted (EHLO), encrypted (as configured) and authenticated connection.
    Raises smtplib/OS errors (tagged with ``stage``) or ConnectFailure. ``token`` gives the
    OAuth access token for ``auth_method`` xoauth2."""
    if settings.authenticates:
        gate.check()  # AUTH already failed in this session: do not even connect
    smtp: smtplib.SMTP
    stage = "connect"
    try:
        if settings.security == "tls":
            smtp = _SMTP_SSL(local_hostname=settings.ehlo_name, timeout=settings.timeout, context=context)
        else:
            smtp = _SMTP(local_hostname=settings.ehlo_name, timeout=settings.timeout)
        setattr(smtp, "_host", settings.host)  # noqa: B010 (TLS server_hostname; smtplib sets it only in __init__)
        code, reply = smtp.connect(settings.host, settings.port)
        if code != 220:
            _close(smtp)
            raise smtplib.SMTPConnectError(code, reply)
    except (smtplib.SMTPException, OSError) as exc:
        exc.stage = stage  # type: ignore[attr-defined]
        raise
    try:
        stage = "EHLO"
        _ehlo(smtp)
        if settings.security == "starttls":
            stage = "STARTTLS"
            smtp.starttls(context=context)
            stage = "EHLO"
            _ehlo(smtp)
        if settings.authenticates:
            stage = "AUTH"
            gate.run(lambda: _authenticate(smtp, settings, token), classify)
    except BaseException as exc:
        if isinstance(exc, (smtplib.SMTPException, OSError)) and not hasattr(exc, "stage"):
            exc.stage = stage  # type: ignore[attr-defined]
        _close(smtp)
        raise
    transfer_mode(smtp)
    return smtp


def _ehlo(smtp: smtplib.SMTP) -> None:
    """EHLO, falling back to HELO as smtplib does; a refusal of both raises SMTPHeloError."""
    code, reply = smtp.ehlo()
    if code == 250:
        return
    code, reply = smtp.helo()
    if code != 250:
        raise smtplib.SMTPHeloError(code, reply)


def _authenticate(smtp: smtplib.SMTP, settings: ConnectSettings, token: Callable[[], str] | None) -> None:
    """One AUTH command with the best mechanism the server offers for the configured method."""
    if not smtp.has_extn("auth"):
        raise ConnectFailure(
            DeliveryError(
                "The SMTP server does not offer authentication (no AUTH in its EHLO reply"
                + (" before STARTTLS: set security=starttls or tls" if settings.security == "none" else "")
                + "), but the SMTP configuration has a username.",
                failure_class=FailureClass.CONFIGURATION,
                detail={"stage": "AUTH"},
            )
        )
    offered = smtp.esmtp_features["auth"].upper().split()
    if settings.auth_method == "xoauth2":
        if "XOAUTH2" not in offered:
            raise _no_mechanism(offered, wanted="XOAUTH2 (auth_method xoauth2)")
        assert token is not None, "xoauth2 needs a token source"
        access_token = token()
        sasl = xoauth2_string(settings.username, access_token)
        # On a refused token the server sends a 334 with its error (JSON) and waits for an
        # empty line before its 535: the second call answers that challenge with nothing.
        smtp.auth("XOAUTH2", _XOAuth2(sasl))
        return
    order = PASSWORD_MECHANISMS if settings.security != "none" else ("CRAM-MD5", "PLAIN", "LOGIN")
    mechanism = next((name for name in order if name in offered), None)
    if mechanism is None:
        raise _no_mechanism(offered, wanted="PLAIN, LOGIN or CRAM-MD5 (auth_method password)")
    smtp.user, smtp.password = settings.username, settings.password
    method = {"PLAIN": smtp.auth_plain, "LOGIN": smtp.auth_login, "CRAM-MD5": smtp.auth_cram_md5}[mechanism]
    smtp.auth(mechanism, method, initial_response_ok=mechanism != "CRAM-MD5")  # type: ignore[arg-type]  # smtplib's own auth_* methods


class _XOAuth2:
    """smtplib's auth object for XOAUTH2: the initial response, then an empty answer to the
    server's error challenge."""

    def __init__(self, sasl: str) -> None:
        self.sasl = sasl

    def __call__(self, challenge: bytes | None = None, /) -> str:
        return self.sasl if challenge is None else ""


def _no_mechanism(offered: list[str], *, wanted: str) -> ConnectFailure:
    return ConnectFailure(
        DeliveryError(
            f"The SMTP server offers authentication with {' '.join(offered) or 'no mechanism'} only; Outbox "
            f"needs {wanted}. Change the SMTP configuration's authentication method (Microsoft 365: "
            "xoauth2), or enable a supported mechanism on the relay.",
            failure_class=FailureClass.CONFIGURATION,
            detail={"stage": "AUTH", "offered": offered},
        )
    )


def xoauth2_string(user: str, access_token: str) -> str:
    """The XOAUTH2 SASL initial response before base64 (smtplib encodes it)."""
    return f"user={user}\x01auth=Bearer {access_token}\x01\x01"


def connect_hint(exc: BaseException, settings: ConnectSettings) -> str:
    """A sentence telling what in the configuration probably causes ``exc`` while
    connecting, or ""."""
    port, security = settings.port, settings.security
    reason = getattr(exc, "reason", "") or ""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            "Check that the host name matches the server's certificate; for a private CA set ca_file to its "
            "certificate (PEM)."
        )
    if isinstance(exc, NoGreeting) or (
        security != "tls" and isinstance(exc, (smtplib.SMTPServerDisconnected, ConnectionResetError))
    ):
        if port == IMPLICIT_TLS_PORT:
            return f"Port {port} usually needs security=tls (implicit TLS)."
        if isinstance(exc, NoGreeting):
            return "If this port expects TLS from the first byte (implicit TLS, usually 465), set security=tls."
        return ""
    mismatch = reason == "WRONG_VERSION_NUMBER" or isinstance(exc, ssl.SSLEOFError) or "record" in str(exc).lower()
    if isinstance(exc, ssl.SSLError) and security == "tls" and mismatch:
        return (
            f"Port {port} does not start TLS at once: with security=tls the port must use implicit TLS (usually "
            "465); for a port that offers STARTTLS (usually 587 or 25) set security=starttls."
        )
    if isinstance(exc, ssl.SSLError) and security == "starttls" and reason == "WRONG_VERSION_NUMBER":
        return "The server's STARTTLS answer was not TLS: check the port and security settings."
    return ""


@cache
def default_local_hostname() -> str:
    """This host's EHLO name, looked up once: smtplib would resolve it again on every connection."""
    started = time.monotonic()
    name = socket.getfqdn()
    if time.monotonic() - started > 1 or not name:
        return "localhost"
    return name


def _close(smtp: smtplib.SMTP) -> None:
    with contextlib.suppress(OSError):
        smtp.close()
