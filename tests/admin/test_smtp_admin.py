"""The SMTP configuration's administration: it cannot be deleted, its numeric bounds are field
errors in words, and the change form tests the values typed into it, unsaved, against a real
SMTP server on loopback (connect-only and a test message)."""

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.urls import reverse

from notifications.models import SmtpConfiguration
from tests.admin.conftest import login, make_user
from tests.support.smtp import SmtpServer, free_port

pytestmark = [pytest.mark.django_db]


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def form_data(config, **changes):
    data = {
        "host": config.host,
        "port": config.port,
        "security": config.security,
        "username": config.username,
        "password": "",
        "from_address": config.from_address,
        "timeout_seconds": config.timeout_seconds,
        "greeting_timeout_seconds": config.greeting_timeout_seconds,
        "data_timeout_seconds": config.data_timeout_seconds,
        "max_retries": config.max_retries,
        "retry_interval_seconds": config.retry_interval_seconds,
    }
    data.update(changes)
    return data


@pytest.fixture
def config(db):
    return SmtpConfiguration.objects.create(
        host="smtp.invalid", port=2525, security="none", from_address="outbox@example.com", timeout_seconds=3
    )


def change_url(config):
    return reverse("admin:notifications_smtpconfiguration_change", args=[config.pk])


def test_the_configuration_cannot_be_deleted_even_by_a_superuser(client, config):
    login(client, make_user("root", superuser=True))
    page = client.get(change_url(config)).content.decode()
    assert "deletelink" not in page
    delete_url = reverse("admin:notifications_smtpconfiguration_delete", args=[config.pk])
    assert client.get(delete_url).status_code == 403
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert SmtpConfiguration.objects.filter(pk=config.pk).exists()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("port", 0, "The port must be a number from 1 to 65535"),
        ("port", 70000, "The port must be a number from 1 to 65535"),
        ("timeout_seconds", 0, "The timeout must be at least 1 second."),
        ("greeting_timeout_seconds", 0, "The greeting timeout must be at least 1 second."),
    ],
)
def test_out_of_range_values_are_field_errors_in_words(admin_client_, config, field, value, words):
    response = admin_client_.post(change_url(config), form_data(config, **{field: value}))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert words in errors[field][0]
    assert "__all__" not in errors
    assert "Constraint" not in response.content.decode()


def test_the_greeting_timeout_is_saved_from_the_form(admin_client_, config):
    response = admin_client_.post(change_url(config), form_data(config, greeting_timeout_seconds=300))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert SmtpConfiguration.objects.get().greeting_timeout_seconds == 300


def test_check_connection_tests_unsaved_values_and_saves_nothing(admin_client_, config):
    with SmtpServer(auth=("outbox", "s3cret")) as smtp:
        data = form_data(config, host=smtp.host, port=smtp.port, username="outbox", password="s3cret")
        response = admin_client_.post(change_url(config), {**data, "_smtp_test_connect": "1"})
        assert response.status_code == 200
        [said] = texts(response)
        assert said.startswith(f"127.0.0.1:{smtp.port} accepted the connection and login (values not saved): 250 ")
        assert smtp.count == 0  # nothing sent
        page = response.content.decode()
        assert f'value="{smtp.port}"' in page  # the typed values are shown again

        response = admin_client_.post(change_url(config), {**data, "password": "wrong", "_smtp_test_connect": "1"})
        [said] = texts(response)
        assert "refused (values not saved): SMTP authentication failed (535" in said
        assert "failure class auth" in said
    config.refresh_from_db()
    assert (config.host, config.port, config.username, config.password) == ("smtp.invalid", 2525, "", "")


def test_send_test_email_uses_unsaved_values(admin_client_, config):
    with SmtpServer() as smtp:
        data = form_data(config, host=smtp.host, port=smtp.port, from_address="alarms@example.com")
        response = admin_client_.post(
            change_url(config), {**data, "_smtp_test_send": "1", "smtp_test_to": "ops@example.com"}
        )
        [said] = texts(response)
        assert "accepted the test message (values not saved): 250" in said
        smtp.wait_for(1)
        assert smtp.received[0].mail_from == "alarms@example.com"
        assert smtp.received[0].rcpt_tos == ["ops@example.com"]

        response = admin_client_.post(change_url(config), {**data, "_smtp_test_send": "1", "smtp_test_to": "not mail"})
        assert texts(response) == [
            "Enter the address to send the test message to (“not mail” is not an email address)."
        ]
    config.refresh_from_db()
    assert config.host == "smtp.invalid" and config.from_address == "outbox@example.com"


def test_testing_an_unreachable_server_says_what_delivery_would_do(admin_client_, config):
    data = form_data(config, host="127.0.0.1", port=free_port(), timeout_seconds=2)
    response = admin_client_.post(change_url(config), {**data, "_smtp_test_connect": "1"})
    [said] = texts(response)
    assert "refused (values not saved): SMTP connection refused at connect (failure class connection" in said


def test_testing_invalid_values_shows_the_field_errors_and_runs_nothing(admin_client_, config):
    response = admin_client_.post(change_url(config), {**form_data(config, port=0), "_smtp_test_connect": "1"})
    assert texts(response) == ["Correct the errors below, then test again."]
    assert "The port must be a number" in response.context["adminform"].form.errors["port"][0]


def test_the_stored_password_is_used_when_the_field_is_left_blank(admin_client_, config):
    with SmtpServer(auth=("outbox", "s3cret")) as smtp:
        config.host, config.port, config.username, config.password = smtp.host, smtp.port, "outbox", "s3cret"
        config.save()
        response = admin_client_.post(change_url(config), {**form_data(config), "_smtp_test_connect": "1"})
        assert "accepted the connection and login" in texts(response)[0]
        # The stored password is not sent to a server other than the one it was stored for.
        moved = form_data(config, host="localhost")
        response = admin_client_.post(change_url(config), {**moved, "_smtp_test_connect": "1"})
        assert texts(response) == ["Correct the errors below, then test again."]
        assert response.context["adminform"].form.errors["password"]


def test_operators_cannot_run_tests(client, config):
    login(client, make_user("olivia", groups=["Operators"]))
    response = client.post(change_url(config), {**form_data(config), "_smtp_test_connect": "1"})
    assert response.status_code == 403
    assert User.objects.filter(username="olivia").exists()
