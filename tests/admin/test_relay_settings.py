"""The SMTP configuration's relay settings in the admin (identity, TLS trust, XOAUTH2 with a
write-only secret, the plain-text AUTH warning), list addresses with international domains,
and "Send test email" to an IDN address (through a real aiosmtpd server)."""

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import reverse

from notifications.checks import check_plaintext_auth
from notifications.models import EmailRecipient, NotificationList, SmtpConfiguration
from tests.admin.test_pages import list_form, smtp_form
from tests.support.smtp import SmtpServer


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def smtp_config(db):
    return SmtpConfiguration.objects.create(
        host="smtp.example.com", username="outbox", password="s3cret-pw", from_address="outbox@example.com"
    )


def test_relay_identity_and_trust_settings_are_saved(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    response = admin_client_.post(
        url,
        smtp_form(
            local_hostname="outbox.example.com",
            ca_file="/etc/outbox/relay-ca.pem",
            client_cert="/etc/outbox/client.pem",
            client_key="/etc/outbox/client.key",
        ),
    )
    assert response.status_code == 302
    smtp_config.refresh_from_db()
    assert (smtp_config.local_hostname, smtp_config.ca_file, smtp_config.client_key) == (
        "outbox.example.com",
        "/etc/outbox/relay-ca.pem",
        "/etc/outbox/client.key",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("local_hostname", "plant-pc", "is not fully qualified"),
        ("ca_file", "ca.pem", "must be an absolute path"),
        ("oauth_authority", "http://login.example", "must be an https URL"),
        ("from_address", "outbox@☃.example", "not a valid internationalised domain name"),
    ],
)
def test_bad_relay_settings_are_field_errors_in_words(admin_client_, smtp_config, field, value, message):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    response = admin_client_.post(url, smtp_form(**{field: value}))
    assert response.status_code == 200
    assert message in response.content.decode()


def test_the_oauth_client_secret_is_write_only_and_required_for_xoauth2(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    response = admin_client_.post(url, smtp_form(auth_method="xoauth2", oauth_tenant_id="t", oauth_client_id="c"))
    assert response.status_code == 200
    assert "Required for OAuth 2.0 (XOAUTH2)" in response.content.decode()
    fields = {"auth_method": "xoauth2", "oauth_tenant_id": "t", "oauth_client_id": "c"}
    assert admin_client_.post(url, smtp_form(**fields, oauth_client_secret="app-s3cret")).status_code == 302
    page = admin_client_.get(url).content.decode()
    assert "app-s3cret" not in page and "A client secret is stored." in page
    assert admin_client_.post(url, smtp_form(**fields)).status_code == 302  # blank keeps it
    smtp_config.refresh_from_db()
    assert smtp_config.oauth_client_secret == "app-s3cret"


def test_saving_auth_over_security_none_warns_and_the_system_check_says_so(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    response = admin_client_.post(url, smtp_form(security="none", password="s3cret-pw"), follow=True)
    assert any("unencrypted" in text for text in texts(response))
    (warning,) = check_plaintext_auth()
    assert warning.id == "outbox.W003"
    with pytest.raises(SystemCheckError, match=r"outbox\.W003"):
        call_command("check", "--database", "default", "--fail-level", "WARNING")
    SmtpConfiguration.objects.update(security="starttls")
    assert check_plaintext_auth() == []


def test_list_members_with_idn_domains_are_kept_and_undeliverable_ones_refused(admin_client_):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"), list_form("Idn", "ops@bücher.example", "x@☃.example")
    )
    assert response.status_code == 200
    assert "not a valid internationalised domain name" in response.content.decode()
    assert not NotificationList.objects.filter(name="Idn").exists()
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"), list_form("Idn", "ops@bücher.example")
    )
    assert response.status_code == 302
    assert EmailRecipient.objects.get().email == "ops@bücher.example"


def test_send_test_email_to_an_idn_address_is_delivered_in_punycode(admin_client_):
    with SmtpServer() as server:
        config = SmtpConfiguration.objects.create(
            host=server.host, port=server.port, security="none", from_address="alarme@bücher.example"
        )
        response = admin_client_.post(
            reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@bücher.example"}
        )
        assert response.status_code == 200
        assert any("accepted the test message" in text for text in texts(response))
        (received,) = server.received
    assert received.rcpt_tos == ["ops@xn--bcher-kva.example"]
    assert received.mail_from == "alarme@xn--bcher-kva.example"
    assert received.message["To"] == "ops@xn--bcher-kva.example"
