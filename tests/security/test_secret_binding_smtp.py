"""The SMTP password and the OAuth client secret are only ever sent to the destination they
were entered for. An administrator who moves the server (or the token endpoint) without typing
the secret again is refused in the console — saving, "Check connection" and "Send test
email" alike — and in the configuration file; a destination changed behind the console's back
(an UPDATE, the Django shell) makes delivery refuse to log in. Each attack runs against a
second, real server on loopback that records what it is sent: it must never see the secret,
nor an access token obtained with it."""

import json

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.urls import reverse

from notifications.models import Notification, SmtpConfiguration
from notifications.operations import smtp_configuration_connect_test
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.dispatch.test_relay_connect import TokenEndpoint, XOAuth2Checker
from tests.support.smtp import SmtpServer

PASSWORD = "s3cret-relay-password"
CLIENT_SECRET = "app-client-s3cret"
MAILBOX = "alerts@contoso.example"


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def change_url(config):
    return reverse("admin:notifications_smtpconfiguration_change", args=[config.pk])


def form_data(config, **changes):
    """The change form as the console posts it: every field as stored, the secrets blank."""
    data = {
        name: getattr(config, name)
        for name in (
            "host",
            "port",
            "security",
            "username",
            "from_address",
            "timeout_seconds",
            "greeting_timeout_seconds",
            "data_timeout_seconds",
            "max_retries",
            "retry_interval_seconds",
            "auth_method",
            "oauth_tenant_id",
            "oauth_client_id",
            "oauth_authority",
        )
    }
    data.update(password="", oauth_client_secret="", oauth_client_certificate="")
    data.update(changes)
    return data


def password_config(server):
    return SmtpConfiguration.objects.create(
        host=server.host,
        port=server.port,
        security="none",
        username="outbox",
        password=PASSWORD,
        from_address="outbox@example.com",
        timeout_seconds=3,
    )


@pytest.fixture
def relay():
    """The relay the password was entered for."""
    with SmtpServer(auth=("outbox", PASSWORD)) as server:
        yield server


@pytest.fixture
def attacker():
    """A server of the attacker's, accepting any login and recording it."""
    with SmtpServer(auth=("outbox", "anything")) as server:
        yield server


def saw_nothing(server):
    return server.ehlos == 0 and server.auth_log == [] and server.count == 0


# --- the password: the console ------------------------------------------------------------------


def test_saving_a_moved_server_without_the_password_is_a_field_error_and_nothing_is_saved(
    admin_client_, relay, attacker
):
    config = password_config(relay)
    response = admin_client_.post(change_url(config), form_data(config, port=attacker.port))
    assert response.status_code == 200
    (error,) = response.context["adminform"].form.errors["password"]
    assert error.startswith("Re-enter the password (or remove it): the port changed")
    stored = SmtpConfiguration.objects.get()
    assert (stored.port, stored.password) == (relay.port, PASSWORD)
    assert saw_nothing(attacker)


@pytest.mark.parametrize("button", ["_smtp_test_connect", "_smtp_test_send"])
def test_testing_a_moved_server_without_the_password_sends_it_nowhere(admin_client_, relay, attacker, button):
    config = password_config(relay)
    data = {**form_data(config, port=attacker.port), button: "1", "smtp_test_to": "ops@example.com"}
    response = admin_client_.post(change_url(config), data)
    assert texts(response) == ["Correct the errors below, then test again."]
    (error,) = response.context["adminform"].form.errors["password"]
    assert "the port changed" in error
    assert saw_nothing(attacker)


def test_a_changed_security_alone_needs_the_password_again(admin_client_, relay):
    config = password_config(relay)
    response = admin_client_.post(change_url(config), form_data(config, security="tls"))
    (error,) = response.context["adminform"].form.errors["password"]
    assert "the security changed" in error


