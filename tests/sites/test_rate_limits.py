"""Per-site rate limits that count notifications (docs/operations.md, "Rate limits"): a batch of N
draws N, a refused request ingests nothing and says when to come back, critical notifications
have a budget of their own, the agent's own calls are never refused because of notifications,
a site's limit can be raised on its own, and the budgets live in the database (shared by every
web process; tests/e2e/test_rate_limits_e2e.py runs two of them) with tokens taken in chunks."""

import json

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from notifications.models import Notification
from sites import rate_limits
from sites.models import Site, SiteRateBucket
from sites.rate_limits import leases
from tests.support.payloads import make_payload
from tests.support.processes import settings_refusal

URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"
HEARTBEAT = "/api/v1/sites/heartbeat/"

# Budgets small enough to exhaust in a test; refilled so slowly that nothing comes back meanwhile.
TIGHT = {
    "OUTBOX_BATCH_MAX_ITEMS": 10,
    "OUTBOX_SITE_RATE_LIMIT": 0.01,
    "OUTBOX_SITE_RATE_BURST": 10,
    "OUTBOX_SITE_CRITICAL_RATE_LIMIT": 0.01,
    "OUTBOX_SITE_CRITICAL_RATE_BURST": 10,
    "OUTBOX_SITE_REQUEST_RATE_LIMIT": 0.01,
    "OUTBOX_SITE_REQUEST_RATE_BURST": 3,
}


@pytest.fixture
def tight(settings):
    # Through pytest-django's settings (not override_settings): tests change more settings with it.
    for name, value in TIGHT.items():
        setattr(settings, name, value)
    return settings


def post(client, data, url=URL):
    return client.post(url, json.dumps(data), content_type="application/json")


def batch(count, **fields):
    return {"notifications": [make_payload(**fields) for _ in range(count)]}


def heartbeat(client):
    return client.post(HEARTBEAT, {"buffered": 0, "parked": 0}, format="json")


def assert_refused(response, budget):
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"] == "throttled"
    assert f"({budget} budget)" in response.json()["detail"]


@pytest.mark.usefixtures("tight")
def test_a_batch_draws_one_token_per_notification_and_a_refused_batch_ingests_nothing(api):
    assert post(api, batch(8), BATCH_URL).status_code == 200
    refused = post(api, batch(3), BATCH_URL)
    assert_refused(refused, "notifications")
    assert int(refused["Retry-After"]) == 100  # one token missing, at 0.01 a second
    assert Notification.objects.count() == 8
    assert post(api, batch(2), BATCH_URL).status_code == 200
    assert_refused(post(api, make_payload()), "notifications")
    assert Notification.objects.count() == 10


@pytest.mark.usefixtures("tight")
def test_a_batch_larger_than_what_is_left_is_refused_whole_even_with_valid_items(api):
    assert post(api, batch(9), BATCH_URL).status_code == 200
    assert_refused(post(api, {"notifications": [make_payload(), {"not": "valid"}]}, BATCH_URL), "notifications")
    assert Notification.objects.count() == 9


@pytest.mark.usefixtures("tight")
def test_critical_notifications_are_accepted_while_the_site_is_refused_ordinary_ones(api):
    assert post(api, batch(10), BATCH_URL).status_code == 200
    assert_refused(post(api, make_payload()), "notifications")

    assert post(api, make_payload(priority="critical")).status_code == 201
    assert post(api, batch(5, priority="critical"), BATCH_URL).status_code == 200
    # A batch that needs the empty budget too is refused whole: its critical item waits with it.
    mixed = {"notifications": [make_payload(priority="critical"), make_payload()]}
    assert_refused(post(api, mixed, BATCH_URL), "notifications")
    assert Notification.objects.filter(priority=Notification.Priority.CRITICAL).count() == 6


