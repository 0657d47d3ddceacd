"""The SMTP password is encrypted at rest, decrypts transparently, and rotates."""

import io

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from notifications.checks import check_secrets_decryptable
from notifications.models import SmtpConfiguration
from notifications.secrets import SecretDecryptionError


def stored_password():
    with connection.cursor() as cursor:
        cursor.execute("SELECT password FROM notifications_smtpconfiguration")
        return cursor.fetchone()[0]


@pytest.fixture
def smtp_config(db):
    return SmtpConfiguration.objects.create(host="smtp.example.com", from_address="o@example.com", password="hunter2")


def test_password_is_stored_encrypted_and_read_back_as_plaintext(smtp_config):
    raw = stored_password()
    assert raw.startswith("fernet:")
    assert "hunter2" not in raw
    assert SmtpConfiguration.objects.get().password == "hunter2"


def test_empty_password_stays_empty(db):
    SmtpConfiguration.objects.create(host="h", from_address="o@example.com", password="")
    assert stored_password() == ""
    assert SmtpConfiguration.objects.get().password == ""


def test_rotation_re_encrypts_under_the_new_key_and_the_old_key_can_then_go(smtp_config):
    before = stored_password()
    with override_settings(OUTBOX_SECRET_KEYS=["new-key", settings.SECRET_KEY]):
        assert SmtpConfiguration.objects.get().password == "hunter2"  # old key still decrypts
        out = io.StringIO()
        call_command("rotate_secrets", stdout=out)
        assert "Re-encrypted 1" in out.getvalue()
        assert stored_password() != before
    with override_settings(OUTBOX_SECRET_KEYS=["new-key"]):
        assert SmtpConfiguration.objects.get().password == "hunter2"


def test_a_wrong_key_is_a_clear_error_and_a_failing_system_check(smtp_config):
    with override_settings(OUTBOX_SECRET_KEYS=["some-other-key"]):
        with pytest.raises(SecretDecryptionError, match="OUTBOX_SECRET_KEYS"):
            SmtpConfiguration.current()
        errors = check_secrets_decryptable()
        assert [error.id for error in errors] == ["outbox.E001"]
        with pytest.raises(CommandError, match="cannot be decrypted"):
            call_command("rotate_secrets", stdout=io.StringIO())
    assert check_secrets_decryptable() == []


def test_a_console_page_whose_secret_no_key_decrypts_says_what_to_do_instead_of_failing(smtp_config, client):
    from notifications.models import ChannelConfiguration, NotificationList, TeamsTarget
    from tests.admin.conftest import login, make_user

    notification_list = NotificationList.objects.create(name="Night shift")
    TeamsTarget.objects.create(
        notification_list=notification_list, url="https://prod.example.com/workflows/x/invoke?sig=SECRET"
    )
    ChannelConfiguration.objects.create(channel="sms", provider="twilio", auth_token="token")
    login(client, make_user("adam", groups=["Administrators"]))
    pages = [
        reverse("admin:notifications_notificationlist_change", args=[notification_list.pk]),
        reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk]),
        reverse("admin:notifications_smtpconfiguration_changelist"),
        reverse("admin:notifications_channelconfiguration_changelist"),
    ]
    with override_settings(OUTBOX_SECRET_KEYS=["some-other-key"]):
        for page in pages:
            response = client.get(page, follow=True)
            assert response.status_code == 200, page
            said = [str(message) for message in response.context["messages"]]
            assert any("cannot be shown" in text and "OUTBOX_SECRET_KEYS" in text for text in said), (page, said)
    assert client.get(pages[0]).status_code == 200  # the right key: the page as usual
