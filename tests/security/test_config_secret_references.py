"""Secrets by reference in the configuration file: ``{"env": "NAME"}`` wherever the file may
carry a secret, resolved from the importing process's environment; a missing or empty variable
is refused naming the field and the variable, and nothing is written."""

import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from notifications.config_file import configuration_export, configuration_validate
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    NotificationList,
    SmtpConfiguration,
    TeamsTarget,
    WebhookTarget,
)
from tests.channels.conftest import ACCOUNT_SID
from tests.dispatch.conftest import queue, run_pass
from tests.support.receivers import WebhookReceiver, new_webhook_secret
from tests.support.smtp import SmtpServer

TEAMS_URL = "https://prod-01.westeurope.logic.azure.com/workflows/abc/triggers/manual/paths/invoke?sig=ENVSIG"
APPRISE_URL = "json://user:apprise-env-secret@127.0.0.1:8080/hook"


def import_file(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    call_command("outbox_config", "import", str(path))


def raw(table, column):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table}")
        return [row[0] for row in cursor.fetchall()]


def referencing_file(*, host="smtp.example.com", port=587, hook_url="https://hooks.example.com/outbox"):
    return {
        "smtp": {
            "host": host,
            "port": port,
            "security": "none",
            "username": "outbox",
            "password": {"env": "OUTBOX_TEST_SMTP_PASSWORD"},
            "oauth_client_secret": {"env": "OUTBOX_TEST_OAUTH_SECRET"},
            "from_address": "outbox@example.com",
            "timeout_seconds": 3,
        },
        "channels": {
            "sms": {
                "provider": "twilio",
                "account_sid": ACCOUNT_SID,
                "auth_token": {"env": "OUTBOX_TEST_TWILIO_TOKEN"},
                "from_number": "+15005550006",
            }
        },
        "lists": [
            {
                "name": "Operators",
                "email": ["ops@example.com"],
                "teams": [{"env": "OUTBOX_TEST_TEAMS_URL"}],
                "webhooks": [{"url": hook_url, "secret": {"env": "OUTBOX_TEST_WEBHOOK_SECRET"}}],
                "apprise": [{"env": "OUTBOX_TEST_APPRISE_URL"}],
            }
        ],
    }


