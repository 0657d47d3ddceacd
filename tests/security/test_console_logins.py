"""Console logins under attack: a user name is locked out from one client address (never
everywhere), one address cannot try many user names fast, refused attempts never cost a
password check, administrators unlock, and password checks wait their turn instead of taking
the CPU."""

import fcntl
import io
import os
import re
import threading
import time

import pytest
import requests
from axes.models import AccessAttempt
from django.contrib.auth.hashers import MD5PasswordHasher, PBKDF2PasswordHasher, make_password
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

from notifications.console_login import PasswordHashingBusy, password_hash_wait, password_hashing
from tests.support.processes import Central

LOGIN = "/admin/login/"
PASSWORD = "correct horse battery staple"


class CountingHasher(MD5PasswordHasher):
    """Django's MD5 hasher (fast, for tests), counting the passwords it hashes: a refused login
    must not cost one."""

    hashed = 0

    def encode(self, password: str, salt: str) -> str:
        type(self).hashed += 1
        return super().encode(password, salt)


COUNTING = {
    "PASSWORD_HASHERS": ["tests.security.test_console_logins.CountingHasher"],
    "OUTBOX_LOGIN_REFUSAL_DELAY": 0,
}


def attempt(address, username, password="wrong password", **extra):
    return Client(REMOTE_ADDR=address).post(
        LOGIN, {"username": username, "password": password, "next": "/admin/"}, **extra
    )


def refusal(response):
    match = re.search(r'<p class="errornote">\s*(.*?)\s*</p>', response.content.decode(), re.S)
    return match.group(1) if match else ""


@pytest.fixture
def olivia(db):
    with override_settings(**COUNTING):
        return User.objects.create_user("olivia", password=PASSWORD, is_staff=True)


@override_settings(**COUNTING, OUTBOX_LOGIN_FAILURE_LIMIT=3, AXES_FAILURE_LIMIT=3)
def test_a_locked_out_user_name_is_refused_from_that_address_before_any_password_check(olivia):
    # The failure that reaches the limit is answered with the lockout already.
    assert [attempt("203.0.113.7", "olivia").status_code for _ in range(3)] == [200, 200, 429]
    hashed = CountingHasher.hashed

    locked = attempt("203.0.113.7", "olivia", PASSWORD)

    assert locked.status_code == 429
    assert CountingHasher.hashed == hashed
    assert "Too many failed logins for “olivia” from your address. Try again in 15 minutes" in refusal(locked)
    assert 14 * 60 < int(locked["Retry-After"]) <= 15 * 60
    assert 'name="username"' in locked.content.decode() and 'value="olivia"' in locked.content.decode()


@override_settings(**COUNTING, OUTBOX_LOGIN_FAILURE_LIMIT=3, AXES_FAILURE_LIMIT=3)
def test_a_lockout_never_follows_the_user_name_to_another_address(olivia):
    for _ in range(5):
        attempt("203.0.113.7", "olivia")
    assert attempt("203.0.113.7", "olivia", PASSWORD).status_code == 429

    elsewhere = attempt("198.51.100.4", "olivia", PASSWORD)

    assert elsewhere.status_code == 302 and elsewhere["Location"] == "/admin/"


@override_settings(**COUNTING, OUTBOX_LOGIN_CLIENT_BURST=4)
def test_one_address_trying_many_user_names_is_throttled_before_their_passwords_are_checked(olivia):
    statuses = [attempt("203.0.113.9", f"user{n}").status_code for n in range(4)]
    hashed = CountingHasher.hashed

    throttled = attempt("203.0.113.9", "olivia", PASSWORD)

    assert statuses == [200] * 4
    assert throttled.status_code == 429
    assert CountingHasher.hashed == hashed
    assert refusal(throttled).startswith("Too many failed logins from your address. Try again in 12 seconds")
    assert int(throttled["Retry-After"]) == 12
    # Another address is not affected.
    assert attempt("198.51.100.4", "olivia", PASSWORD).status_code == 302


