"""Connecting to relays configured like corporate ones (aiosmtpd on loopback): one AUTH with one
mechanism, 454 as transient, a server without a usable mechanism, XOAUTH2 with the token
endpoint answered by a local HTTPS server, SIZE and SMTPUTF8 on MAIL FROM, and a fast,
explained failure for a port/security mismatch."""

import base64
import json
import ssl
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiosmtpd.smtp import AuthResult

from notifications.adapters.base import DeliveryError
from notifications.adapters.email import email_send_test
from notifications.adapters.oauth import oauth_cache_clear
from notifications.models import EmailRecipient, Notification, NotificationList, SmtpConfiguration
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass, store_policy
from tests.support.processes import free_port
from tests.support.smtp import SmtpServer, _self_signed_certificate

Status = Notification.Status


def config_for(server: SmtpServer, **fields) -> SmtpConfiguration:
    values = {
        "host": server.host,
        "port": server.port,
        "security": "none",
        "from_address": "outbox@example.com",
        "timeout_seconds": 5,
    }
    values.update(fields)
    return SmtpConfiguration(**values)


def failure_of(config: SmtpConfiguration, to: str = "op1@example.com") -> DeliveryError:
    with pytest.raises(DeliveryError) as caught:
        email_send_test(config=config, to=to)
    return caught.value


# --- authentication ---------------------------------------------------------------------------


def test_a_wrong_password_is_one_auth_command_not_a_burst_of_mechanisms():
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        error = failure_of(config_for(server, username="outbox", password="wrong"))
        assert error.failure_class == "auth"
        # smtplib.login would have tried PLAIN and then LOGIN: two failed logins.
        assert server.auth_attempts == 1


def test_a_pass_with_a_wrong_password_fails_auth_once_and_parks_nothing(db, operators_list):
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        configure_smtp(server, username="outbox", password="wrong")
        notifications = queue(20)
        run_pass(concurrency=4)
        assert server.auth_attempts == 1
        assert server.count == 0
    rows = [fresh(n) for n in notifications]
    assert {row.status for row in rows} <= {Status.RETRYING, Status.PENDING}
    assert not any(row.status == Status.PARKED for row in rows)


def test_454_temporary_authentication_failure_is_retried_not_parked(db, operators_list):
    with SmtpServer(auth=("outbox", "s3cret")) as server:
        server.auth_failure_reply = "454 4.7.0 Temporary authentication failure"
        configure_smtp(server, username="outbox", password="s3cret-but-expired")
        (notification,) = queue()
        run_pass()
        assert server.auth_attempts == 1
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert notification.attempts.get().failure_class == "auth"
    assert "454" in notification.last_error


def _ntlm_only(server, args):  # an Exchange-like relay: NTLM only, never reached by Outbox
    raise AssertionError("Outbox must not try NTLM")


def test_a_server_offering_only_ntlm_is_a_permanent_configuration_error(db, operators_list):
    with SmtpServer(auth_mechanisms={"NTLM": _ntlm_only}, auth_exclude=("PLAIN", "LOGIN")) as server:
        config = config_for(server, username="outbox", password="s3cret")
        error = failure_of(config)
        assert error.failure_class == "configuration"
        assert "NTLM" in error.message and "xoauth2" in error.message
        configure_smtp(server, username="outbox", password="s3cret")
        (notification,) = queue()
        run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED  # not "transient forever"
    assert "offers authentication with NTLM only" in notification.last_error


# --- XOAUTH2 ------------------------------------------------------------------------------------