def test_every_secret_given_by_reference_is_resolved_stored_encrypted_and_used(db, tmp_path, monkeypatch):
    webhook_secret = new_webhook_secret()
    env = {
        "OUTBOX_TEST_SMTP_PASSWORD": "pw-from-env",
        "OUTBOX_TEST_OAUTH_SECRET": "oauth-from-env",
        "OUTBOX_TEST_TWILIO_TOKEN": "token-from-env",
        "OUTBOX_TEST_TEAMS_URL": TEAMS_URL,
        "OUTBOX_TEST_WEBHOOK_SECRET": webhook_secret,
        "OUTBOX_TEST_APPRISE_URL": APPRISE_URL,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with SmtpServer(auth=("outbox", "pw-from-env")) as server, WebhookReceiver() as hooks:
        hooks.secrets["/hook"] = webhook_secret
        data = referencing_file(host=server.host, port=server.port, hook_url=hooks.url("/hook"))
        import_file(tmp_path, data)

        smtp = SmtpConfiguration.objects.get()
        assert (smtp.password, smtp.oauth_client_secret) == ("pw-from-env", "oauth-from-env")
        assert ChannelConfiguration.objects.get(channel="sms").auth_token == "token-from-env"
        assert TeamsTarget.objects.get().url == TEAMS_URL
        assert WebhookTarget.objects.get().secret == webhook_secret
        assert AppriseTarget.objects.get().url == APPRISE_URL
        for table, column in (
            ("notifications_smtpconfiguration", "password"),
            ("notifications_smtpconfiguration", "oauth_client_secret"),
            ("notifications_channelconfiguration", "auth_token"),
            ("notifications_teamstarget", "url"),
            ("notifications_webhooktarget", "secret"),
            ("notifications_apprisetarget", "url"),
        ):
            (stored,) = raw(table, column)
            assert stored.startswith("fernet:"), (table, column)
        assert not any(value in json.dumps(configuration_export()) for value in env.values())

        # Bound to the destinations of the file: delivery logs in and signs with them.
        queue()
        queue(type="webhook")
        assert run_pass().delivered == 2
        assert server.auth_log == [("PLAIN", b"outbox", b"pw-from-env")]
        assert hooks.received[0].verified is True

        # The same file imported again changes nothing.
        import_file(tmp_path, data)
        assert SmtpConfiguration.objects.get().password == "pw-from-env"
        assert TeamsTarget.objects.count() == 1


@pytest.mark.parametrize(
    ("unset", "field"),
    [
        ("OUTBOX_TEST_SMTP_PASSWORD", "smtp.password"),
        ("OUTBOX_TEST_OAUTH_SECRET", "smtp.oauth_client_secret"),
        ("OUTBOX_TEST_TWILIO_TOKEN", "channels.sms.auth_token"),
        ("OUTBOX_TEST_TEAMS_URL", "lists[0] ('Operators').teams[0]"),
        ("OUTBOX_TEST_WEBHOOK_SECRET", "lists[0] ('Operators').webhooks[0].secret"),
        ("OUTBOX_TEST_APPRISE_URL", "lists[0] ('Operators').apprise[0]"),
    ],
)
def test_a_missing_variable_is_refused_naming_the_field_and_the_variable_and_nothing_is_written(
    db, tmp_path, monkeypatch, unset, field
):
    for name, value in {
        "OUTBOX_TEST_SMTP_PASSWORD": "pw",
        "OUTBOX_TEST_OAUTH_SECRET": "oauth",
        "OUTBOX_TEST_TWILIO_TOKEN": "token",
        "OUTBOX_TEST_TEAMS_URL": TEAMS_URL,
        "OUTBOX_TEST_WEBHOOK_SECRET": new_webhook_secret(),
        "OUTBOX_TEST_APPRISE_URL": APPRISE_URL,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(unset)
    with pytest.raises(CommandError) as refused:
        import_file(tmp_path, referencing_file())
    message = str(refused.value)
    assert f"{field}: the environment variable {unset} is not set." in message
    assert "1 problem(s); nothing was changed" in message
    assert not SmtpConfiguration.objects.exists()
    assert not ChannelConfiguration.objects.exists()
    assert not NotificationList.objects.exists()


def test_an_empty_variable_and_a_malformed_reference_are_refused_in_words(db, monkeypatch):
    monkeypatch.setenv("OUTBOX_TEST_EMPTY", "")
    problems = configuration_validate(
        data={
            "smtp": {"host": "smtp.example.com", "from_address": "o@example.com", "password": {"env": "OUTBOX_TEST_EMPTY"}},
            "lists": [{"name": "Ops", "teams": [{"env": ""}], "webhooks": [{"url": "https://h.example.com/", "secret": {"variable": "X"}}]}],
        }
    )  # fmt: skip
    assert problems == [
        "smtp.password: the environment variable OUTBOX_TEST_EMPTY is empty.",
        'lists[0] (\'Ops\').teams[0]: must be a string or {"env": "NAME"} naming an environment variable.',
        'lists[0] (\'Ops\').webhooks[0].secret: must be a string or {"env": "NAME"} naming an environment variable.',
    ]


def test_a_reference_resolves_only_where_a_secret_may_be(db, monkeypatch):
    monkeypatch.setenv("OUTBOX_TEST_HOST", "smtp.example.com")
    problems = configuration_validate(
        data={"smtp": {"host": {"env": "OUTBOX_TEST_HOST"}, "from_address": "o@example.com"}}
    )
    assert "smtp.host: must be a string." in problems


def test_a_bad_teams_url_from_the_environment_is_refused_without_echoing_it(db, monkeypatch):
    monkeypatch.setenv("OUTBOX_TEST_TEAMS_URL", "https://bad url/?sig=ENVSIG")
    (problem,) = configuration_validate(data={"lists": [{"name": "Ops", "teams": [{"env": "OUTBOX_TEST_TEAMS_URL"}]}]})
    assert problem == "lists[0] ('Ops').teams[0]: The Workflows URL is not a valid http:// or https:// URL."