@override_settings(**COUNTING, OUTBOX_LOGIN_CLIENT_BURST=4, OUTBOX_BEHIND_PROXY=True)
def test_behind_the_proxy_the_address_it_appended_counts_not_what_the_client_wrote(db):
    forged = [
        attempt("127.0.0.1", f"user{n}", HTTP_X_FORWARDED_FOR=f"10.0.0.{n}, 203.0.113.9").status_code for n in range(5)
    ]
    assert forged == [200] * 4 + [429]
    assert attempt("127.0.0.1", "user9", HTTP_X_FORWARDED_FOR="203.0.113.10").status_code == 200


@override_settings(**COUNTING, OUTBOX_LOGIN_FAILURE_LIMIT=2, AXES_FAILURE_LIMIT=2)
def test_an_administrator_unlocks_a_user_name_in_the_console(olivia, admin_client):
    attempt("203.0.113.7", "olivia")
    attempt("203.0.113.7", "olivia")
    assert attempt("203.0.113.7", "olivia", PASSWORD).status_code == 429
    row = AccessAttempt.objects.get(username="olivia", ip_address="203.0.113.7")
    listing = admin_client.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "203.0.113.7" in listing.content.decode()

    admin_client.post(f"/admin/axes/accessattempt/{row.pk}/delete/", {"post": "yes"})

    assert attempt("203.0.113.7", "olivia", PASSWORD).status_code == 302


@override_settings(**COUNTING, OUTBOX_LOGIN_FAILURE_LIMIT=2, AXES_FAILURE_LIMIT=2)
def test_the_unlock_command_frees_a_user_name_from_one_address(olivia):
    attempt("203.0.113.7", "olivia")
    attempt("203.0.113.7", "olivia")
    assert attempt("203.0.113.7", "olivia", PASSWORD).status_code == 429

    out = io.StringIO()
    call_command("axes_reset_ip_username", "203.0.113.7", "olivia", stdout=out)

    assert out.getvalue().strip() == "1 attempts removed."
    assert attempt("203.0.113.7", "olivia", PASSWORD).status_code == 302


@override_settings(**{**COUNTING, "OUTBOX_LOGIN_REFUSAL_DELAY": 0.3}, OUTBOX_LOGIN_CLIENT_BURST=1)
def test_a_refused_login_is_answered_after_the_refusal_delay(db):
    attempt("203.0.113.7", "someone")
    started = time.monotonic()
    assert attempt("203.0.113.7", "someone").status_code == 429
    assert time.monotonic() - started >= 0.3


def test_password_hashes_are_computed_one_at_a_time_on_a_lowest_priority_thread():
    release = threading.Event()
    first = threading.Thread(target=password_hashing.run, args=(release.wait, 10))
    first.start()
    try:
        started = time.monotonic()
        nice: list[int | None] = [None]
        second = threading.Thread(target=lambda: nice.__setitem__(0, password_hashing.run(os.getpriority, 0, 0)))
        second.start()
        second.join(0.3)
        assert second.is_alive(), "a second hash ran beside the first"
        release.set()
        second.join(10)
        assert time.monotonic() - started >= 0.3
        assert nice[0] == 19
    finally:
        release.set()
        first.join(10)


def test_a_password_check_waits_while_another_process_of_the_host_is_hashing(settings):
    token = password_hash_wait.set(0.3)
    try:
        with open(settings.OUTBOX_PASSWORD_HASH_LOCK, "a") as other_process:
            fcntl.flock(other_process, fcntl.LOCK_EX)
            with pytest.raises(PasswordHashingBusy):
                password_hashing.run(str, "not while the other one hashes")
        assert password_hashing.run(str, "now") == "now"
    finally:
        password_hash_wait.reset(token)