class TokenEndpoint:
    """A local HTTPS server answering msal's discovery and client-credentials requests like
    Microsoft's identity platform; ``secret`` is the only client secret it accepts."""

    def __init__(self, *, secret: str, token: str = "tok-1", expires_in: int = 3600) -> None:
        self.secret, self.token, self.expires_in = secret, token, expires_in
        self.token_requests = 0
        self.certificate_key = None  # a public key: accept only client assertions it verifies
        self.assertions: list[dict] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="token-endpoint-")
        cert, key = _self_signed_certificate()
        self.ca_file = str(Path(self._tmp.name) / "cert.pem")
        Path(self.ca_file).write_bytes(cert)
        (Path(self._tmp.name) / "key.pem").write_bytes(key)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                tenant = self.path.strip("/").split("/")[0]
                base = f"{owner.authority}/{tenant}"
                self._json(
                    200,
                    {
                        "issuer": f"{base}/v2.0",
                        "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                        "token_endpoint": f"{base}/oauth2/v2.0/token",
                    },
                )

            def do_POST(self):
                from urllib.parse import parse_qs

                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                with owner._lock:
                    owner.token_requests += 1
                if owner.certificate_key is not None:
                    # A certificate credential: a JWT signed with the certificate's key (RS256).
                    import jwt

                    assertion = form.get("client_assertion", [""])[0]
                    try:
                        claims = jwt.decode(
                            assertion,
                            owner.certificate_key,
                            algorithms=["RS256", "PS256"],
                            audience=owner.authority + self.path,
                        )
                    except jwt.PyJWTError as exc:
                        self._json(401, {"error": "invalid_client", "error_description": f"bad assertion: {exc}"})
                        return
                    owner.assertions.append(claims)
                    self._json(
                        200, {"token_type": "Bearer", "expires_in": owner.expires_in, "access_token": owner.token}
                    )
                    return
                if form.get("client_secret") != [owner.secret]:
                    self._json(401, {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid secret."})
                    return
                assert form.get("scope") == ["https://outlook.office365.com/.default"]
                self._json(200, {"token_type": "Bearer", "expires_in": owner.expires_in, "access_token": owner.token})

        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, Path(self._tmp.name) / "key.pem")
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.authority = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._tmp.cleanup()


class XOAuth2Checker:
    """An aiosmtpd AUTH XOAUTH2 mechanism that checks the SASL string's format and token."""

    def __init__(self, *, user: str, token: str) -> None:
        self.user, self.token = user, token
        self.seen: list[str] = []

    async def __call__(self, server, args):
        # args: the mechanism and the initial response (Outbox always sends one).
        decoded = base64.b64decode(args[1]).decode()
        self.seen.append(decoded)
        if decoded == f"user={self.user}\x01auth=Bearer {self.token}\x01\x01":
            return AuthResult(success=True, auth_data=self.user)
        return AuthResult(success=False, handled=False, message="535 5.7.3 Authentication unsuccessful")


@pytest.fixture
def token_env(monkeypatch):
    oauth_cache_clear()
    yield monkeypatch
    oauth_cache_clear()


def test_xoauth2_gets_a_token_once_and_authenticates_in_the_sasl_format(db, token_env):
    checker = XOAuth2Checker(user="alerts@contoso.example", token="tok-1")
    with (
        TokenEndpoint(secret="app-secret") as endpoint,
        SmtpServer(auth_mechanisms={"XOAUTH2": checker}, auth_exclude=("PLAIN", "LOGIN")) as server,
    ):
        token_env.setenv("REQUESTS_CA_BUNDLE", endpoint.ca_file)
        config = config_for(
            server,
            username="alerts@contoso.example",
            auth_method="xoauth2",
            oauth_tenant_id="contoso-tenant",
            oauth_client_id="client-1",
            oauth_client_secret="app-secret",
            oauth_authority=endpoint.authority,
        )
        email_send_test(config=config, to="op1@example.com")
        email_send_test(config=config, to="op2@example.com")
        assert server.count == 2
        assert endpoint.token_requests == 1  # cached until shortly before it expires
        assert checker.seen == ["user=alerts@contoso.example\x01auth=Bearer tok-1\x01\x01"] * 2


def test_xoauth2_with_a_wrong_client_secret_is_class_auth_and_never_reaches_the_relay(db, token_env):
    checker = XOAuth2Checker(user="alerts@contoso.example", token="tok-1")
    with (
        TokenEndpoint(secret="app-secret") as endpoint,
        SmtpServer(auth_mechanisms={"XOAUTH2": checker}, auth_exclude=("PLAIN", "LOGIN")) as server,
    ):
        token_env.setenv("REQUESTS_CA_BUNDLE", endpoint.ca_file)
        config = config_for(
            server,
            username="alerts@contoso.example",
            auth_method="xoauth2",
            oauth_tenant_id="contoso-tenant",
            oauth_client_id="client-1",
            oauth_client_secret="expired-secret",
            oauth_authority=endpoint.authority,
        )
        error = failure_of(config)
    assert error.failure_class == "auth"
    assert "invalid_client" in error.message and "client secret" in error.message
    assert checker.seen == []


def test_xoauth2_against_a_password_only_server_is_a_configuration_error(db, smtp_server):
    # aiosmtpd's default server offers no AUTH at all; a PLAIN/LOGIN one is no better for xoauth2.
    with SmtpServer(auth=("u", "p")) as server:
        error = failure_of(config_for(server, username="alerts@contoso.example", auth_method="xoauth2"))
    assert error.failure_class == "configuration"
    assert "XOAUTH2" in error.message


# --- MAIL FROM parameters and addresses ----------------------------------------------------------


def test_size_is_declared_on_mail_from_when_the_server_advertises_it(db, smtp_server, smtp_config, operators_list):
    (notification,) = queue(body="x" * 5000)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    (options,) = smtp_server.mail_options
    (size,) = [option for option in options if option.startswith("SIZE=")]
    assert int(size.removeprefix("SIZE=")) == len(smtp_server.received[0].content)


def test_a_non_ascii_local_part_uses_smtputf8_when_offered(db):
    with SmtpServer(smtputf8=True) as server:
        configure_smtp(server)
        notification_list = NotificationList.objects.create(name="Utf8")
        # Stored as an older release allowed (the list editor checks addresses now).
        EmailRecipient.objects.create(notification_list=notification_list, email="jörg@bücher.example")
        (notification,) = queue(list_name="Utf8")
        run_pass()
        assert fresh(notification).status == Status.DELIVERED
        assert server.received[0].rcpt_tos == ["jörg@xn--bcher-kva.example"]
        assert "SMTPUTF8" in server.mail_options[0]


def test_a_non_ascii_local_part_without_smtputf8_fails_for_that_recipient_only(db, smtp_server, smtp_config):
    notification_list = NotificationList.objects.create(name="Mixed")
    EmailRecipient.objects.create(notification_list=notification_list, email="jörg@example.com")
    EmailRecipient.objects.create(notification_list=notification_list, email="op1@example.com")
    (notification,) = queue(list_name="Mixed")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert smtp_server.received[0].rcpt_tos == ["op1@example.com"]
    (refused,) = [entry for entry in notification.resolved_targets if entry["outcome"] != "delivered"]
    assert refused["target"] == "jörg@example.com"
    assert "SMTPUTF8" in refused["error"]


# --- port and security mismatches ----------------------------------------------------------------


def test_starttls_against_an_implicit_tls_port_fails_after_the_greeting_timeout_with_a_hint(db):
    with SmtpServer(security="tls") as server:
        started = time.monotonic()
        error = failure_of(config_for(server, security="starttls", timeout_seconds=30, greeting_timeout_seconds=1))
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 10  # the greeting's wait, not the 30 s timeout
    assert error.failure_class == "timeout"
    assert "no greeting within 1 s" in error.message
    assert "security=tls" in error.message


def test_implicit_tls_against_a_plain_port_says_which_security_to_use(db, smtp_server):
    started = time.monotonic()
    error = failure_of(config_for(smtp_server, security="tls", timeout_seconds=30))
    assert time.monotonic() - started < 5
    assert error.failure_class == "connection"
    assert "security=starttls" in error.message


def test_a_pass_with_an_untrusted_certificate_holds_every_row(db, operators_list):
    store_policy(breaker_threshold=1)
    with SmtpServer(security="starttls") as server:
        configure_smtp(server, security="starttls")
        notifications = queue(5)
        run_pass()
    assert not Notification.objects.filter(status=Status.PARKED).exists()
    assert {fresh(n).status for n in notifications} <= {Status.RETRYING, Status.PENDING}


def test_starttls_against_port_465_names_security_tls(db):
    # Port 465 itself (we run as root in CI; elsewhere the port may be taken or forbidden).
    try:
        server = SmtpServer(port=465, security="tls").start()
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"cannot listen on port 465 here: {exc}")
    try:
        error = failure_of(config_for(server, security="starttls", timeout_seconds=30, greeting_timeout_seconds=1))
    finally:
        server.stop()
    assert "Port 465 usually needs security=tls" in error.message


