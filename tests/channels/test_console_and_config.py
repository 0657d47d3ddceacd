"""Channel targets in the console (inline forms with field errors, secrets write-only and
masked) and in the configuration file (import/export without secrets); ingest accepting every
channel."""

import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from notifications.config_file import ConfigFileError, configuration_export, configuration_import
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    NotificationList,
    SmsTarget,
    TeamsTarget,
    WebhookTarget,
)
from tests.admin.conftest import login, make_user
from tests.channels.conftest import ACCOUNT_SID
from tests.support.payloads import make_payload
from tests.support.receivers import new_webhook_secret

INLINES = ("email_recipients", "teams_targets", "webhook_targets", "sms_targets", "apprise_targets")
TEAMS_URL = (
    "https://prod-01.westeurope.logic.azure.com/workflows/abc/triggers/manual/paths/invoke?api-version=1&sig=S3CR3T"
)
APPRISE_URL = "json://user:apprise-password@127.0.0.1:8080/hook"


@pytest.fixture
def admin_client_(client, db):
    login(client, make_user("adam", groups=["Administrators"]))
    return client


def list_form(name="Channels", **inlines):
    """The list form with each inline given as a list of field dicts."""
    data = {"name": name, "description": "", "recipient_mode": "bcc"}
    for prefix in INLINES:
        rows = inlines.get(prefix, [])
        data[f"{prefix}-TOTAL_FORMS"] = str(len(rows))
        data[f"{prefix}-INITIAL_FORMS"] = "0"
        for index, row in enumerate(rows):
            data.update({f"{prefix}-{index}-{key}": value for key, value in row.items()})
    return data


def test_an_administrator_adds_targets_of_every_channel(admin_client_):
    secret = new_webhook_secret()
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"),
        list_form(
            teams_targets=[{"url": TEAMS_URL}],
            webhook_targets=[{"url": "https://hooks.example.com/outbox", "secret": secret}],
            sms_targets=[{"phone_number": "+49 30 123456"}],
            apprise_targets=[{"url": APPRISE_URL}],
        ),
    )
    assert response.status_code == 302, response.context and [
        formset.errors for formset in response.context["inline_admin_formsets"]
    ]
    channels = NotificationList.objects.get(name="Channels")
    assert channels.teams_targets.get().url == TEAMS_URL
    assert channels.webhook_targets.get().secret == secret
    assert channels.sms_targets.get().phone_number == "+4930123456"
    apprise_target = channels.apprise_targets.get()
    assert apprise_target.url == APPRISE_URL
    assert "apprise-password" not in apprise_target.display

    # The change page shows no secret: not the webhook secret, not the Apprise URL's password.
    page = admin_client_.get(
        reverse("admin:notifications_notificationlist_change", args=[channels.pk])
    ).content.decode()
    assert secret not in page and "apprise-password" not in page


@pytest.mark.parametrize(
    ("prefix", "row", "message"),
    [
        ("teams_targets", {"url": "not a url"}, "is not a valid http:// or https:// URL"),
        ("teams_targets", {"url": "ftp://example.com/x"}, "is not a valid http:// or https:// URL"),
        ("webhook_targets", {"url": "https://h.example.com/", "secret": "plain"}, 'must start with "whsec_"'),
        ("webhook_targets", {"url": "https://h.example.com/", "secret": "whsec_c2hvcnQ="}, "too short"),
        ("webhook_targets", {"url": "https://h.example.com/", "secret": ""}, "A signing secret is required"),
        ("sms_targets", {"phone_number": "030 123456"}, "is not an E.164 phone number"),
        ("sms_targets", {"phone_number": "+49-30-123456"}, "is not an E.164 phone number"),
        ("apprise_targets", {"url": "nosuchservice://x"}, "Not a usable Apprise URL"),
    ],
)
def test_a_bad_target_is_a_clear_field_error_and_nothing_is_saved(admin_client_, prefix, row, message):
    response = admin_client_.post(reverse("admin:notifications_notificationlist_add"), list_form(**{prefix: [row]}))
    assert response.status_code == 200
    assert message in response.content.decode().replace("&#x27;", "'").replace("&quot;", '"')
    assert not NotificationList.objects.filter(name="Channels").exists()