@pytest.mark.usefixtures("tight")
def test_the_critical_budget_has_a_limit_of_its_own_and_leaves_the_ordinary_one_alone(api):
    assert post(api, batch(10, priority="critical"), BATCH_URL).status_code == 200
    assert_refused(post(api, make_payload(priority="critical")), "critical")
    assert post(api, make_payload(priority="high")).status_code == 201


@pytest.mark.usefixtures("tight")
def test_heartbeats_are_never_refused_because_the_site_sent_many_notifications(api):
    assert post(api, batch(10), BATCH_URL).status_code == 200
    assert_refused(post(api, make_payload()), "notifications")
    assert heartbeat(api).status_code == 200


@pytest.mark.usefixtures("tight")
def test_heartbeats_have_a_limit_of_their_own_that_leaves_notifications_alone(api):
    assert [heartbeat(api).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert post(api, make_payload()).status_code == 201
    # Reads are a kind of their own too.
    assert api.get(URL).status_code == 200


@pytest.mark.usefixtures("tight")
def test_one_site_over_its_limit_leaves_the_others_alone(api, other_site_key):
    assert post(api, batch(10), BATCH_URL).status_code == 200
    assert_refused(post(api, make_payload()), "notifications")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    assert post(other, batch(10), BATCH_URL).status_code == 200


@pytest.mark.usefixtures("tight")
def test_a_sites_own_limit_raises_its_budget_and_only_its_own(api, site, other_site_key, settings):
    site.rate_limit, site.rate_burst = 1000.0, 30
    site.save()
    settings.OUTBOX_KEY_CACHE_SECONDS = 0  # the site as stored now, not as a verified key remembers it
    assert [post(api, batch(10), BATCH_URL).status_code for _ in range(3)] == [200, 200, 200]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    assert post(other, batch(10), BATCH_URL).status_code == 200
    assert_refused(post(other, make_payload()), "notifications")


@pytest.mark.usefixtures("tight")
def test_a_site_limit_of_zero_lets_that_site_send_without_limit(api, site, settings):
    site.rate_limit = 0
    site.save()
    settings.OUTBOX_KEY_CACHE_SECONDS = 0
    assert [post(api, batch(10), BATCH_URL).status_code for _ in range(3)] == [200, 200, 200]


@override_settings(OUTBOX_SITE_RATE_LIMIT=0)
def test_a_rate_limit_of_zero_switches_every_site_limit_off(api):
    assert [post(api, batch(10), BATCH_URL).status_code for _ in range(3)] == [200, 200, 200]
    assert not SiteRateBucket.objects.exists()


@override_settings(OUTBOX_SITE_RATE_LIMIT=1000.0, OUTBOX_SITE_RATE_BURST=5000)
def test_single_posts_take_their_tokens_in_chunks_not_one_round_trip_each(api, monkeypatch):
    # Held tokens are dropped after a second; 50 posts may take longer on a busy machine (or
    # through PgBouncer), which is the next test's subject, not this one's.
    monkeypatch.setattr(rate_limits, "LEASE_SECONDS", 60.0)
    with CaptureQueriesContext(connection) as captured:
        for _ in range(50):
            assert post(api, make_payload()).status_code == 201
    bucket_statements = [q for q in captured.captured_queries if "siteratebucket" in q["sql"]]
    # 100 tokens a chunk (a tenth of a second at 1,000 a second): the first post creates the
    # bucket and takes one chunk; the other 49 spend it here.
    assert len(bucket_statements) <= 4, [q["sql"][:80] for q in bucket_statements]
    bucket = SiteRateBucket.objects.get(scope="notifications")
    assert bucket.tokens <= 5000 - 50


@override_settings(OUTBOX_SITE_RATE_LIMIT=1000.0, OUTBOX_SITE_RATE_BURST=5000)
def test_tokens_held_longer_than_their_lease_are_dropped_not_spent_late(api, monkeypatch):
    monkeypatch.setattr(rate_limits, "LEASE_SECONDS", 0.0)  # every chunk is stale by the next post
    assert post(api, make_payload()).status_code == 201  # creates the bucket
    with CaptureQueriesContext(connection) as captured:
        for _ in range(5):
            assert post(api, make_payload()).status_code == 201
    takes = [
        q for q in captured.captured_queries if q["sql"].lstrip().startswith("UPDATE") and "siteratebucket" in q["sql"]
    ]
    assert len(takes) == 5  # with the lease kept, the first post's chunk would have served all five


@pytest.mark.usefixtures("tight")
def test_the_tokens_a_process_holds_are_taken_from_the_shared_bucket(api, site):
    # What this process holds is already gone from the bucket another process would draw from.
    assert post(api, batch(6), BATCH_URL).status_code == 200
    assert SiteRateBucket.objects.get(site=site, scope="notifications").tokens == pytest.approx(4, abs=0.01)
    leases.clear()  # another process: nothing held, only the bucket
    assert_refused(post(api, batch(5), BATCH_URL), "notifications")
    assert post(api, batch(4), BATCH_URL).status_code == 200


def test_a_burst_smaller_than_the_largest_batch_stops_the_server_at_start_naming_the_variable():
    error = settings_refusal(OUTBOX_SITE_RATE_BURST="500", OUTBOX_BATCH_MAX_ITEMS="1000")
    assert "OUTBOX_SITE_RATE_BURST" in error and "OUTBOX_BATCH_MAX_ITEMS" in error


@pytest.mark.parametrize(
    "given, field",
    [({"rate_limit": -1}, "rate_limit"), ({"rate_limit": "fast"}, "rate_limit"), ({"rate_burst": 10}, "rate_burst")],
)
def test_the_configuration_file_refuses_a_site_limit_that_cannot_work(db, given, field):
    from notifications.config_file import configuration_validate

    problems = configuration_validate(data={"sites": [{"site_id": "plant-a", **given}]})
    assert any(f"sites[0] ('plant-a').{field}" in problem for problem in problems), problems


def test_the_configuration_file_sets_and_exports_a_sites_own_limit(db):
    from notifications.config_file import configuration_export, configuration_import

    configuration_import(
        data={"sites": [{"site_id": "plant-a", "name": "Plant A", "rate_limit": 500, "rate_burst": 20000}]}
    )
    site = Site.objects.get(site_id="plant-a")
    assert (site.rate_limit, site.rate_burst) == (500, 20000)
    (exported,) = configuration_export()["sites"]
    assert exported == {
        "site_id": "plant-a",
        "name": "Plant A",
        "active": True,
        "rate_limit": 500.0,
        "rate_burst": 20000,
    }
    configuration_import(data={"sites": [{"site_id": "plant-a", "rate_limit": None, "rate_burst": None}]})
    site.refresh_from_db()
    assert (site.rate_limit, site.rate_burst) == (None, None)
    assert configuration_export()["sites"] == [{"site_id": "plant-a", "name": "Plant A", "active": True}]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="several connections at once")
def test_the_first_draws_of_many_processes_at_once_all_get_tokens(transactional_db):
    # The bucket is created by one of them while the others look for it: none may take the
    # moment it did not exist for a refusal (found by eight concurrent posts of one id).
    import threading

    from sites.rate_limits import Budget, bucket_take

    site = Site.objects.create(site_id="plant-a", name="Plant A")
    for _ in range(10):
        SiteRateBucket.objects.all().delete()
        barrier = threading.Barrier(8)
        answers: list[tuple[float | None, float]] = []

        def take(barrier, answers):
            barrier.wait()
            try:
                answers.append(
                    bucket_take(site=site, scope="notifications", need=1, want=11, budget=Budget(rate=100, burst=5000))
                )
            finally:
                connection.close()

        threads = [threading.Thread(target=take, args=(barrier, answers)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [granted for granted, _ in answers] == [11.0] * 8
