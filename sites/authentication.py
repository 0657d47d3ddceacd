"""Site authentication for the API: ``Authorization: Api-Key <key>``.

Missing, malformed, unknown, revoked and expired keys answer 401; a valid key of a
deactivated site answers 403 (the caller is known, but not allowed). Repeated failures answer
429 (sites/throttling.py). A refusal of a request that carried one of a site's keys (revoked,
expired, a wrong secret, the site deactivated) is counted per key prefix for the site's page. Staff use ``Authorization: Token <staff key>`` for the staff API
(KPIs, operator actions).
"""

import hashlib
import logging
import threading
import time
from datetime import timedelta
from typing import Any, NoReturn, cast

from django.conf import settings
from django.db import DatabaseError
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from sites.models import Site, SiteAPIKey, SiteKeyRefusal, StaffAPIKey
from sites.services import site_key_refusal_record, staff_key_touch_last_used, staff_key_verify
from sites.throttling import auth_failures, auth_failures_check, client_address

logger = logging.getLogger(__name__)
KEYWORD = "Api-Key"
# Refreshing "last seen" on every request would turn each ingest into two writes.
LAST_SEEN_RESOLUTION = timedelta(seconds=60)


class SiteKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Site, SiteAPIKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        keyword, _, key = header.partition(" ")
        key = key.strip()
        if keyword != KEYWORD:
            # Another scheme (e.g. Basic for a staff user): let the next authenticator try.
            return None
        client = ("client", client_address(request))
        auth_failures_check([client])
        if not key or "." not in key or len(key) > 200:
            _failed([client], "Malformed API key.", code="invalid_key")
        prefix = key.partition(".")[0][:16]
        failure_keys = [client, ("key", prefix)]
        api_key = _verified_key(key)
        if api_key is None:
            _refusal_record(prefix=prefix, reason=_unusable_reason(prefix), client=client[1])
            _failed(failure_keys, "Unknown or revoked API key.", code="invalid_key")
        if api_key.has_expired:
            _refusal_record(prefix=prefix, reason=SiteKeyRefusal.Reason.EXPIRED, client=client[1])
            _failed(failure_keys, "API key has expired.", code="expired_key")
        site = api_key.site
        site_touch_last_seen(site=site)
        key_touch_last_used(api_key=api_key)
        return (site, api_key)

    def authenticate_header(self, request: Request) -> str:
        return KEYWORD


def _unusable_reason(prefix: str) -> str:
    """Why a key whose prefix is ``prefix`` did not verify: revoked, or a wrong secret."""
    revoked = SiteAPIKey.objects.filter(prefix=prefix).values_list("revoked", flat=True).first()
    return SiteKeyRefusal.Reason.REVOKED if revoked else SiteKeyRefusal.Reason.WRONG_SECRET


def _refusal_record(*, prefix: str, reason: str, client: str) -> None:
    """Count a refused request on its key's site (sites.services.site_key_refusal_record).
    Bookkeeping only: a database problem here must not turn the refusal into a 500."""
    try:
        site_key_refusal_record(prefix=prefix, reason=reason, client=client)
    except DatabaseError:
        logger.exception("could not record a refused key attempt for prefix %s", prefix)


def _failed(keys: list[tuple[str, str]], message: str, *, code: str) -> NoReturn:
    """Count a failed authentication against ``keys``; 401 with ``message``, or 429 once a
    bucket is exhausted (sites/throttling.py)."""
    auth_failures.record(keys)
    auth_failures_check(keys)
    raise exceptions.AuthenticationFailed(message, code=code)


class StaffKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Token <key>`` for staff users: a staff key (sites.models.StaffAPIKey,
    issued in the console under Staff API keys or with ``manage.py create_staff_key``), checked
    by one lookup and a sha512 of the key. Unknown, revoked and expired keys and keys of
    inactive users answer 401; failures are limited per client address like API keys'. HTTP
    Basic is not offered, because every guess at a password costs a password hash."""

    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, StaffAPIKey] | None:
        keyword, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None
        key = key.strip()
        client = [("client", client_address(request))]
        auth_failures_check(client)
        # Printable ASCII without spaces, as every key is: anything else (a NUL, say) never
        # reaches the database.
        if not key or len(key) > 200 or not (key.isascii() and key.isprintable()) or " " in key:
            _failed(client, "Malformed staff key.", code="invalid_key")
        staff_key = staff_key_verify(key=key)
        if staff_key is None:
            _failed(client, "Unknown or revoked staff key.", code="invalid_key")
        if staff_key.has_expired:
            _failed(client, "Staff key has expired.", code="expired_key")
        if not staff_key.user.is_active:
            _failed(client, "The staff key's user is inactive.", code="inactive_user")
        staff_key_touch_last_used(staff_key=staff_key)
        return (staff_key.user, staff_key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


# Verified keys, by the sha512 of the presented key (never the key itself). Verifying a key
# is a database round trip per request, as costly as the insert it guards; a short-lived
# cache keeps single-post ingest near the raw-insert ceiling. Revoking a key or deactivating
# a site clears this process's cache at once; other processes notice within the TTL.
_key_cache: dict[bytes, tuple[float, SiteAPIKey]] = {}
_key_cache_lock = threading.Lock()
KEY_CACHE_MAX_ENTRIES = 10_000


def _verified_key(key: str) -> SiteAPIKey | None:
    """The usable SiteAPIKey (with its site) for ``key``, or None. Expiry is checked by the caller."""
    ttl = settings.OUTBOX_KEY_CACHE_SECONDS
    digest = hashlib.sha512(key.encode()).digest()
    now = time.monotonic()
    cached = _key_cache.get(digest)
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        api_key = cast(SiteAPIKey, SiteAPIKey.objects.get_from_key(key))
    except SiteAPIKey.DoesNotExist:
        return None
    if ttl > 0:
        with _key_cache_lock:
            if len(_key_cache) >= KEY_CACHE_MAX_ENTRIES:
                _key_cache.clear()
            _key_cache[digest] = (now + ttl, api_key)
    return api_key


@receiver([post_save, post_delete], sender=SiteAPIKey)
@receiver([post_save, post_delete], sender=Site)
def _forget_verified_keys(**kwargs: Any) -> None:
    with _key_cache_lock:
        _key_cache.clear()


def site_touch_last_seen(*, site: Site) -> None:
    """Record that ``site`` was seen now, at most once per LAST_SEEN_RESOLUTION (one write)."""
    now = timezone.now()
    if site.last_seen_at is None or now - site.last_seen_at >= LAST_SEEN_RESOLUTION:
        Site.objects.filter(pk=site.pk).update(last_seen_at=now)
        site.last_seen_at = now


def key_touch_last_used(*, api_key: SiteAPIKey) -> None:
    """Record that ``api_key`` authenticated a request now, at most once per LAST_SEEN_RESOLUTION
    (one UPDATE, no signal, so the verified-key cache stays warm)."""
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_SEEN_RESOLUTION:
        SiteAPIKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now


class IsActiveSite(permissions.BasePermission):
    """The request comes from a site key, and that site is active."""

    def has_permission(self, request: Request, view: Any) -> bool:
        site = request.user
        if not isinstance(site, Site):
            return False
        if not site.active:
            api_key = request.auth if isinstance(request.auth, SiteAPIKey) else None
            if api_key is not None:
                _refusal_record(
                    prefix=api_key.prefix, reason=SiteKeyRefusal.Reason.SITE_INACTIVE, client=client_address(request)
                )
            raise exceptions.PermissionDenied("This site is deactivated.", code="site_inactive")
        return True