def test_the_password_typed_again_with_the_new_server_is_accepted_and_sent_there(admin_client_, relay):
    config = password_config(relay)
    with SmtpServer(auth=("outbox", PASSWORD)) as new_relay:
        data = form_data(config, port=new_relay.port, password=PASSWORD)
        response = admin_client_.post(change_url(config), {**data, "_smtp_test_connect": "1"})
        assert "accepted the connection and login" in texts(response)[0]
        assert admin_client_.post(change_url(config), data).status_code == 302
        response = admin_client_.post(
            reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@example.com"}
        )
        assert any("accepted the test message" in text for text in texts(response))
        assert new_relay.auth_log == [("PLAIN", b"outbox", PASSWORD.encode())] * 2
    assert relay.auth_log == []


# --- the password: behind the console's back -----------------------------------------------------


@pytest.mark.parametrize("how", ["update", "save"])
def test_a_server_changed_behind_the_console_never_gets_the_password(db, operators_list, relay, attacker, how):
    config = password_config(relay)
    if how == "update":
        SmtpConfiguration.objects.update(port=attacker.port)
    else:  # the Django shell: change the port, save, password untouched
        config.port = attacker.port
        config.save()
    (notification,) = queue()
    run_pass()
    assert saw_nothing(attacker)
    notification = fresh(notification)
    assert notification.status == Notification.Status.PARKED
    attempt = notification.attempts.get()
    assert attempt.failure_class == "configuration"
    assert "password was entered for another server" in notification.last_error
    assert "must enter the password again" in notification.last_error


def test_send_test_email_of_a_configuration_moved_behind_the_console_says_to_enter_the_password(
    admin_client_, relay, attacker
):
    config = password_config(relay)
    SmtpConfiguration.objects.update(port=attacker.port)
    response = admin_client_.post(
        reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@example.com"}
    )
    (said,) = texts(response)
    assert "did not accept the test message" in said and "must enter the password again" in said
    assert saw_nothing(attacker)
    # The change form says so too, and the password typed again binds it to the new server.
    response = admin_client_.post(change_url(config), form_data(SmtpConfiguration.objects.get()))
    assert "was not entered for the current" in response.context["adminform"].form.errors["password"][0]
    assert (
        admin_client_.post(change_url(config), form_data(config, port=attacker.port, password="x")).status_code == 302
    )
    admin_client_.post(
        reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@example.com"}
    )
    assert attacker.auth_log == [("PLAIN", b"outbox", b"x")]


# --- the password: the configuration file ---------------------------------------------------------