def test_a_client_certificate_is_presented_when_configured(db, tmp_path):
    from aiosmtpd.controller import Controller

    from tests.support.postfix import ca_and_server_certificate

    ca_cert, server_cert, server_key = ca_and_server_certificate()
    for name, data in (("ca.pem", ca_cert), ("server.pem", server_cert), ("server.key", server_key)):
        (tmp_path / name).write_bytes(data)
    client_cert, client_key = _self_signed_certificate()
    (tmp_path / "client.pem").write_bytes(client_cert)
    (tmp_path / "client.key").write_bytes(client_key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no session
    context.load_verify_locations(tmp_path / "client.pem")

    class Sink:
        def __init__(self):
            self.peer_certs = []

        async def handle_DATA(self, server, session, envelope):
            self.peer_certs.append(server.transport.get_extra_info("peercert"))
            return "250 OK"

    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=free_port(), ssl_context=context, ready_timeout=10)
    controller.start()
    try:
        base = {
            "host": "127.0.0.1",
            "port": controller.port,
            "security": "tls",
            "from_address": "outbox@example.com",
            "ca_file": str(tmp_path / "ca.pem"),
            "timeout_seconds": 2,
        }
        without = SmtpConfiguration(**base)
        assert failure_of(without).failure_class == "connection"
        with_cert = SmtpConfiguration(
            **base, client_cert=str(tmp_path / "client.pem"), client_key=str(tmp_path / "client.key")
        )
        assert email_send_test(config=with_cert, to="op1@example.com").detail["smtp_code"] == 250
        missing = SmtpConfiguration(**base, client_cert=str(tmp_path / "nowhere.pem"))
        error = failure_of(missing)
        assert error.failure_class == "configuration" and "nowhere.pem" in error.message
    finally:
        controller.stop()
    (peer,) = sink.peer_certs
    assert peer is not None  # the server saw (and verified) our client certificate


