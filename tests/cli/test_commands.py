"""The administrators' CLI: site keys and configuration as code."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from notifications.models import NotificationList, SmtpConfiguration
from sites.models import Site, SiteAPIKey
from tests.conftest import make_payload

CONFIG = {
    "smtp": {"host": "smtp.example.com", "port": 587, "security": "starttls", "username": "outbox",
             "password": "s3cret", "from_address": "outbox@example.com", "timeout_seconds": 10,
             "max_retries": 10, "retry_interval_seconds": 60},
    "lists": [{"name": "Operators", "description": "Shift operators", "email": ["a@example.com", "b@example.com"]}],
    "sites": [{"site_id": "plant-a", "name": "Plant A", "active": True}],
}  # fmt: skip


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
    assert "lists 1 created" in out and "sites 1 created" in out
    assert SmtpConfiguration.current().password == "s3cret"
    assert list(NotificationList.objects.get(name="Operators").email_recipients.values_list("email", flat=True)) == [
        "a@example.com", "b@example.com"
    ]  # fmt: skip

    exported, _ = run("outbox_config", "export")
    data = json.loads(exported)
    assert "password" not in data["smtp"]
    assert "s3cret" not in exported
    expected = json.loads(json.dumps(CONFIG))
    del expected["smtp"]["password"]
    assert data == expected

    # Re-importing the export keeps the stored password.
    run("outbox_config", "import", write(tmp_path, data, "export.json"))
    assert SmtpConfiguration.current().password == "s3cret"


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
    assert SmtpConfiguration.current().host == "smtp.example.com"


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
    ],
)
def test_invalid_file_names_the_offending_entry_and_changes_nothing(db, tmp_path, broken, message):
    run("outbox_config", "import", write(tmp_path, CONFIG))
    data = dict(CONFIG, **broken)
    data["lists"] = list(data["lists"]) + [{"name": "Extra", "email": ["x@example.com"]}]
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