@override_settings(OUTBOX_PASSWORD_HASH_DUTY_CYCLE=0.5)
def test_after_a_password_check_the_host_rests_as_long_as_the_check_took(tmp_path, settings):
    settings.OUTBOX_PASSWORD_HASH_LOCK = str(tmp_path / "hashing.lock")
    password_hashing.run(time.sleep, 0.3)
    finished = time.monotonic()

    started = password_hashing.run(time.monotonic)

    assert started - finished >= 0.25


@override_settings(
    PASSWORD_HASHERS=["notifications.console_login.GatedPBKDF2PasswordHasher"],
    OUTBOX_PASSWORD_HASH_WAIT=2.0,
    OUTBOX_PASSWORD_HASH_DUTY_CYCLE=1.0,
    OUTBOX_LOGIN_REFUSAL_DELAY=0,
)
def test_a_login_that_waits_too_long_for_a_password_check_is_asked_to_retry_and_nothing_is_counted(db):
    User.objects.create(
        username="olivia", password=make_password(PASSWORD, hasher=PBKDF2PasswordHasher()), is_staff=True
    )
    release = threading.Event()
    busy = threading.Thread(target=password_hashing.run, args=(release.wait, 10))
    busy.start()
    try:
        answer = attempt("203.0.113.7", "olivia", PASSWORD)
    finally:
        release.set()
        busy.join(10)

    assert answer.status_code == 200
    assert refusal(answer) == "The console is busy checking other logins. Try again in a few seconds."
    assert not AccessAttempt.objects.exists()
    # The check runs at the lowest CPU priority: on a machine whose cores are busy with other
    # work (other test processes) it may take longer than the 2 s the first attempt waited.
    with override_settings(OUTBOX_PASSWORD_HASH_WAIT=60.0):
        again = attempt("203.0.113.7", "olivia", PASSWORD)
    assert again.status_code == 302, refusal(again)


# --- over HTTP, behind the proxy as in production ---------------------------------------------------


def browser(central, address):
    """A login client behind the reverse proxy at ``address`` (its X-Forwarded-For)."""
    session = requests.Session()
    session.headers["X-Forwarded-For"] = address
    session.get(central.url + LOGIN, timeout=10)
    return session


def post_login(central, session, username, password):
    return session.post(
        central.url + LOGIN,
        data={
            "username": username,
            "password": password,
            "next": "/admin/",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        allow_redirects=False,
        timeout=30,
    )


@pytest.mark.slow
def test_a_login_flood_over_http_locks_out_one_address_and_the_operator_logs_in_from_another(transactional_db):
    # The server hashes with its own (production) hasher.
    User.objects.create(
        username="olivia", password=make_password(PASSWORD, hasher=PBKDF2PasswordHasher()), is_staff=True
    )
    with Central(
        workers=1,
        OUTBOX_BEHIND_PROXY="true",
        OUTBOX_LOGIN_FAILURE_LIMIT=3,
        OUTBOX_LOGIN_CLIENT_BURST=6,
        # Refilled slowly enough that however long each answer takes, the burst is what counts.
        OUTBOX_LOGIN_CLIENT_RATE=0.01,
        OUTBOX_LOGIN_REFUSAL_DELAY=0,
    ) as central:
        attacker = browser(central, "203.0.113.66")
        guesses = [post_login(central, attacker, "olivia", f"guess {n}") for n in range(3)]
        locked = post_login(central, attacker, "olivia", PASSWORD)

        scanner = browser(central, "203.0.113.77")
        scans = [post_login(central, scanner, f"user{n}", "guess").status_code for n in range(8)]

        operator = browser(central, "198.51.100.5")
        logged_in = post_login(central, operator, "olivia", PASSWORD)
        console = operator.get(central.url + "/admin/", timeout=10)

    assert [guess.status_code for guess in guesses] == [200, 200, 429]
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) > 60
    assert "Too many failed logins for “olivia” from your address" in locked.text
    assert scans == [200] * 6 + [429] * 2
    assert logged_in.status_code == 302
    assert console.status_code == 200 and "Log out" in console.text
