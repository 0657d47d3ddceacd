"""The channels' credentials are only ever sent where they were entered for: the SMS auth token
(to its API base URL and account), webhook signing secrets (to their URL), and Teams and
Apprise URLs, which carry their credentials themselves and are only ever replaced whole.

Each attack points a destination at a real HTTP server on loopback that records every request
(headers, query and body) — the attacker's — and checks it never receives the credential: no
``Authorization`` header, no signature made with the stored secret, no Workflows signature."""

import base64
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from notifications.config_file import ConfigFileError, configuration_export, configuration_import
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    Notification,
    NotificationList,
    SmsTarget,
    TeamsTarget,
    WebhookTarget,
)
from tests.channels.conftest import ACCOUNT_SID, AUTH_TOKEN, configure_sms
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.receivers import Receiver, TeamsReceiver, TwilioFake, WebhookReceiver, new_webhook_secret

Status = Notification.Status
PREFIXES = ("email_recipients", "teams_targets", "webhook_targets", "sms_targets", "apprise_targets")
OTHER_SID = "AC" + "fedcba9876543210" * 2
SIGNATURE = "SECRETSIG"


@pytest.fixture
def attacker():
    """The attacker's HTTP server: answers 200 to everything and records it."""
    with Receiver() as server:
        yield server


@pytest.fixture
def channels(db):
    return NotificationList.objects.create(name="Channels")


def queue_for(channel):
    (notification,) = queue(type=channel, list_name="Channels")
    return notification


def list_change(notification_list, **rows):
    """The list's change form as the console posts it: ``rows`` by inline prefix, each a dict
    of fields; a row with ``id`` is a stored target (its ``notification_list`` is filled in)."""
    data = {"name": notification_list.name, "description": "", "recipient_mode": "bcc"}
    for prefix in PREFIXES:
        entries = rows.get(prefix, [])
        data[f"{prefix}-TOTAL_FORMS"] = str(len(entries))
        data[f"{prefix}-INITIAL_FORMS"] = str(sum(1 for row in entries if "id" in row))
        for index, row in enumerate(entries):
            if "id" in row:
                row = {**row, "notification_list": notification_list.pk}
            data.update({f"{prefix}-{index}-{key}": value for key, value in row.items()})
    return data


def post_list(client, notification_list, **rows):
    url = reverse("admin:notifications_notificationlist_change", args=[notification_list.pk])
    return client.post(url, list_change(notification_list, **rows))


def inline_errors(response, prefix):
    formset = next(f for f in response.context["inline_admin_formsets"] if f.formset.prefix == prefix)
    return [error for form in formset.formset.forms for errors in form.errors.values() for error in errors]


def raw_column(table, column):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table}")
        return [row[0] for row in cursor.fetchall()]


def basic(sid, token):
    return "Basic " + base64.b64encode(f"{sid}:{token}".encode()).decode()


