"""Failed authentication is throttled: per client address before any credential is checked, and
per API key prefix for guesses from many places, without ever locking out the right key."""

from django.test import override_settings
from rest_framework.test import APIClient

from tests.support.payloads import make_payload

URL = "/api/v1/notifications/"
LIMITS = {"OUTBOX_AUTH_FAILURE_BURST": 5, "OUTBOX_AUTH_FAILURE_RATE": 6.0}


def attempt(key, address="203.0.113.7"):
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client.post(URL, make_payload(), format="json")


def wrong_secret(key):
    return key.partition(".")[0] + ".wrongwrongwrongwrongwrongwrong00"


@override_settings(**LIMITS)
def test_a_client_guessing_secrets_gets_429_with_retry_after_once_its_failures_are_spent(site_key):
    statuses = [attempt(wrong_secret(site_key)).status_code for _ in range(8)]
    assert statuses == [401] * 4 + [429] * 4
    refused = attempt(wrong_secret(site_key))
    assert refused.json()["error"] == "throttled"
    assert int(refused["Retry-After"]) >= 1
    # Refused before the key is looked at: even the right key from that address waits.
    assert attempt(site_key).status_code == 429
    # Another client is not affected.
    assert attempt(site_key, address="198.51.100.1").status_code == 201


@override_settings(**LIMITS)
def test_guesses_at_one_key_prefix_from_many_addresses_are_throttled_but_the_right_key_still_works(site_key):
    statuses = [attempt(wrong_secret(site_key), address=f"192.0.2.{n}").status_code for n in range(8)]
    assert statuses[:4] == [401] * 4
    assert set(statuses[5:]) == {429}
    assert attempt(site_key, address="198.51.100.9").status_code == 201


@override_settings(**LIMITS)
def test_malformed_keys_count_as_failures(site):
    statuses = [attempt("no-dot-here").status_code for _ in range(6)]
    assert statuses[-1] == 429


@override_settings(**LIMITS)
def test_wrong_staff_tokens_are_throttled_per_client(db):
    client = APIClient(REMOTE_ADDR="203.0.113.8")
    statuses = [client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=f"Token {n:040x}").status_code for n in range(7)]
    assert statuses[:4] == [401] * 4 and statuses[-1] == 429


@override_settings(OUTBOX_AUTH_FAILURE_RATE=0)
def test_the_limit_can_be_switched_off(site_key):
    assert {attempt(wrong_secret(site_key)).status_code for _ in range(30)} == {401}
