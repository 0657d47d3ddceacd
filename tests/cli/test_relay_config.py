"""The relay settings in the configuration file: identity, TLS trust, XOAUTH2 (the secret is
write-only), and addresses checked as the list editor checks them (IDN domains allowed)."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from notifications.config_file import configuration_export, configuration_validate
from notifications.models import EmailRecipient, SmtpConfiguration

SMTP = {
    "host": "smtp.office365.com",
    "port": 587,
    "security": "starttls",
    "username": "alerts@contoso.example",
    "from_address": "alerts@contoso.example",
    "auth_method": "xoauth2",
    "oauth_tenant_id": "8d3e1c2a-tenant",
    "oauth_client_id": "0f1e2d3c-client",
    "oauth_client_secret": "app-s3cret",
    "local_hostname": "outbox.contoso.example",
}


def import_file(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    out = io.StringIO()
    call_command("outbox_config", "import", str(path), stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_xoauth2_settings_import_and_the_client_secret_is_never_exported(db, tmp_path):
    import_file(tmp_path, {"smtp": SMTP})
    config = SmtpConfiguration.objects.get()
    assert (config.auth_method, config.oauth_client_secret) == ("xoauth2", "app-s3cret")
    exported = configuration_export()
    assert "oauth_client_secret" not in exported["smtp"]
    assert "app-s3cret" not in json.dumps(exported)
    assert exported["smtp"]["oauth_tenant_id"] == "8d3e1c2a-tenant"
    # Re-importing the export keeps the stored secret.
    import_file(tmp_path, exported)
    assert SmtpConfiguration.objects.get().oauth_client_secret == "app-s3cret"


def test_moving_the_token_endpoint_needs_the_secret_again(db, tmp_path):
    import_file(tmp_path, {"smtp": SMTP})
    moved = {**SMTP, "oauth_authority": "https://login.attacker.example"}
    del moved["oauth_client_secret"]
    with pytest.raises(CommandError, match="Re-enter the OAuth client secret"):
        import_file(tmp_path, {"smtp": moved})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("auth_method", "ntlm", "is not one of password, xoauth2"),
        ("local_hostname", "plant pc", "is not a host name"),
        ("local_hostname", "plant-pc", "is not fully qualified"),
        ("ca_file", "relay-ca.pem", "must be an absolute path"),
        ("oauth_authority", "http://login.example", "must be an https URL"),
        ("from_address", "alerts@☃.example", "is not a valid internationalised domain name"),
    ],
)
def test_bad_relay_settings_are_refused_with_the_field_named(db, field, value, message):
    problems = configuration_validate(data={"smtp": {**SMTP, field: value}})
    assert any(problem.startswith(f"smtp.{field}:") and message in problem for problem in problems), problems


def test_list_addresses_with_idn_domains_are_accepted_and_undeliverable_ones_refused(db, tmp_path):
    import_file(tmp_path, {"lists": [{"name": "Idn", "email": ["ops@bücher.example"]}]})
    assert EmailRecipient.objects.get().email == "ops@bücher.example"
    problems = configuration_validate(data={"lists": [{"name": "Bad", "email": ["ops@☃.example", "a b@example.com"]}]})
    assert problems == [
        "lists[0] ('Bad').email[0]: 'ops@☃.example' cannot be delivered: the domain '☃.example' is not a valid "
        "internationalised domain name (Codepoint U+2603 at position 1 of '☃' not allowed).",
        "lists[0] ('Bad').email[1]: 'a b@example.com' is not a valid email address.",
    ]
