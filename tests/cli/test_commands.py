"""The administrators' CLI: site keys and configuration as code."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from notifications.models import NotificationList, SmtpConfiguration
from notifications.policies import delivery_policy_default
from sites.models import Site, SiteAPIKey
from tests.support.payloads import make_payload

CONFIG = {
    "smtp": {
        "host": "smtp.example.com",
        "port": 587,
        "security": "starttls",
        "username": "outbox",
        "password": "s3cret",
        "from_address": "outbox@example.com",
        "timeout_seconds": 10,
        "greeting_timeout_seconds": 45,
        "data_timeout_seconds": 900,
        "max_retries": 10,
        "retry_interval_seconds": 60,
        "local_hostname": "outbox.example.com",
        "ca_file": "/etc/outbox/relay-ca.pem",
        "client_cert": "",
        "client_key": "",
        "auth_method": "password",
        "oauth_tenant_id": "",
        "oauth_client_id": "",
        "oauth_client_secret": "",
        "oauth_client_certificate": "",
        "oauth_authority": "",
    },
    "policies": {
        "email": {
            "strategy": "exponential",
            "interval_seconds": 30,
            "max_interval_seconds": 900,
            "jitter": 0.2,
            "max_attempts": 8,
            "max_age_seconds": 86400,
            "retry_on": ["connection", "timeout", "auth", "throttled", "provider_error"],
            "breaker_threshold": 5,
            "breaker_cooldown_seconds": 30,
            "breaker_max_cooldown_seconds": 600,
            "rate_per_minute": 30,
        }
    },
    "lists": [
        {
            "name": "Operators",
            "description": "Shift operators",
            "recipient_mode": "individual",
            "email": ["a@example.com", "b@example.com"],
        }
    ],
    "sites": [{"site_id": "plant-a", "name": "Plant A", "active": True}],
}


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_create_site_key_prints_a_working_key_as_its_last_line(site):
    out, _ = run("create_site_key", "plant-a")
    key = out.strip().splitlines()[-1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    response = client.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    assert response.status_code == 201


def test_create_site_key_for_an_unknown_site_names_the_site(db):
    with pytest.raises(CommandError, match="nowhere"):
        run("create_site_key", "nowhere")


def test_create_site_key_with_expiry_sets_the_expiry(site):
    run("create_site_key", "plant-a", "--expires-in-days", "30")
    assert SiteAPIKey.objects.get(site=site).expiry_date is not None


def test_revoke_site_key_makes_the_key_fail(site):
    out, _ = run("create_site_key", "plant-a")
    key = out.strip().splitlines()[-1]
    out, _ = run("revoke_site_key", key.partition(".")[0])
    assert "Revoked" in out
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    response = client.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    assert response.status_code == 401


def test_revoke_unknown_prefix_is_a_clear_error(db):
    with pytest.raises(CommandError, match="No API key"):
        run("revoke_site_key", "zzzzzzzz")


def test_import_creates_everything_and_export_round_trips_without_secrets(db, tmp_path):
    out, _ = run("outbox_config", "import", write(tmp_path, CONFIG))
    assert "policies 1 created" in out and "lists 1 created" in out and "sites 1 created" in out
    assert SmtpConfiguration.objects.get().password == "s3cret"
    assert list(NotificationList.objects.get(name="Operators").email_recipients.values_list("email", flat=True)) == [
        "a@example.com",
        "b@example.com",
    ]

    exported, _ = run("outbox_config", "export")
    data = json.loads(exported)
    assert "password" not in data["smtp"]
    assert "s3cret" not in exported
    expected = json.loads(json.dumps(CONFIG))
    del expected["smtp"]["password"], expected["smtp"]["oauth_client_secret"]
    # Every channel's effective policy is exported, the defaults of the channels the file left out too.
    for channel in ("teams", "webhook", "sms", "apprise"):
        expected["policies"][channel] = delivery_policy_default(channel=channel).as_dict()
    # A list setting the file left out is exported at its value (the default).
    expected["lists"][0]["resend_after_local_delivery"] = False
    expected["lists"][0].update(ack_required_from="high", escalation=[], repeat_last_every_seconds=0)
    expected["lists"][0].update(dedup_window_seconds=0, flood_threshold=0, flood_window_seconds=60)
    assert data == expected

    # Re-importing the export keeps the stored password.
    run("outbox_config", "import", write(tmp_path, data, "export.json"))
    assert SmtpConfiguration.objects.get().password == "s3cret"


def test_import_upserts_by_natural_key_and_replaces_recipients(db, tmp_path):
    run("outbox_config", "import", write(tmp_path, CONFIG))
    update = {
        "lists": [{"name": "OPERATORS", "email": ["c@example.com"]}, {"name": "Managers", "email": []}],
        "sites": [{"site_id": "plant-a", "active": False}],
    }
    out, _ = run("outbox_config", "import", write(tmp_path, update, "update.json"))
    assert "lists 1 created, 1 updated" in out
    operators = NotificationList.objects.get(name__iexact="operators")
    assert operators.name == "OPERATORS"
    assert list(operators.email_recipients.values_list("email", flat=True)) == ["c@example.com"]
    site = Site.objects.get(site_id="plant-a")
    assert site.active is False and site.name == "Plant A"
    assert SmtpConfiguration.objects.get().host == "smtp.example.com"


def test_a_list_imported_without_recipient_mode_is_bcc_and_an_update_without_it_keeps_the_mode(db, tmp_path):
    run("outbox_config", "import", write(tmp_path, {"lists": [{"name": "Leads", "email": ["a@example.com"]}]}))
    assert NotificationList.objects.get(name="Leads").recipient_mode == "bcc"
    run("outbox_config", "import", write(tmp_path, CONFIG))
    run("outbox_config", "import", write(tmp_path, {"lists": [{"name": "operators", "email": []}]}, "update.json"))
    assert NotificationList.objects.get(name__iexact="operators").recipient_mode == "individual"


@pytest.mark.parametrize(
    "broken, message",
    [
        ({"lists": [{"name": "Ops", "email": ["not-an-email"]}]}, "lists[0] ('Ops').email[0]: 'not-an-email'"),
        ({"lists": [{"name": "Ops"}, {"name": "ops"}]}, "lists[1] ('ops'): duplicate"),
        ({"lists": [{"email": []}]}, "lists[0].name: is required"),
        ({"sites": [{"site_id": "bad id!"}]}, "sites[0].site_id"),
        ({"sites": [{"site_id": "ok", "active": "yes"}]}, "sites[0] ('ok').active"),
        ({"smtp": {"host": "h", "from_address": "x@example.com", "security": "ssl"}}, "smtp.security: 'ssl'"),
        ({"smtp": {"host": "h", "from_address": "x@example.com", "port": 70000}}, "smtp.port"),
        ({"smtp": {"from_address": "x@example.com"}}, "smtp.host: is required"),
        ({"colours": []}, "colours: unknown section"),
        ({"lists": [{"name": "Ops", "recipient_mode": "cc"}]}, "lists[0] ('Ops').recipient_mode: 'cc' is not one of"),
    ],
)
def test_invalid_file_names_the_offending_entry_and_changes_nothing(db, tmp_path, broken, message):
    run("outbox_config", "import", write(tmp_path, CONFIG))
    data = dict(CONFIG, **broken)
    data["lists"] = [*list(data["lists"]), {"name": "Extra", "email": ["x@example.com"]}]
    with pytest.raises(CommandError) as excinfo:
        run("outbox_config", "import", write(tmp_path, data, "broken.json"))
    assert message in str(excinfo.value)
    assert "nothing was changed" in str(excinfo.value)
    assert not NotificationList.objects.filter(name="Extra").exists()


def test_import_of_a_missing_or_malformed_file_is_a_clear_error(db, tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run("outbox_config", "import", str(tmp_path / "missing.json"))
    with pytest.raises(CommandError, match="not valid JSON"):
        run("outbox_config", "import", write(tmp_path, "{nope"))


def test_an_import_with_a_data_timeout_below_one_second_is_refused_naming_the_field(db, tmp_path):
    bad = json.loads(json.dumps(CONFIG))
    bad["smtp"]["data_timeout_seconds"] = 0
    with pytest.raises(CommandError, match=r"smtp\.data_timeout_seconds: must be at least 1"):
        run("outbox_config", "import", write(tmp_path, bad))
    assert not SmtpConfiguration.objects.exists()


def test_an_import_with_a_greeting_timeout_below_one_second_is_refused_naming_the_field(db, tmp_path):
    bad = json.loads(json.dumps(CONFIG))
    bad["smtp"]["greeting_timeout_seconds"] = 0
    with pytest.raises(CommandError, match=r"smtp\.greeting_timeout_seconds: must be at least 1"):
        run("outbox_config", "import", write(tmp_path, bad))
    bad["smtp"]["greeting_timeout_seconds"] = "30"
    with pytest.raises(CommandError, match=r"smtp\.greeting_timeout_seconds: must be an integer"):
        run("outbox_config", "import", write(tmp_path, bad))
    assert not SmtpConfiguration.objects.exists()


def test_a_file_without_a_greeting_timeout_imports_with_the_default_and_then_keeps_the_stored_one(db, tmp_path):
    older = json.loads(json.dumps(CONFIG))
    del older["smtp"]["greeting_timeout_seconds"]  # written before the key existed
    run("outbox_config", "import", write(tmp_path, older))
    assert SmtpConfiguration.objects.get().greeting_timeout_seconds == 30
    SmtpConfiguration.objects.update(greeting_timeout_seconds=120)
    run("outbox_config", "import", write(tmp_path, older))
    assert SmtpConfiguration.objects.get().greeting_timeout_seconds == 120


def test_an_import_moving_the_smtp_server_without_a_password_is_refused_and_changes_nothing(db, tmp_path):
    run("outbox_config", "import", write(tmp_path, CONFIG))
    moved = json.loads(json.dumps(CONFIG))
    del moved["smtp"]["password"]
    moved["smtp"]["host"] = "attacker.example"
    with pytest.raises(CommandError, match=r"smtp\.password: Re-enter the password"):
        run("outbox_config", "import", write(tmp_path, moved, "moved.json"))
    config = SmtpConfiguration.objects.get()
    assert (config.host, config.password) == ("smtp.example.com", "s3cret")


def test_list_names_in_a_configuration_file_follow_the_ingest_rules(db, tmp_path):
    data = {"lists": [{"name": "  Operators "}, {"name": "OPERATORS"}, {"name": "\u041eperators"}]}
    with pytest.raises(CommandError) as refused:
        run("outbox_config", "import", write(tmp_path, data))
    message = str(refused.value)
    assert "duplicate of lists[0]" in message
    assert "Mixes Cyrillic and Latin letters" in message
    run("outbox_config", "import", write(tmp_path, {"lists": [{"name": "  Operators "}]}))
    assert list(NotificationList.objects.values_list("name", flat=True)) == ["Operators"]
