"""What central shows of a site that cannot get through or struggles: refused key attempts per
key prefix (a revoked or expired key, a wrong secret, a deactivated site — the agent cannot say
so itself, its heartbeat is refused too), and what newer agents add to their heartbeat (what
they support, rows central answered 5xx to again and again, their local fallback relay)."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from sites.models import Site, SiteHeartbeat, SiteKeyRefusal
from sites.services import site_key_issue, site_key_revoke
from tests.support.payloads import make_payload

HEARTBEAT = "/api/v1/sites/heartbeat/"
INGEST = "/api/v1/notifications/"


def client_with(key, address="203.0.113.7"):
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client


def heartbeat(**fields):
    return {"agent_version": "0.4.0", "buffered": 40, "parked": 0, **fields}


def site_page(admin_client, site):
    return admin_client.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()


def test_requests_with_a_revoked_key_are_counted_per_prefix_and_shown_on_the_sites_page(admin_client, site):
    api_key, key = site_key_issue(site=site)
    site_key_revoke(prefix=api_key.prefix)
    agent = client_with(key)
    assert agent.post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    assert agent.post(INGEST, make_payload(), format="json").status_code == 401
    refusal = SiteKeyRefusal.objects.get(prefix=api_key.prefix)
    assert (refusal.site, refusal.count, refusal.reason, refusal.last_client) == (site, 2, "revoked", "203.0.113.7")
    assert refusal.first_at <= refusal.last_at
    content = site_page(admin_client, site)
    assert 'id="site-key-refusals"' in content
    assert f"<td>{api_key.prefix}</td><td>2</td><td>key revoked</td>" in content


def test_an_expired_key_a_wrong_secret_and_a_deactivated_site_are_told_apart(site):
    expiring, expiring_key = site_key_issue(site=site, expiry_date=timezone.now() + timedelta(days=1))
    type(expiring).objects.filter(pk=expiring.pk).update(expiry_date=timezone.now() - timedelta(minutes=1))
    live, live_key = site_key_issue(site=site)
    assert client_with(expiring_key).post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    forged = live_key.partition(".")[0] + ".not-the-secret"
    assert client_with(forged).post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    Site.objects.filter(pk=site.pk).update(active=False)
    assert client_with(live_key).post(HEARTBEAT, heartbeat(), format="json").status_code == 403
    reasons = dict(SiteKeyRefusal.objects.values_list("prefix", "reason"))
    assert reasons == {expiring.prefix: "expired", live.prefix: "site_inactive"}  # the latest refusal of each
    assert SiteKeyRefusal.objects.get(prefix=live.prefix).count == 2


def test_a_key_that_is_no_sites_is_only_rate_limited_not_recorded(db):
    assert client_with("Abcdefgh.whatever").post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    assert not SiteKeyRefusal.objects.exists()


def test_a_site_without_refusals_says_so(admin_client, site):
    assert "refused key attempts" in site_page(admin_client, site).lower()
    assert 'id="site-key-refusals"' not in site_page(admin_client, site)


def test_a_heartbeat_with_server_errors_fallback_and_capabilities_is_stored_and_shown(api, admin_client, site):
    report = heartbeat(
        capabilities=["acknowledged"],
        server_errors={"rows": 2, "since": "2026-11-21T10:00:00Z", "last_error": "HTTP 500 Internal Server Error"},
        fallback={
            "configured": True,
            "active": True,
            "delivered": 3,
            "failing": 1,
            "last_error": "relay.plant.local:25: connection refused",
            "last_error_at": "2026-11-21T10:04:00Z",
        },
    )
    assert api.post(HEARTBEAT, report, format="json").status_code == 200
    stored = SiteHeartbeat.objects.get(site=site)
    assert stored.capabilities == ["acknowledged"]
    assert stored.server_errors == {
        "rows": 2,
        "since": "2026-11-21T10:00:00+00:00",
        "last_error": "HTTP 500 Internal Server Error",
    }
    assert stored.fallback is not None and (stored.fallback["active"], stored.fallback["delivered"]) == (True, 3)
    content = site_page(admin_client, site)
    assert "capabilities: acknowledged" in content
    assert "2 rows answered 5xx by central again and again" in content and "HTTP 500 Internal Server Error" in content
    assert "local fallback relay active" in content and "3 delivered locally" in content
    assert "relay.plant.local:25: connection refused" in content


def test_an_old_agents_heartbeat_without_the_new_fields_still_works(api, admin_client, site):
    assert api.post(HEARTBEAT, heartbeat(), format="json").status_code == 200
    stored = SiteHeartbeat.objects.get(site=site)
    assert (stored.capabilities, stored.server_errors, stored.fallback) == ([], None, None)
    content = site_page(admin_client, site)
    assert "no row answered 5xx by central" in content and "no local fallback relay configured" in content


def test_malformed_new_heartbeat_fields_are_refused_field_by_field(api, site):
    response = api.post(
        HEARTBEAT,
        heartbeat(capabilities="acknowledged", server_errors={"rows": -1}, fallback={"active": "yes please"}),
        format="json",
    )
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"capabilities", "server_errors", "fallback"}
    # A number is not a boolean (DRF alone would read 0 as false).
    assert api.post(HEARTBEAT, heartbeat(fallback={"active": 0}), format="json").status_code == 400
    assert not SiteHeartbeat.objects.exists()
