"""API keys in the console: issued with a name and an expiry, refused expiries said in words, and
a last-used time the API records at most once a minute per key; site pages show the last
heartbeat."""

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from sites.models import SiteAPIKey, SiteHeartbeat

pytestmark = [pytest.mark.django_db]


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_key_is_issued_with_a_name_and_an_expiry(admin_client_, site):
    expiry = (timezone.now() + timedelta(days=30)).replace(second=0, microsecond=0)
    response = admin_client_.post(
        reverse("admin:sites_site_issue_key", args=[site.pk]),
        {"name": "rotation 2026-11", "expiry_date": expiry.strftime("%Y-%m-%dT%H:%M")},
    )
    assert response.status_code == 200
    issued = re.search(r'id="issued-key"[^>]*>([^<]+)<', response.content.decode())
    assert issued is not None
    key = SiteAPIKey.objects.get(prefix=issued.group(1).split(".")[0])
    assert key.name == "rotation 2026-11"
    assert key.expiry_date == expiry
    change_page = admin_client_.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()
    assert "rotation 2026-11" in change_page and 'id="issue-named-key-button"' in change_page
    assert "Last used at" in change_page


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"expiry_date": "2020-01-01T00:00"}, "The expiry must be in the future"),
        ({"expiry_date": "next tuesday"}, "Enter the expiry as a date and time"),
        ({"name": "x" * 51}, "The key name can be at most 50 characters long."),
    ],
)
def test_bad_key_details_issue_no_key_and_say_why(admin_client_, site, data, words):
    response = admin_client_.post(reverse("admin:sites_site_issue_key", args=[site.pk]), data)
    assert response.status_code == 302
    [said] = texts(response)
    assert said.startswith("No key was issued: ") and words in said
    assert not SiteAPIKey.objects.filter(site=site).exists()


def test_the_api_records_when_a_key_was_last_used_at_most_once_a_minute(client, site, site_key):
    from sites import authentication

    authentication._key_cache.clear()
    api_key = SiteAPIKey.objects.get(site=site)
    assert api_key.last_used_at is None
    headers = {"HTTP_AUTHORIZATION": f"Api-Key {site_key}"}
    url = reverse("notification-detail", args=[uuid.uuid4()])
    assert client.get(url, **headers).status_code == 404  # authenticated, nothing there
    api_key.refresh_from_db()
    first = api_key.last_used_at
    assert first is not None and timezone.now() - first < timedelta(seconds=10)
    # Within the minute: no second write (the cached key carries the time it wrote).
    client.get(url, **headers)
    api_key.refresh_from_db()
    assert api_key.last_used_at == first
    # A minute later the next request writes again.
    SiteAPIKey.objects.filter(pk=api_key.pk).update(last_used_at=first - timedelta(minutes=2))
    authentication._key_cache.clear()
    client.get(url, **headers)
    api_key.refresh_from_db()
    assert api_key.last_used_at > first


def test_site_pages_show_the_last_heartbeat(admin_client_, site):
    received = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    SiteHeartbeat.objects.create(site=site, received_at=received, agent_version="2.1")
    listing = admin_client_.get(reverse("admin:sites_site_changelist")).content.decode()
    detail = admin_client_.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()
    stamp = f"{received:%Y-%m-%d %H:%M:%S}"
    assert stamp in listing and stamp in detail