def test_xoauth2_with_a_client_certificate_signs_the_token_request(db, token_env, tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "outbox-app")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "app.pem"
    pem.write_bytes(
        certificate.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    checker = XOAuth2Checker(user="alerts@contoso.example", token="tok-1")
    with (
        TokenEndpoint(secret="unused") as endpoint,
        SmtpServer(auth_mechanisms={"XOAUTH2": checker}, auth_exclude=("PLAIN", "LOGIN")) as server,
    ):
        endpoint.certificate_key = key.public_key()
        token_env.setenv("REQUESTS_CA_BUNDLE", endpoint.ca_file)
        config = config_for(
            server,
            username="alerts@contoso.example",
            auth_method="xoauth2",
            oauth_tenant_id="contoso-tenant",
            oauth_client_id="client-1",
            oauth_client_certificate=str(pem),
            oauth_authority=endpoint.authority,
        )
        email_send_test(config=config, to="op1@example.com")
        assert server.count == 1
        (claims,) = endpoint.assertions
        assert claims["iss"] == claims["sub"] == "client-1"
        unreadable = config_for(
            server,
            username="alerts@contoso.example",
            auth_method="xoauth2",
            oauth_tenant_id="contoso-tenant",
            oauth_client_id="client-1",
            oauth_client_certificate=str(tmp_path / "missing.pem"),
            oauth_authority=endpoint.authority,
        )
        error = failure_of(unreadable)
    assert error.failure_class == "configuration" and "missing.pem" in error.message
