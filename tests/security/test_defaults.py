"""Safe defaults: a generated (not predictable) secret key that older encrypted secrets survive,
a Content-Security-Policy on every page, schedules limited to the outbox's own tasks, and no
query value in the access log."""

import io
import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from django_q.models import Schedule

from notifications.models import SmtpConfiguration
from notifications.schedules import schedule_functions_allowed
from outbox_project.log_redaction import query_redact
from outbox_project.weblog import RedactingLogger
from tests.support.processes import ROOT


def secret_key_in_a_new_process(key_file):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "OUTBOX_HTTPS")}
    env["OUTBOX_SECRET_KEY_FILE"] = str(key_file)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)",
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "outbox_project.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_without_secret_key_a_random_key_is_generated_once_kept_private_and_reused(tmp_path):
    key_file = tmp_path / "var" / "secret_key"
    first = secret_key_in_a_new_process(key_file)
    assert len(first) >= 50 and not first.startswith("insecure")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert secret_key_in_a_new_process(key_file) == first
    other = tmp_path / "elsewhere" / "secret_key"
    assert secret_key_in_a_new_process(other) != first


def test_a_password_encrypted_under_the_former_development_key_still_decrypts_and_rotates(db):
    legacy = "insecure-dev-key-/srv/outbox"
    with override_settings(SECRET_KEY=legacy, OUTBOX_SECRET_KEYS=[]):
        SmtpConfiguration.objects.create(host="h", from_address="o@example.com", password="hunter2")
    generated = {"SECRET_KEY": "a-generated-key", "SECRET_KEY_GENERATED": True, "OUTBOX_SECRET_KEYS": []}
    with override_settings(LEGACY_DEVELOPMENT_SECRET_KEY=legacy, **generated):
        assert SmtpConfiguration.objects.get().password == "hunter2"
        call_command("rotate_secrets", stdout=io.StringIO())
    with override_settings(LEGACY_DEVELOPMENT_SECRET_KEY="gone", **generated):
        assert SmtpConfiguration.objects.get().password == "hunter2"  # now under the new key


def test_every_page_carries_a_content_security_policy_without_inline_scripts(client, db):
    policy = client.get("/admin/login/")["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    assert "Content-Security-Policy" in client.get("/healthz")


def test_a_schedule_can_only_run_the_outboxs_own_tasks_without_a_hook(admin_client):
    url = reverse("admin:django_q_schedule_add")
    form = {"name": "evil", "func": "os.system", "args": "'id'", "schedule_type": "O", "repeats": "-1"}
    response = admin_client.post(url, form)
    assert response.status_code == 200
    assert "Only the outbox&#x27;s own tasks can be scheduled" in response.content.decode()
    allowed = sorted(schedule_functions_allowed())[0]
    response = admin_client.post(url, {**form, "func": allowed, "args": "", "hook": "os.system"})
    assert "A hook function cannot be set from the console." in response.content.decode()
    assert not Schedule.objects.filter(name="evil").exists()


def test_query_values_never_reach_the_access_log():
    assert query_redact("list_name=Ops&api_key=abc.def&x=1") == "list_name=[redacted]&api_key=[redacted]&x=[redacted]"
    logger = RedactingLogger(SimpleNamespace(**_log_config()))
    environ = {
        "REQUEST_METHOD": "GET",
        "RAW_URI": "/api/v1/notifications/?key=abc.secret",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "QUERY_STRING": "key=abc.secret",
        "HTTP_REFERER": "https://console.example/admin/?token=ref.secret",
    }
    response = SimpleNamespace(status="401", headers=[], sent=10)
    atoms = logger.atoms(response, [], environ, SimpleNamespace(seconds=0, microseconds=1))
    assert atoms["r"] == "GET /api/v1/notifications/?key=[redacted] HTTP/1.1"
    assert atoms["q"] == "key=[redacted]"
    assert atoms["f"] == "https://console.example/admin/?token=[redacted]"
    assert "abc.secret" not in repr(atoms) and "ref.secret" not in repr(atoms)


def _log_config():
    from gunicorn.config import Config

    config = Config()
    return {name: setting.get() for name, setting in config.settings.items()}


def test_on_sqlite_every_commit_is_synced_to_disk_before_an_acknowledgement(db):
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite only (PostgreSQL syncs every commit by default); this run uses PostgreSQL")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone()[0] == 2  # FULL: WAL synced at every commit, not only at checkpoints
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
