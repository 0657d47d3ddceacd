"""Opening an SMTP connection the way the configuration says: TCP (or implicit TLS), the
greeting, EHLO with our name, STARTTLS, EHLO again, and authentication.

The email adapter's session calls :func:`smtp_open` for every new connection, for deliveries
and for the console's "Send test email" alike, so both go through one code path.

* **Trust and identity.** Server certificates are verified against the system's trust store
  plus, when set, the configuration's ``ca_file`` (a private CA); ``client_cert`` and
  ``client_key`` present a client certificate; ``local_hostname`` is the name sent with EHLO
  (default: this host's fully qualified name).
* **The greeting.** The server's 220 may take ``greeting_timeout_seconds`` (default 30 s):
  relays that delay it on purpose (Postfix's postscreen, sendmail's ``greet_pause``) are waited
  for, while a server that says nothing at all — usually an implicit-TLS port (465) spoken to
  in plain text — fails with a hint saying so (:class:`NoGreeting`).
* **One AUTH, one mechanism.** smtplib's ``login`` tries every common mechanism in turn, two
  or three failed logins per connection; here one mechanism is chosen from what the server
  offers and tried once. A session (one dispatch pass) remembers an authentication failure
  (:class:`AuthGate`) and fails its later connections with it without connecting again, and
  connections wait for the first AUTH of the pass to succeed before trying theirs, so a wrong
  password costs one failed login per pass, never a burst that locks the account.
* **Blocking calls with timeouts.** A connection is a plain blocking ``smtplib.SMTP`` whose
  every read and write waits at most ``timeout_seconds`` (the answer to a message's end: its
  own wait, :meth:`SmtpConnection.exchange`), and never past the delivery's deadline (the
  claim's lease, :func:`~notifications.adapters.base.delivery_time_left`).
"""

import contextlib
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from notifications.adapters.base import DeliveryError, delivery_time_left
from notifications.vocabulary import FailureClass

# The implicit-TLS submission port (RFC 8314).
IMPLICIT_TLS_PORT = 465
# Password mechanisms in the order they are preferred when the connection is encrypted;
# without encryption CRAM-MD5 (which does not send the password) comes first.
PASSWORD_MECHANISMS = ("PLAIN", "LOGIN", "CRAM-MD5")
# The shortest wait set on a socket when the delivery's deadline is (nearly) reached: zero
# would make the socket non-blocking instead of timing out at once.
MIN_WAIT_SECONDS = 0.001


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
    greeting_timeout: float = 30.0
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
            greeting_timeout=config.greeting_timeout_seconds,
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


def lease_bounded(seconds: float) -> float:
    """``seconds``, or the time the delivery has left when that is shorter (never zero)."""
    left = delivery_time_left()
    return seconds if left is None else max(min(seconds, left), MIN_WAIT_SECONDS)