def import_file(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    call_command("outbox_config", "import", str(path))


# --- SMS: the auth token goes to its API base URL and account only ---------------------------------


@pytest.fixture
def twilio():
    with TwilioFake(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as fake:
        yield fake


@pytest.fixture
def sms_list(channels, twilio):
    configure_sms(twilio)
    SmsTarget.objects.create(notification_list=channels, phone_number="+4930123456")
    return channels


def sms_form(config, **changes):
    data = {
        name: getattr(config, name)
        for name in ("channel", "timeout_seconds", "provider", "account_sid", "from_number", "api_base", "max_segments")
    }
    data["auth_token"] = ""
    data.update(changes)
    return data


def sms_change_url(config):
    return reverse("admin:notifications_channelconfiguration_change", args=[config.pk])


@pytest.mark.parametrize("moved", ["api_base", "account_sid"])
def test_moving_the_sms_api_or_account_without_the_auth_token_is_refused_in_the_console(
    admin_client_, sms_list, twilio, attacker, moved
):
    config = ChannelConfiguration.objects.get(channel="sms")
    value = attacker.url("") if moved == "api_base" else OTHER_SID
    response = admin_client_.post(sms_change_url(config), sms_form(config, **{moved: value}))
    assert response.status_code == 200
    (error,) = response.context["adminform"].form.errors["auth_token"]
    assert error.startswith(f"Re-enter the auth token: the {moved} changed")
    stored = ChannelConfiguration.objects.get(channel="sms")
    assert (stored.api_base, stored.account_sid) == (twilio.api_base, ACCOUNT_SID)
    notification = queue_for("sms")
    assert run_pass().delivered == 1  # still to the API the token was entered for
    assert fresh(notification).status == Status.DELIVERED
    assert attacker.received == []


def test_the_auth_token_typed_again_with_the_new_api_is_accepted_and_sent_there(admin_client_, sms_list, twilio):
    config = ChannelConfiguration.objects.get(channel="sms")
    with TwilioFake(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as edge:
        data = sms_form(config, api_base=edge.api_base, auth_token=AUTH_TOKEN)
        assert admin_client_.post(sms_change_url(config), data).status_code == 302
        queue_for("sms")
        assert run_pass().delivered == 1
        (request,) = edge.received
        assert request.headers["authorization"] == basic(ACCOUNT_SID, AUTH_TOKEN)
    assert twilio.received == []


@pytest.mark.parametrize("moved", ["api_base", "account_sid"])
def test_an_sms_api_changed_behind_the_console_never_gets_the_auth_token(sms_list, attacker, moved):
    value = attacker.url("") if moved == "api_base" else OTHER_SID
    ChannelConfiguration.objects.filter(channel="sms").update(**{moved: value})
    notification = queue_for("sms")
    run_pass()
    assert attacker.received == []
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.attempts.get().failure_class == "configuration"
    assert "auth token was entered for another API and account" in notification.last_error
    assert "must enter the auth token again" in notification.last_error


def test_an_import_moving_the_sms_api_without_the_auth_token_is_refused_and_changes_nothing(
    sms_list, twilio, attacker, tmp_path
):
    exported = configuration_export()
    moved = {"channels": {"sms": {**exported["channels"]["sms"], "api_base": attacker.url("")}}}
    with pytest.raises(CommandError, match=r"channels\.sms\.auth_token: Re-enter the auth token: the api_base changed"):
        import_file(tmp_path, moved)
    assert ChannelConfiguration.objects.get(channel="sms").api_base == twilio.api_base
    queue_for("sms")
    run_pass()
    assert attacker.received == []
    # Given in the file, the token is entered for the new API.
    moved["channels"]["sms"]["auth_token"] = "typed-again"
    import_file(tmp_path, moved)
    queue_for("sms")
    run_pass()
    assert [request.headers["authorization"] for request in attacker.received] == [basic(ACCOUNT_SID, "typed-again")]


# --- webhooks: the signing secret goes to its URL only ----------------------------------------------


@pytest.fixture
def hook(channels, webhook_receiver):
    secret = new_webhook_secret()
    webhook_receiver.secrets["/hook"] = secret
    return WebhookTarget.objects.create(notification_list=channels, url=webhook_receiver.url("/hook"), secret=secret)


@pytest.fixture
def webhook_receiver():
    with WebhookReceiver() as receiver:
        yield receiver


def test_a_webhook_url_changed_without_its_secret_is_refused_in_the_console(
    admin_client_, channels, hook, webhook_receiver, attacker
):
    response = post_list(
        admin_client_, channels, webhook_targets=[{"id": hook.pk, "url": attacker.url("/steal"), "secret": ""}]
    )
    assert response.status_code == 200
    (error,) = inline_errors(response, "webhook_targets")
    assert error.startswith("Re-enter the signing secret: the url changed")
    assert WebhookTarget.objects.get().url == webhook_receiver.url("/hook")
    queue_for("webhook")
    assert run_pass().delivered == 1
    assert attacker.received == [] and webhook_receiver.received[0].verified is True


def test_a_webhook_url_changed_with_a_new_secret_is_accepted_and_signed_with_it(admin_client_, channels, hook):
    new_secret = new_webhook_secret()
    with WebhookReceiver() as moved:
        moved.secrets["/hook"] = new_secret
        response = post_list(
            admin_client_, channels, webhook_targets=[{"id": hook.pk, "url": moved.url("/hook"), "secret": new_secret}]
        )
        assert response.status_code == 302
        queue_for("webhook")
        assert run_pass().delivered == 1
        (request,) = moved.received
        assert request.verified is True


def test_a_webhook_with_its_url_unchanged_keeps_its_secret_when_left_blank(admin_client_, channels, hook):
    url = hook.url
    response = post_list(admin_client_, channels, webhook_targets=[{"id": hook.pk, "url": url, "secret": ""}])
    assert response.status_code == 302
    assert WebhookTarget.objects.get().secret == hook.secret


def test_a_webhook_url_changed_behind_the_console_gets_no_request_signed_with_the_secret(channels, hook, attacker):
    WebhookTarget.objects.update(url=attacker.url("/steal"))
    notification = queue_for("webhook")
    run_pass()
    assert attacker.received == []
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    (target,) = notification.resolved_targets
    assert (target["outcome"], target["failure_class"]) == ("refused", "configuration")
    assert "signing secret was entered for another URL" in target["detail"]


def test_an_import_cannot_keep_a_webhook_secret_for_another_url_nor_launder_one_moved_behind_the_console(
    channels, hook, webhook_receiver, attacker, tmp_path
):
    file = {"lists": [{"name": "Channels", "webhooks": [{"url": attacker.url("/steal")}]}]}
    with pytest.raises(CommandError, match=r"webhooks\[0\]\.secret: .* has no secret in the file and none is stored"):
        import_file(tmp_path, file)
    assert WebhookTarget.objects.get().url == webhook_receiver.url("/hook")
    # Export → import keeps the secret for its own URL …
    import_file(tmp_path, configuration_export())
    assert WebhookTarget.objects.get().secret == hook.secret
    # … but not for a URL changed behind the console: exporting and importing that would bind it there.
    WebhookTarget.objects.update(url=attacker.url("/steal"))
    with pytest.raises(CommandError, match="was not entered for the current url"):
        import_file(tmp_path, configuration_export())
    queue_for("webhook")
    run_pass()
    assert attacker.received == []


# --- Teams: the URL is the credential, encrypted and replaced whole -----------------------------------


def workflow_url(server, path="/workflows/abc/triggers/manual/paths/invoke"):
    return server.url(path) + f"?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig={SIGNATURE}"


@pytest.fixture
def teams_target(channels, teams_server):
    return TeamsTarget.objects.create(notification_list=channels, url=workflow_url(teams_server))


@pytest.fixture
def teams_server():
    with TeamsReceiver() as receiver:
        yield receiver


def test_a_teams_url_is_stored_encrypted_shown_masked_and_kept_whole_when_left_blank(
    admin_client_, channels, teams_target, teams_server
):
    (stored,) = raw_column("notifications_teamstarget", "url")
    assert stored.startswith("fernet:") and SIGNATURE not in stored
    page = admin_client_.get(reverse("admin:notifications_notificationlist_change", args=[channels.pk]))
    text = page.content.decode()
    assert SIGNATURE not in text and f"127.0.0.1:{teams_server.port}" in text  # the host, masked
    response = post_list(admin_client_, channels, teams_targets=[{"id": teams_target.pk, "url": ""}])
    assert response.status_code == 302
    assert TeamsTarget.objects.get().url == workflow_url(teams_server)


def test_a_new_teams_url_replaces_the_stored_one_whole_and_never_carries_its_signature(
    admin_client_, channels, teams_target, attacker
):
    response = post_list(admin_client_, channels, teams_targets=[{"id": teams_target.pk, "url": attacker.url("/x")}])
    assert response.status_code == 302
    assert TeamsTarget.objects.get().url == attacker.url("/x")
    queue_for("teams")
    run_pass()
    (request,) = attacker.received
    assert request.query == "" and SIGNATURE not in request.body.decode()


def test_a_teams_url_listed_twice_is_a_field_error_not_a_database_error(admin_client_, channels, teams_server):
    url = workflow_url(teams_server)
    response = post_list(admin_client_, channels, teams_targets=[{"url": url}, {"url": url}])
    assert response.status_code == 200
    assert inline_errors(response, "teams_targets") == ["This Workflows URL is already a target of this list."]
    assert not TeamsTarget.objects.exists()


def test_teams_urls_are_not_exported_and_an_import_without_teams_keeps_them(channels, teams_target, teams_server):
    exported = configuration_export()
    assert SIGNATURE not in json.dumps(exported) and "teams" not in exported["lists"][0]
    configuration_import(data=exported)
    assert TeamsTarget.objects.get().url == workflow_url(teams_server)


def test_an_imported_teams_url_replaces_the_stored_one_whole(channels, teams_target, attacker):
    configuration_import(data={"lists": [{"name": "Channels", "teams": [attacker.url("/x")]}]})
    assert TeamsTarget.objects.get().url == attacker.url("/x")
    queue_for("teams")
    run_pass()
    (request,) = attacker.received
    assert request.query == "" and SIGNATURE not in request.body.decode()


def test_a_teams_url_listed_twice_in_a_file_is_named_without_its_signature(channels, teams_server):
    url = workflow_url(teams_server)
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data={"lists": [{"name": "Channels", "teams": [url, url]}]})
    (problem,) = refused.value.problems
    assert problem.startswith("lists[0] ('Channels').teams[1]:") and "listed twice" in problem
    assert SIGNATURE not in problem


# --- Apprise: the URL holds the service's credentials and is replaced whole -----------------------------


def test_a_new_apprise_url_replaces_the_stored_one_whole_and_never_carries_its_credentials(
    admin_client_, channels, attacker
):
    target = AppriseTarget.objects.create(
        notification_list=channels, url=f"json://user:apprise-secret@127.0.0.1:{attacker.port}/legit"
    )
    # Left blank: the stored URL, credentials and all, stays as it was.
    assert post_list(admin_client_, channels, apprise_targets=[{"id": target.pk, "url": ""}]).status_code == 302
    assert AppriseTarget.objects.get().url.startswith("json://user:apprise-secret@")
    # A new URL is the whole URL: the service's credentials do not come along.
    new_url = f"json://127.0.0.1:{attacker.port}/steal"
    assert post_list(admin_client_, channels, apprise_targets=[{"id": target.pk, "url": new_url}]).status_code == 302
    queue_for("apprise")
    run_pass()
    (request,) = attacker.received
    assert request.path == "/steal" and "authorization" not in request.headers
    assert "apprise-secret" not in request.body.decode()