def test_the_sms_configuration_form_checks_the_account_and_keeps_the_token_write_only(admin_client_):
    url = reverse("admin:notifications_channelconfiguration_add")
    bad = admin_client_.post(
        url,
        {
            "channel": "sms",
            "timeout_seconds": 10,
            "provider": "twilio",
            "account_sid": "nope",
            "auth_token": "t",
            "from_number": "12345",
            "api_base": "https://api.twilio.com",
            "max_segments": 1,
        },
    )
    content = bad.content.decode()
    assert bad.status_code == 200
    assert "A Twilio account SID is" in content and "is not an E.164 phone number" in content
    good = admin_client_.post(
        url,
        {
            "channel": "sms",
            "timeout_seconds": 10,
            "provider": "twilio",
            "account_sid": ACCOUNT_SID,
            "auth_token": "tok-123",
            "from_number": "+15005550006",
            "api_base": "https://api.twilio.com",
            "max_segments": 2,
        },
    )
    assert good.status_code == 302
    config = ChannelConfiguration.objects.get(channel="sms")
    assert config.auth_token == "tok-123"
    page = admin_client_.get(reverse("admin:notifications_channelconfiguration_change", args=[config.pk]))
    assert "tok-123" not in page.content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT auth_token FROM notifications_channelconfiguration")
        assert cursor.fetchone()[0].startswith("fernet:")


def test_the_detail_page_shows_each_targets_outcome_and_provider_status(admin_client_, db):
    from tests.admin.conftest import make_notification

    notification = make_notification(
        type="sms",
        status="Delivered",
        resolved_targets=[
            {
                "channel": "sms",
                "target": "+4930123456",
                "outcome": "delivered",
                "provider_id": "SM1",
                "provider_status": "undelivered",
                "provider_status_at": "2026-11-23T10:00:00+00:00",
            }
        ],
    )
    content = admin_client_.get(reverse("admin:notifications_notification_change", args=[notification.pk])).content
    text = content.decode()
    assert "provider status" in text and "undelivered" in text and "+4930123456" in text


# --- configuration file ---------------------------------------------------------------------

FILE = {
    "channels": {
        "sms": {
            "provider": "twilio",
            "account_sid": ACCOUNT_SID,
            "auth_token": "tok-1",
            "from_number": "+15005550006",
            "api_base": "https://api.twilio.com",
            "timeout_seconds": 5,
            "max_segments": 2,
        },
        "teams": {"timeout_seconds": 7},
        "webhook": {"timeout_seconds": 8},
    },
    "lists": [
        {
            "name": "Channels",
            "email": ["a@example.com"],
            "teams": [TEAMS_URL],
            "webhooks": [{"url": "https://hooks.example.com/outbox", "secret": "whsec_" + "QUJD" * 11}],
            "sms": ["+4930123456"],
            "apprise": [APPRISE_URL],
        }
    ],
}


def test_the_file_imports_targets_and_channels_and_exports_them_without_secrets(db):
    configuration_import(data=json.loads(json.dumps(FILE)))
    assert ChannelConfiguration.objects.get(channel="sms").auth_token == "tok-1"
    assert ChannelConfiguration.objects.get(channel="teams").timeout_seconds == 7
    assert WebhookTarget.objects.get().secret == "whsec_" + "QUJD" * 11
    assert AppriseTarget.objects.get().url == APPRISE_URL

    exported = configuration_export()
    text = json.dumps(exported)
    assert "tok-1" not in text and "whsec_" not in text and "apprise-password" not in text
    assert "S3CR3T" not in text and "logic.azure.com" not in text  # a Teams URL is a credential
    (entry,) = exported["lists"]
    assert entry["webhooks"] == [{"url": "https://hooks.example.com/outbox"}]
    assert entry["sms"] == ["+4930123456"]
    assert "apprise" not in entry and "teams" not in entry
    assert "auth_token" not in exported["channels"]["sms"]

    # Importing the export again keeps every secret and every target.
    configuration_import(data=exported)
    assert ChannelConfiguration.objects.get(channel="sms").auth_token == "tok-1"
    assert WebhookTarget.objects.get().secret == "whsec_" + "QUJD" * 11
    assert AppriseTarget.objects.get().url == APPRISE_URL
    assert TeamsTarget.objects.get().url == TEAMS_URL


def test_a_channel_key_replaces_that_channels_targets_and_a_missing_key_keeps_them(db):
    configuration_import(data=json.loads(json.dumps(FILE)))
    configuration_import(data={"lists": [{"name": "channels", "sms": ["+4930999999"]}]})
    assert list(SmsTarget.objects.values_list("phone_number", flat=True)) == ["+4930999999"]
    assert TeamsTarget.objects.count() == 1 and WebhookTarget.objects.count() == 1