def import_file(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    call_command("outbox_config", "import", str(path))


@pytest.mark.parametrize("moved", [{"port": 2626}, {"security": "tls"}, {"host": "relay.attacker.example"}])
def test_an_import_moving_the_server_without_the_password_is_refused_naming_the_field(db, tmp_path, moved):
    smtp = {"host": "smtp.example.com", "port": 587, "security": "starttls", "username": "outbox",
            "password": PASSWORD, "from_address": "outbox@example.com"}  # fmt: skip
    import_file(tmp_path, {"smtp": smtp})
    without = {key: value for key, value in smtp.items() if key != "password"}
    (name,) = moved
    with pytest.raises(
        CommandError, match=rf"smtp\.password: Re-enter the password \(or remove it\): the {name} changed"
    ):
        import_file(tmp_path, {"smtp": {**without, **moved}}, "moved.json")
    stored = SmtpConfiguration.objects.get()
    assert (stored.host, stored.port, stored.security) == ("smtp.example.com", 587, "starttls")
    # The same file with the password in it is the administrator entering it for the new server.
    import_file(tmp_path, {"smtp": {**smtp, **moved}}, "moved.json")
    assert getattr(SmtpConfiguration.objects.get(), name) == moved[name]


def test_an_imported_password_typed_again_for_a_new_server_reaches_only_that_server(
    db, operators_list, tmp_path, relay, attacker
):
    smtp = {"host": relay.host, "port": relay.port, "security": "none", "username": "outbox", "password": PASSWORD,
            "from_address": "outbox@example.com", "timeout_seconds": 3}  # fmt: skip
    import_file(tmp_path, {"smtp": smtp})
    with SmtpServer(auth=("outbox", PASSWORD)) as new_relay:
        import_file(tmp_path, {"smtp": {**smtp, "port": new_relay.port}}, "moved.json")
        queue()
        assert run_pass().delivered == 1
        assert new_relay.auth_log == [("PLAIN", b"outbox", PASSWORD.encode())]
    assert relay.auth_log == [] and saw_nothing(attacker)


# --- XOAUTH2: the client secret and the access token ------------------------------------------------


@pytest.fixture
def token_endpoint(monkeypatch):
    from notifications.adapters.oauth import oauth_cache_clear

    oauth_cache_clear()
    with TokenEndpoint(secret=CLIENT_SECRET, token="bearer-token-1") as endpoint:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", endpoint.ca_file)
        yield endpoint
    oauth_cache_clear()


class XOAuth2Relay(SmtpServer):
    """A relay offering only XOAUTH2; ``checker.seen`` records every initial response."""

    def __init__(self, *, token: str) -> None:
        self.checker = XOAuth2Checker(user=MAILBOX, token=token)
        super().__init__(auth_mechanisms={"XOAUTH2": self.checker}, auth_exclude=("PLAIN", "LOGIN"))


@pytest.fixture
def m365():
    """The Microsoft 365 relay the OAuth secret was entered for."""
    with XOAuth2Relay(token="bearer-token-1") as server:
        yield server


@pytest.fixture
def oauth_attacker():
    """The attacker's relay, recording whatever bearer token it is offered."""
    with XOAuth2Relay(token="nothing-matches") as server:
        yield server


def oauth_config(server, endpoint, **fields):
    values = {
        "host": server.host,
        "port": server.port,
        "security": "none",
        "username": MAILBOX,
        "from_address": MAILBOX,
        "timeout_seconds": 5,
        "auth_method": "xoauth2",
        "oauth_tenant_id": "contoso-tenant",
        "oauth_client_id": "client-1",
        "oauth_client_secret": CLIENT_SECRET,
        "oauth_authority": endpoint.authority,
    }
    values.update(fields)
    return SmtpConfiguration.objects.create(**values)


def saw_no_token(server):
    return server.checker.seen == [] and server.count == 0


@pytest.mark.parametrize("button", [None, "_smtp_test_connect", "_smtp_test_send"])
def test_moving_the_relay_of_xoauth2_without_the_client_secret_fetches_no_token_and_sends_none(
    admin_client_, token_endpoint, m365, oauth_attacker, button
):
    config = oauth_config(m365, token_endpoint)
    data = form_data(config, port=oauth_attacker.port)
    if button:
        data.update({button: "1", "smtp_test_to": "ops@example.com"})
    response = admin_client_.post(change_url(config), data)
    assert response.status_code == 200
    (error,) = response.context["adminform"].form.errors["oauth_client_secret"]
    assert error.startswith("Re-enter the OAuth client secret (or remove it): the port changed")
    assert SmtpConfiguration.objects.get().port == m365.port
    assert token_endpoint.token_requests == 0  # not even a token was fetched
    assert saw_no_token(oauth_attacker)


@pytest.mark.parametrize("moved", ["oauth_authority", "oauth_tenant_id"])
def test_moving_the_token_endpoint_without_the_client_secret_is_refused_in_the_console(
    admin_client_, token_endpoint, m365, moved
):
    config = oauth_config(m365, token_endpoint)
    value = "https://login.attacker.example" if moved == "oauth_authority" else "attacker-tenant"
    response = admin_client_.post(
        change_url(config), {**form_data(config, **{moved: value}), "_smtp_test_connect": "1"}
    )
    (error,) = response.context["adminform"].form.errors["oauth_client_secret"]
    assert f"the {moved} changed" in error
    assert token_endpoint.token_requests == 0


def test_the_client_secret_typed_again_with_the_new_relay_is_accepted_and_the_token_goes_there(
    admin_client_, token_endpoint, m365
):
    config = oauth_config(m365, token_endpoint)
    with XOAuth2Relay(token="bearer-token-1") as new_relay:
        data = form_data(config, port=new_relay.port, oauth_client_secret=CLIENT_SECRET)
        response = admin_client_.post(change_url(config), {**data, "_smtp_test_connect": "1"})
        assert "accepted the connection and login" in texts(response)[0]
        assert admin_client_.post(change_url(config), data).status_code == 302
        assert new_relay.checker.seen == [f"user={MAILBOX}\x01auth=Bearer bearer-token-1\x01\x01"]
    assert saw_no_token(m365)


def test_a_relay_changed_behind_the_console_gets_no_bearer_token_from_a_dispatch_pass(
    db, operators_list, token_endpoint, m365, oauth_attacker
):
    oauth_config(m365, token_endpoint)
    SmtpConfiguration.objects.update(port=oauth_attacker.port)
    (notification,) = queue()
    run_pass()
    assert token_endpoint.token_requests == 0
    assert saw_no_token(oauth_attacker)
    notification = fresh(notification)
    assert notification.attempts.get().failure_class == "configuration"
    assert "must enter the OAuth client secret again" in notification.last_error


def test_an_import_moving_the_relay_of_xoauth2_needs_the_client_secret_in_the_file(db, tmp_path, token_endpoint, m365):
    smtp = {"host": m365.host, "port": m365.port, "security": "none", "username": MAILBOX, "from_address": MAILBOX,
            "auth_method": "xoauth2", "oauth_tenant_id": "contoso-tenant", "oauth_client_id": "client-1",
            "oauth_client_secret": CLIENT_SECRET, "oauth_authority": token_endpoint.authority}  # fmt: skip
    import_file(tmp_path, {"smtp": smtp})
    moved = {key: value for key, value in smtp.items() if key != "oauth_client_secret"}
    moved["port"] = m365.port + 1
    with pytest.raises(CommandError, match=r"smtp\.oauth_client_secret: Re-enter the OAuth client secret"):
        import_file(tmp_path, {"smtp": moved}, "moved.json")
    assert SmtpConfiguration.objects.get().port == m365.port
    # With the secret in the file, it is entered for the new relay.
    with XOAuth2Relay(token="bearer-token-1") as new_relay:
        import_file(tmp_path, {"smtp": {**smtp, "port": new_relay.port}}, "moved.json")
        response = smtp_configuration_connect_test(config=SmtpConfiguration.objects.get())
        assert response.ok, response.reply
        assert len(new_relay.checker.seen) == 1
    assert saw_no_token(m365)


# --- XOAUTH2 with a client certificate ------------------------------------------------------------


def test_the_client_certificate_path_is_write_only_and_bound_to_the_relay_like_the_secret(
    admin_client_, token_endpoint, m365, tmp_path
):
    certificate = tmp_path / "app.pem"
    certificate.write_text("not read: nothing connects in this test")
    config = oauth_config(m365, token_endpoint, oauth_client_secret="", oauth_client_certificate=str(certificate))
    page = admin_client_.get(change_url(config)).content.decode()
    assert str(certificate) not in page and "A client certificate path is stored." in page
    # Blank keeps it while the destination stays …
    assert admin_client_.post(change_url(config), form_data(config, timeout_seconds=7)).status_code == 302
    assert SmtpConfiguration.objects.get().oauth_client_certificate == str(certificate)
    # … and is refused when the relay moves: the token obtained with it would go there.
    response = admin_client_.post(change_url(config), form_data(config, host="localhost"))
    (error,) = response.context["adminform"].form.errors["oauth_client_certificate"]
    assert error.startswith("Re-enter the OAuth client certificate path (or remove it): the host changed")
    response = admin_client_.post(
        change_url(config), form_data(config, host="localhost", oauth_client_certificate=str(certificate))
    )
    assert response.status_code == 302
    assert SmtpConfiguration.objects.get().host == "localhost"
