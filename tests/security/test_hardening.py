"""Hardening: production settings pass Django's deploy checks, bad configuration fails at
start naming the variable, security headers are sent, and API keys never reach the logs."""

import json
import logging
import os
import secrets
import subprocess
import sys

import pytest
from rest_framework.test import APIClient

from tests.support.payloads import make_payload
from tests.support.processes import ROOT

PRODUCTION_ENV = {
    "DEBUG": "false",
    "OUTBOX_HTTPS": "true",
    "ALLOWED_HOSTS": "outbox.example.com",
    "DATABASE_URL": "sqlite:////tmp/outbox-deploy-check.sqlite3",
}


def manage(*args, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "SECRET_KEY", "DEBUG"))}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_is_clean_under_the_documented_production_environment():
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=secrets.token_urlsafe(50), **PRODUCTION_ENV
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_without_a_secret_key_refuses_to_start_and_names_it():
    result = manage("check", **PRODUCTION_ENV)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


@pytest.mark.parametrize(
    "variable, value",
    [
        ("OUTBOX_STUCK_AGE", "ten minutes"),
        ("OUTBOX_RETENTION_DAYS", "-5"),
        ("OUTBOX_CONCURRENCY", "0"),
        ("DATABASE_URL", "nosuchdb://x"),
    ],
)
def test_a_bad_setting_stops_the_process_with_a_message_naming_the_variable(variable, value):
    result = manage("check", **{variable: value})
    assert result.returncode != 0
    assert variable in result.stderr


def test_security_headers_are_sent(client, db):
    response = client.get("/admin/login/")
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_api_keys_never_reach_the_logs(site_key, caplog):
    caplog.set_level(logging.DEBUG)
    good = APIClient()
    good.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
    good.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    bad_key = site_key[:-4] + "abcd"
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION=f"Api-Key {bad_key}")
    assert (
        bad.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json").status_code
        == 401
    )
    secret_part = site_key.partition(".")[2]
    logged = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    assert caplog.records, "expected the refused request to be logged"
    assert secret_part not in logged
    assert bad_key.partition(".")[2] not in logged