class SmtpConnection(smtplib.SMTP):
    """smtplib's blocking client as Outbox uses it: connected when made, waiting
    ``greeting_timeout`` for the greeting; MAIL FROM and RCPT TO with each address quoted once
    (:func:`_quoted`), also as lines to write several at once (the email adapter's pipelined
    transaction, RFC 2920); and :meth:`exchange`, which bounds every wait."""

    _greeting = False  # the reply being read is the greeting

    def __init__(self, settings: ConnectSettings) -> None:
        self._greeting_wait = lease_bounded(settings.greeting_timeout)
        super().__init__(
            settings.host, settings.port, local_hostname=settings.ehlo_name, timeout=lease_bounded(settings.timeout)
        )
        self.timeout = settings.timeout

    def connect(self, host: str = "localhost", port: int = 0, source_address: Any = None) -> tuple[int, bytes]:
        self._greeting = True
        try:
            return super().connect(host, port, source_address)
        finally:
            self._greeting = False

    def getreply(self) -> tuple[int, bytes]:
        if not self._greeting or self.sock is None:
            return super().getreply()
        # The greeting has a wait of its own; the connection's timeout bounds the rest.
        self._greeting = False
        timeout = self.sock.gettimeout()
        self.sock.settimeout(self._greeting_wait)
        try:
            return super().getreply()
        except smtplib.SMTPServerDisconnected as exc:
            if isinstance(exc.__context__, TimeoutError):
                raise NoGreeting(self._greeting_wait) from exc
            raise
        finally:
            if self.sock is not None:
                self.sock.settimeout(timeout)

    def exchange(
        self, data: bytes | str | None, replies: int = 0, *, wait: float | None = None
    ) -> list[tuple[int, bytes]]:
        """Write ``data`` (a str is encoded as smtplib encodes commands), then read ``replies``
        replies, in order, as ``getreply`` returns them. A write, and every read, waits at most
        the connection's timeout, never past the delivery's deadline; ``wait`` instead for the
        replies (the answer to a message's end). Failures raise as smtplib's calls do (the
        connection closed, a timeout as the cause or context)."""
        if data:
            self._wait(lease_bounded(self.timeout))
            self.send(data)
        if not replies:
            return []
        self._wait(lease_bounded(self.timeout) if wait is None else wait)
        return [self.getreply() for _ in range(replies)]

    def _wait(self, seconds: float) -> None:
        if self.sock is not None and self.sock.gettimeout() != seconds:
            self.sock.settimeout(seconds)

    def mail_command(self, sender: str, options: Sequence[str] = ()) -> str:
        optionlist = ""
        if options and self.does_esmtp:
            if any(option.lower() == "smtputf8" for option in options):
                if not self.has_extn("smtputf8"):
                    raise smtplib.SMTPNotSupportedError("SMTPUTF8 not supported by server")
                self.command_encoding = "utf-8"
            optionlist = " " + " ".join(options)
        return _line(f"mail FROM:{_quoted(sender)}{optionlist}")

    def rcpt_command(self, recip: str, options: Sequence[str] = ()) -> str:
        optionlist = " " + " ".join(options) if options and self.does_esmtp else ""
        return _line(f"rcpt TO:{_quoted(recip)}{optionlist}")

    def mail(self, sender: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        self.send(self.mail_command(sender, options))
        return self.getreply()

    def rcpt(self, recip: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        self.send(self.rcpt_command(recip, options))
        return self.getreply()

    def quit_quietly(self) -> None:
        """QUIT (waiting at most the connection's timeout), or just close when that fails."""
        try:
            self._wait(self.timeout)
            self.quit()
        except (smtplib.SMTPException, OSError):
            _close(self)


class SmtpsConnection(SmtpConnection, smtplib.SMTP_SSL):
    """:class:`SmtpConnection` over implicit TLS."""

    def __init__(self, settings: ConnectSettings, *, context: ssl.SSLContext | None) -> None:
        self._greeting_wait = lease_bounded(settings.greeting_timeout)
        smtplib.SMTP_SSL.__init__(
            self,
            settings.host,
            settings.port,
            local_hostname=settings.ehlo_name,
            timeout=lease_bounded(settings.timeout),
            context=context,
        )
        self.timeout = settings.timeout


def _line(command: str) -> str:
    """``command`` as a line, refused (ValueError, as smtplib's putcmd refuses it) when it holds
    a line break: it would be a second command."""
    if "\r" in command or "\n" in command:
        raise ValueError(f"command and arguments contain prohibited newline characters: {command!r}")
    return f"{command}\r\n"


class NoGreeting(TimeoutError):
    """The server said nothing within the greeting's wait."""

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
) -> SmtpConnection:
    """A connected, greeted (EHLO), encrypted (as configured) and authenticated connection.
    Raises smtplib/OS errors (tagged with ``stage``) or ConnectFailure. ``token`` gives the
    OAuth access token for ``auth_method`` xoauth2."""
    if settings.authenticates:
        gate.check()  # AUTH already failed in this session: do not even connect
    try:
        smtp = SmtpsConnection(settings, context=context) if settings.security == "tls" else SmtpConnection(settings)
    except (smtplib.SMTPException, OSError) as exc:
        exc.stage = "connect"  # type: ignore[attr-defined]
        raise
    stage = "EHLO"
    try:
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
