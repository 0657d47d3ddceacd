"""Staff API keys: hashed at rest, named, expiring, revocable, shown once, their user fixed; the
staff API works with them; the plaintext tokens of earlier versions become hashed keys that keep
working until they expire."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from sites.models import StaffAPIKey
from tests.admin.conftest import make_user

KPIS = "/api/v1/kpis/"


def issue(username, *args):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_staff_key", username, *args, stdout=out, stderr=err)
    return out.getvalue().strip().splitlines()[-1], err.getvalue()


def kpis(key):
    return APIClient().get(KPIS, HTTP_AUTHORIZATION=f"Token {key}")


@pytest.fixture
def boss(db):
    return User.objects.create_user("boss", is_staff=True)


def test_the_database_holds_only_a_hash_of_a_staff_key_and_the_key_reads_the_staff_api(boss):
    key, said = issue("boss", "--name", "monitoring")

    assert kpis(key).status_code == 200
    secret = key.partition(".")[2]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM sites_staffapikey")
        [row] = cursor.fetchall()
    assert not [column for column in row if isinstance(column, str) and secret in column]
    assert "Store it now: it cannot be shown again." in said


def test_a_staff_key_has_a_name_an_expiry_and_its_use_is_recorded(boss):
    key, _ = issue("boss", "--name", "monitoring", "--expires-in-days", "30")
    kpis(key)

    staff_key = StaffAPIKey.objects.get()
    assert staff_key.name == "monitoring" and staff_key.user == boss
    assert timedelta(days=29) < staff_key.expiry_date - timezone.now() <= timedelta(days=30)
    assert staff_key.last_used_at is not None
    out = io.StringIO()
    call_command("list_staff_keys", stdout=out)
    listing = out.getvalue()
    assert staff_key.prefix in listing and "monitoring" in listing and "boss" in listing and "live" in listing
    assert key not in listing


def test_an_expired_staff_key_is_refused_with_401(boss):
    key, _ = issue("boss", "--name", "monitoring")
    StaffAPIKey.objects.update(expiry_date=timezone.now() - timedelta(seconds=1))

    response = kpis(key)

    assert response.status_code == 401
    assert response.json()["detail"] == "Staff key has expired."
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_staff_key_is_refused_with_401(boss):
    key, _ = issue("boss", "--name", "monitoring")
    out = io.StringIO()

    call_command("revoke_staff_key", key.partition(".")[0], stdout=out)

    assert out.getvalue().startswith(f"Revoked staff key {key.partition('.')[0]} (monitoring) of boss.")
    assert kpis(key).status_code == 401


def test_a_key_of_a_user_who_was_deactivated_is_refused_with_401(boss):
    key, _ = issue("boss", "--name", "monitoring")
    User.objects.filter(pk=boss.pk).update(is_active=False)
    assert kpis(key).status_code == 401


def test_a_wrong_secret_with_a_real_prefix_is_refused_with_401(boss):
    key, _ = issue("boss", "--name", "monitoring")
    assert kpis(key.partition(".")[0] + ".wrongwrongwrongwrongwrongwrong00").status_code == 401


@pytest.mark.parametrize("key", ["", "a b", "abc\x00def", "ключ.секрет", "x" * 201])
def test_a_malformed_staff_key_is_refused_with_401_never_a_500(db, key):
    response = APIClient().get(KPIS, HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 401
    assert response.json()["error"] in {"invalid_key", "not_authenticated"}


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["nobody", "--name", "x"], "No user named 'nobody'."),
        (["clerk", "--name", "x"], "User 'clerk' is not an active staff user"),
        (["boss", "--name", "  "], "A staff key needs a name"),
        (["boss", "--name", "x" * 51], "at most 50 characters"),
        (["boss", "--name", "x", "--expires-in-days", "0"], "--expires-in-days must be a positive number"),
    ],
)
def test_the_command_refuses_bad_requests_naming_the_problem(boss, arguments, words):
    User.objects.create_user("clerk")
    with pytest.raises(CommandError, match=re.escape(words)):
        call_command("create_staff_key", *arguments, stdout=io.StringIO(), stderr=io.StringIO())
    assert not StaffAPIKey.objects.exists()


# --- the console ----------------------------------------------------------------------------------


def test_the_console_shows_a_new_key_once_and_never_again(admin_client, boss):
    expiry = (timezone.now() + timedelta(days=10)).replace(second=0, microsecond=0)
    response = admin_client.post(
        reverse("admin:sites_staffapikey_add"),
        {"user": boss.pk, "name": "shift report", "expiry_date": expiry.strftime("%Y-%m-%d %H:%M")},
    )

    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    issued = re.search(r'id="issued-key"[^>]*>([^<]+)<', response.content.decode())
    assert issued is not None
    key = issued.group(1)
    assert kpis(key).status_code == 200
    staff_key = StaffAPIKey.objects.get()
    assert (staff_key.user, staff_key.name, staff_key.expiry_date) == (boss, "shift report", expiry)
    for page in (
        reverse("admin:sites_staffapikey_changelist"),
        reverse("admin:sites_staffapikey_change", args=[staff_key.pk]),
    ):
        text = admin_client.get(page).content.decode()
        assert staff_key.prefix in text and key.partition(".")[2] not in text


def test_a_keys_user_cannot_be_changed_in_the_console(admin_client, boss):
    key, _ = issue("boss", "--name", "monitoring")
    other = User.objects.create_user("mallory", is_staff=True)
    staff_key = StaffAPIKey.objects.get()
    change = reverse("admin:sites_staffapikey_change", args=[staff_key.pk])
    assert 'name="user"' not in admin_client.get(change).content.decode()

    admin_client.post(change, {"user": other.pk, "name": "renamed"})

    staff_key.refresh_from_db()
    assert staff_key.user == boss and staff_key.name == "renamed"
    assert kpis(key).status_code == 200


def test_the_console_refuses_an_expiry_in_the_past_and_a_user_who_is_not_staff(admin_client, boss):
    clerk = User.objects.create_user("clerk")
    response = admin_client.post(
        reverse("admin:sites_staffapikey_add"), {"user": clerk.pk, "name": "x", "expiry_date": "2020-01-01 00:00"}
    )
    text = response.content.decode()
    assert response.status_code == 200
    assert "The expiry must be in the future" in text
    assert "Select a valid choice" in text
    assert not StaffAPIKey.objects.exists()


def test_revoking_in_the_console_says_how_many_were_revoked_and_skipped(admin_client, boss):
    first, _ = issue("boss", "--name", "one")
    issue("boss", "--name", "two")
    call_command("revoke_staff_key", first.partition(".")[0], stdout=io.StringIO())

    response = admin_client.post(
        reverse("admin:sites_staffapikey_changelist"),
        {"action": "revoke_keys", "_selected_action": list(StaffAPIKey.objects.values_list("pk", flat=True))},
        follow=True,
    )

    assert "Revoked 1 staff key; requests with them are now refused. 1 already revoked" in response.content.decode()
    assert not StaffAPIKey.objects.filter(revoked=False).exists()


def test_operators_cannot_manage_staff_keys(client, db):
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert client.get(reverse("admin:sites_staffapikey_changelist")).status_code == 403


# --- upgrading from plaintext tokens --------------------------------------------------------------

BEFORE = [("sites", "0004_api_key_last_used")]
AFTER = [("sites", "0005_staff_api_keys")]


@pytest.mark.django_db(transaction=True)
def test_plaintext_tokens_become_hashed_staff_keys_that_keep_working_until_they_expire():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    token = "0123456789abcdef0123456789abcdef01234567"
    try:
        boss = User.objects.create_user("boss", is_staff=True)
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp, user_id integer)"
            )
            cursor.execute(
                "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
                [token, timezone.now(), boss.pk],
            )
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)

        assert "authtoken_token" not in connection.introspection.table_names()
        migrated = StaffAPIKey.objects.get()
        assert migrated.user == boss and migrated.name == "migrated token"
        assert timedelta(days=89) < migrated.expiry_date - timezone.now() <= timedelta(days=90)
        assert token not in (migrated.id + migrated.hashed_key)
        assert kpis(token).status_code == 200
        assert kpis(token[:-1] + "8").status_code == 401
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
