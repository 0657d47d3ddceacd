"""Delivery policies: email's default reproduces the SMTP configuration's retry timing, a stored
policy replaces it, bad values are refused with the field named (console and configuration
file), and the configuration file carries every channel's policy both ways."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from notifications.config_file import ConfigFileError, configuration_export, configuration_import
from notifications.models import DeliveryPolicy, SmtpConfiguration
from notifications.policies import delivery_policy_for, delivery_policy_validate
from tests.admin.conftest import login, make_user

SMTP = {"host": "smtp.example.com", "from_address": "outbox@example.com"}


def test_without_a_stored_policy_email_retries_as_the_smtp_configuration_says(db):
    SmtpConfiguration.objects.create(**SMTP, max_retries=7, retry_interval_seconds=45)
    policy = delivery_policy_for(channel="email")
    assert not policy.stored
    assert (policy.timing.strategy, policy.timing.interval_seconds, policy.timing.max_attempts) == ("fixed", 45, 7)
    assert (policy.timing.jitter, policy.timing.max_age_seconds) == (0, 0)
    assert policy.retry_on == {"connection", "timeout", "auth", "throttled", "provider_error", "unknown"}


def test_max_retries_zero_has_always_meant_one_attempt_and_still_does(db):
    SmtpConfiguration.objects.create(**SMTP, max_retries=0)
    assert delivery_policy_for(channel="email").timing.max_attempts == 1


def test_without_any_configuration_the_default_is_ten_attempts_a_minute_apart(db):
    timing = delivery_policy_for(channel="email").timing
    assert (timing.strategy, timing.interval_seconds, timing.max_attempts) == ("fixed", 60, 10)


def test_a_stored_policy_replaces_the_default(db):
    SmtpConfiguration.objects.create(**SMTP, max_retries=7, retry_interval_seconds=45)
    DeliveryPolicy.objects.create(
        channel="email", strategy="exponential", interval_seconds=5, max_attempts=0, rate_per_minute=30
    )
    policy = delivery_policy_for(channel="email")
    assert policy.stored
    assert (policy.timing.strategy, policy.timing.interval_seconds, policy.timing.max_attempts) == ("exponential", 5, 0)
    assert policy.rate_per_minute == 30


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"strategy": "fibonacci"}, "strategy", "is not one of none, fixed, linear, exponential, immediate"),
        ({"jitter": 1.5}, "jitter", "between 0 and 1"),
        ({"jitter": "0.1"}, "jitter", "must be a number"),
        ({"interval_seconds": -1}, "interval_seconds", "at least 0"),
        ({"max_attempts": True}, "max_attempts", "must be an integer"),
        ({"retry_on": ["connection", "bounce"]}, "retry_on", "'bounce' not failure classes"),
        ({"retry_on": ["auth", "auth"]}, "retry_on", "twice"),
        ({"retry_on": "auth"}, "retry_on", "a list of failure classes"),
        ({"breaker_threshold": 0}, "breaker_threshold", "at least 1"),
        ({"breaker_cooldown_seconds": 60, "breaker_max_cooldown_seconds": 30}, "breaker_max_cooldown_seconds", "below"),
        ({"colour": "red"}, "colour", "unknown field"),
    ],
)
def test_invalid_policy_values_are_refused_naming_the_field(values, field, words):
    problems = delivery_policy_validate(values=values)
    assert field in problems and words in problems[field]


def test_the_configuration_file_creates_and_updates_a_policy_and_keeps_unnamed_fields(db):
    SmtpConfiguration.objects.create(**SMTP, max_retries=4, retry_interval_seconds=20)
    summary = configuration_import(data={"policies": {"email": {"strategy": "linear", "max_age_seconds": 3600}}})
    assert (summary["policies_created"], summary["policies_updated"]) == (1, 0)
    row = DeliveryPolicy.objects.get(channel="email")
    # Fields the file does not name start from the policy in force: the SMTP configuration's.
    assert (row.strategy, row.interval_seconds, row.max_attempts, row.max_age_seconds) == ("linear", 20, 4, 3600)
    summary = configuration_import(data={"policies": {"email": {"rate_per_minute": 30}}})
    assert summary["policies_updated"] == 1
    row.refresh_from_db()
    assert (row.strategy, row.rate_per_minute) == ("linear", 30)


def test_an_invalid_policy_in_the_file_changes_nothing_and_names_every_problem(db):
    data = {
        "smtp": {**SMTP},
        "policies": {"email": {"jitter": 2, "retry_on": ["nope"]}, "pager": {}},
    }
    with pytest.raises(ConfigFileError) as caught:
        configuration_import(data=data)
    assert "policies.email.jitter: must be between 0 and 1." in caught.value.problems
    assert any(p.startswith("policies.email.retry_on: 'nope' not failure classes") for p in caught.value.problems)
    assert "policies.pager: unknown channel (known: email, teams, webhook, sms, apprise)." in caught.value.problems
    assert not SmtpConfiguration.objects.exists() and not DeliveryPolicy.objects.exists()


def test_export_writes_the_policy_in_force_even_when_none_is_stored(db):
    SmtpConfiguration.objects.create(**SMTP, max_retries=3, retry_interval_seconds=15)
    exported = configuration_export()["policies"]["email"]
    assert (exported["strategy"], exported["interval_seconds"], exported["max_attempts"]) == ("fixed", 15, 3)
    # Importing the export stores the same policy: nothing changes for the channel.
    before = delivery_policy_for(channel="email")
    configuration_import(data={"policies": {"email": exported}})
    after = delivery_policy_for(channel="email")
    assert after.stored and after.as_dict() == before.as_dict()


def test_the_command_line_reports_policy_problems_and_counts(db, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policies": {"email": {"strategy": "sometimes"}}}))
    with pytest.raises(CommandError, match=r"policies\.email\.strategy: 'sometimes' is not one of"):
        call_command("outbox_config", "import", str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"policies": {"email": {"strategy": "exponential"}}}))
    out = io.StringIO()
    call_command("outbox_config", "import", str(good), stdout=out)
    assert "policies 1 created, 0 updated" in out.getvalue()


# --- the console ---------------------------------------------------------------------------------


def policy_form(**overrides):
    form = {
        "channel": "email",
        "strategy": "exponential",
        "interval_seconds": "30",
        "max_interval_seconds": "600",
        "jitter": "0.2",
        "max_attempts": "8",
        "max_age_seconds": "86400",
        "retry_on": ["connection", "timeout", "auth", "throttled", "provider_error"],
        "breaker_threshold": "5",
        "breaker_cooldown_seconds": "30",
        "breaker_max_cooldown_seconds": "600",
        "rate_per_minute": "0",
    }
    form.update(overrides)
    return form


def test_an_administrator_stores_a_policy_in_the_console(client, db):
    login(client, make_user("adam", groups=["Administrators"]))
    response = client.post(reverse("admin:notifications_deliverypolicy_add"), policy_form())
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    row = DeliveryPolicy.objects.get(channel="email")
    assert (row.strategy, row.jitter, row.retry_on) == (
        "exponential",
        0.2,
        ["connection", "timeout", "auth", "throttled", "provider_error"],
    )


def test_the_console_refuses_a_policy_whose_cool_downs_are_out_of_order(client, db):
    login(client, make_user("adam", groups=["Administrators"]))
    response = client.post(
        reverse("admin:notifications_deliverypolicy_add"),
        policy_form(breaker_cooldown_seconds="60", breaker_max_cooldown_seconds="30"),
    )
    assert response.status_code == 200
    assert "Must not be below breaker_cooldown_seconds." in str(response.context["adminform"].form.errors)
    assert not DeliveryPolicy.objects.exists()


def test_operators_may_look_at_policies_and_channel_health_but_not_change_them(client, db):
    login(client, make_user("olivia", groups=["Operators"]))
    assert client.get(reverse("admin:notifications_deliverypolicy_changelist")).status_code == 200
    assert client.get(reverse("admin:notifications_channelhealth_changelist")).status_code == 200
    assert client.post(reverse("admin:notifications_deliverypolicy_add"), policy_form()).status_code == 403
    assert not DeliveryPolicy.objects.exists()
