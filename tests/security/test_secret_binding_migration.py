"""Upgrading binds every stored credential to the destination its row points at, so delivery
goes on as before, and encrypts the Teams URLs stored in plain text; downgrading decrypts them."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from notifications.models import ChannelConfiguration, SmtpConfiguration, TeamsTarget, WebhookTarget
from notifications.secret_binding import secret_binding_problem

BEFORE = [("notifications", "0018_drop_subject_trigram_index")]
TEAMS_URL = "https://prod-01.westeurope.logic.azure.com/workflows/abc/triggers/manual/paths/invoke?sig=OLDSIG"


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


def teams_column():
    with connection.cursor() as cursor:
        cursor.execute("SELECT url, url_digest FROM notifications_teamstarget")
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_binds_stored_credentials_and_encrypts_teams_urls_and_the_downgrade_decrypts_them():
    old = migrate(BEFORE)
    try:
        old.get_model("notifications", "SmtpConfiguration").objects.create(
            pk=1, host="smtp.example.com", port=587, username="outbox", password="pw", from_address="o@example.com",
            auth_method="xoauth2", oauth_client_secret="oauth", oauth_tenant_id="t",
        )  # fmt: skip
        old.get_model("notifications", "ChannelConfiguration").objects.create(
            channel="sms", provider="twilio", account_sid="AC" + "0" * 32, auth_token="tok", from_number="+15005550006"
        )
        notification_list = old.get_model("notifications", "NotificationList").objects.create(name="Channels")
        old.get_model("notifications", "WebhookTarget").objects.create(
            notification_list=notification_list, url="https://hooks.example.com/x", secret="whsec_" + "QUJD" * 11
        )
        old.get_model("notifications", "TeamsTarget").objects.create(notification_list=notification_list, url=TEAMS_URL)

        # Up to the latest migration (0019 binds and encrypts), so that today's models can read the rows.
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
        smtp = SmtpConfiguration.objects.get()
        for secret in ("password", "oauth_client_secret"):
            assert getattr(smtp, f"{secret}_binding")
            assert secret_binding_problem(instance=smtp, secret=secret) is None
        sms = ChannelConfiguration.objects.get()
        assert secret_binding_problem(instance=sms, secret="auth_token") is None
        assert secret_binding_problem(instance=WebhookTarget.objects.get(), secret="secret") is None
        ((stored, digest),) = teams_column()
        assert stored.startswith("fernet:") and "OLDSIG" not in stored and len(digest) == 64
        assert TeamsTarget.objects.get().url == TEAMS_URL
        # Moving a destination now leaves the credential behind.
        SmtpConfiguration.objects.update(port=2525)
        problem = secret_binding_problem(instance=SmtpConfiguration.objects.get(), secret="password")
        assert problem is not None and "password was entered for another server" in problem

        migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.execute("SELECT url FROM notifications_teamstarget")
            assert cursor.fetchall() == [(TEAMS_URL,)]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
