"""Site authentication for the API: ``Authorization: Api-Key <key>``.

Missing, malformed, unknown, revoked and expired keys answer 401; a valid key of a
deactivated site answers 403 (the caller is known, but not allowed).
"""

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from sites.models import Site, SiteAPIKey

KEYWORD = "Api-Key"
# Refreshing "last seen" on every request would turn each ingest into two writes.
LAST_SEEN_RESOLUTION = timedelta(seconds=60)


class SiteKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        keyword, _, key = header.partition(" ")
        key = key.strip()
        if keyword != KEYWORD:
            # Another scheme (e.g. Basic for a staff user): let the next authenticator try.
            return None
        if not key or "." not in key or len(key) > 200:
            raise exceptions.AuthenticationFailed("Malformed API key.", code="invalid_key")
        try:
            api_key = SiteAPIKey.objects.get_from_key(key)
        except SiteAPIKey.DoesNotExist:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.", code="invalid_key")
        if api_key.has_expired:
            raise exceptions.AuthenticationFailed("API key has expired.", code="expired_key")
        site = api_key.site
        site_touch_last_seen(site=site)
        return (site, api_key)

    def authenticate_header(self, request):
        return KEYWORD


def site_touch_last_seen(*, site):
    now = timezone.now()
    if site.last_seen_at is None or now - site.last_seen_at >= LAST_SEEN_RESOLUTION:
        Site.objects.filter(pk=site.pk).update(last_seen_at=now)
        site.last_seen_at = now


class IsActiveSite(permissions.BasePermission):
    """The request comes from a site key, and that site is active."""

    def has_permission(self, request, view):
        site = request.user
        if not isinstance(site, Site):
            return False
        if not site.active:
            raise exceptions.PermissionDenied("This site is deactivated.", code="site_inactive")
        return True