def test_an_invalid_file_names_every_problem_and_changes_nothing(db):
    bad = {
        "channels": {"sms": {"provider": "twilio", "account_sid": "x", "from_number": "0301"}, "pager": {}},
        "lists": [
            {
                "name": "Channels",
                "teams": ["notaurl"],
                "webhooks": [{"url": "https://h.example.com/", "secret": "nope"}, {"url": "https://n.example.com/"}],
                "sms": ["+49301234567", "+49301234567", "12"],
                "apprise": ["bogus://x"],
            }
        ],
    }
    with pytest.raises(ConfigFileError) as caught:
        configuration_import(data=bad)
    problems = "\n".join(caught.value.problems)
    for expected in (
        "channels.pager: unknown channel",
        "channels.sms.account_sid: A Twilio account SID",
        "channels.sms.auth_token: The account's auth token is required.",
        "channels.sms.from_number:",
        "lists[0] ('Channels').teams[0]:",
        "lists[0] ('Channels').webhooks[0].secret: The signing secret must start with \"whsec_\"",
        "lists[0] ('Channels').sms[1]: '+49301234567' is listed twice.",
        "lists[0] ('Channels').sms[2]: '12' is not an E.164 phone number",
        "lists[0] ('Channels').apprise[0]: Not a usable Apprise URL",
    ):
        assert expected in problems, problems
    assert "bogus" not in problems.split("apprise[0]")[1]  # an Apprise URL is never echoed
    assert not NotificationList.objects.exists() and not ChannelConfiguration.objects.exists()


def test_a_new_webhook_without_a_secret_is_refused_on_import(db):
    with pytest.raises(ConfigFileError, match="has no secret in the file and none is stored"):
        configuration_import(data={"lists": [{"name": "Channels", "webhooks": [{"url": "https://h.example.com/"}]}]})
    assert not NotificationList.objects.exists()


def test_rotate_secrets_re_encrypts_channel_secrets(db, settings, capsys):
    configuration_import(data=json.loads(json.dumps(FILE)))
    settings.OUTBOX_SECRET_KEYS = ["new-key", settings.SECRET_KEY]
    call_command("rotate_secrets")
    settings.OUTBOX_SECRET_KEYS = ["new-key"]  # the old key is gone: everything must decrypt with the new one
    assert ChannelConfiguration.objects.get(channel="sms").auth_token == "tok-1"
    assert WebhookTarget.objects.get().secret == "whsec_" + "QUJD" * 11
    assert AppriseTarget.objects.get().url == APPRISE_URL
    assert "1 webhook target(s)" in capsys.readouterr().out


# --- ingest ---------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", ["email", "teams", "webhook", "sms", "apprise"])
def test_ingest_accepts_every_channel(api, channel):
    response = api.post("/api/v1/notifications/", make_payload(type=channel), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["type"] == channel


def test_ingest_refuses_an_unknown_channel_with_400(api):
    response = api.post("/api/v1/notifications/", make_payload(type="pager"), format="json")
    assert response.status_code == 400
    assert "pager" in json.dumps(response.json())


@pytest.mark.parametrize("facts", [["not an object"], "text", [{"title": "a"}], {"a": {"nested": 1}}, {"a": True}])
def test_ingest_refuses_malformed_teams_facts_naming_the_field(api, facts):
    response = api.post("/api/v1/notifications/", make_payload(type="teams", type_data={"facts": facts}), format="json")
    assert response.status_code == 400
    assert "type_data.facts" in json.dumps(response.json())


# --- system checks --------------------------------------------------------------------------


def test_the_system_check_warns_when_lists_hold_numbers_but_sms_is_not_configured(channel_list):
    from notifications.checks import check_channels

    assert check_channels() == []
    SmsTarget.objects.create(notification_list=channel_list, phone_number="+4930123456")
    (warning,) = check_channels()
    assert warning.id == "outbox.W011"
    assert "auth_token" in warning.msg and "Channel configuration" in str(warning.hint)
    configuration_import(data={"channels": FILE["channels"]})
    assert check_channels() == []


def test_the_system_check_reports_channel_secrets_the_keys_cannot_decrypt(channel_list, settings):
    from notifications.checks import check_channels

    WebhookTarget.objects.create(
        notification_list=channel_list, url="https://h.example.com/", secret=new_webhook_secret()
    )
    settings.OUTBOX_SECRET_KEYS = ["a-key-that-did-not-encrypt-it"]
    (error,) = check_channels()
    assert error.id == "outbox.E011"
    assert "OUTBOX_SECRET_KEYS" in error.msg
