"""`manage.py check --deploy` refuses what must never reach production: the benchmark's raw view,
the placeholder secrets of the example environment file, a short metrics token, the API's
failed-authentication limit switched off, a secret key each host makes up for itself."""

import secrets

import pytest
from django.test import override_settings

from notifications.checks import check_deploy_settings
from tests.security.test_hardening import PRODUCTION_ENV, manage
from tests.support.processes import ROOT

EXAMPLE = ROOT / "deploy" / "systemd" / "outbox.env.example"


def example_environment():
    """The variables deploy/systemd/outbox.env.example sets, as written."""
    pairs = (line.split("=", 1) for line in EXAMPLE.read_text().splitlines() if line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def test_check_deploy_fails_on_every_placeholder_secret_of_the_example_environment_file():
    environment = example_environment()
    placeholders = sorted(name for name, value in environment.items() if "CHANGE-ME" in value)
    assert placeholders == ["DATABASE_URL", "OUTBOX_METRICS_TOKEN", "SECRET_KEY"]

    result = manage("check", "--deploy", **environment)

    assert result.returncode != 0
    for name in placeholders:
        assert f"(outbox.E021) {name} still holds the placeholder secret" in result.stderr, result.stderr


def test_check_deploy_fails_while_the_benchmarks_raw_insert_view_is_on():
    result = manage(
        "check", "--deploy", SECRET_KEY=secrets.token_urlsafe(50), OUTBOX_BENCH_RAW_VIEW="true", **PRODUCTION_ENV
    )
    assert result.returncode != 0
    assert "(outbox.E020) OUTBOX_BENCH_RAW_VIEW is on" in result.stderr


def ids(**overrides):
    with override_settings(**overrides):
        return [message.id for message in check_deploy_settings()]


def test_settings_as_production_runs_them_pass():
    assert ids(SECRET_KEY_GENERATED=False, OUTBOX_METRICS_TOKEN=secrets.token_urlsafe(32)) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"OUTBOX_METRICS_TOKEN": "short-token"}, "outbox.W020"),
        ({"OUTBOX_AUTH_FAILURE_RATE": 0}, "outbox.W021"),
        ({"SECRET_KEY_GENERATED": True}, "outbox.W022"),
        ({"OUTBOX_SECRET_KEYS": ["Change-Me-key"]}, "outbox.E021"),
        ({"Q_BROKER_URL": "redis://:CHANGE-ME@redis.example.com:6379/0"}, "outbox.E021"),
    ],
)
def test_each_weakness_is_named_by_its_own_check(overrides, expected):
    assert ids(**{"SECRET_KEY_GENERATED": False, **overrides}) == [expected]
