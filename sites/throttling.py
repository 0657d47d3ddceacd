"""Rate limits of the API, as token buckets in each web process: requests per site, and failed
authentications per client address and per credential.

A runaway site script must not starve the others. The bucket refills at
OUTBOX_SITE_RATE_LIMIT requests per second up to OUTBOX_SITE_RATE_BURST; an empty bucket
answers 429 with Retry-After (the site agent waits that long). The limit is per web process,
so the fleet-wide limit is this times the number of processes; a shared counter would cost
a round trip per request, as much as the insert it protects. 0 disables limiting. Watchdog
pings draw on a bucket of their own (SiteWatchdogThrottle).
"""

import math
import threading
import time
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from sites.models import Site


class SiteRateThrottle(BaseThrottle):
    _buckets: dict[str, list[float]] = {}  # site_id -> [tokens, last refill (monotonic)]
    _lock = threading.Lock()
    _wait = 0.0
    # The settings that hold this limit's rate (per second) and burst.
    rate_setting = "OUTBOX_SITE_RATE_LIMIT"
    burst_setting = "OUTBOX_SITE_RATE_BURST"

    def allow_request(self, request: Request, view: Any) -> bool:
        rate = float(getattr(settings, self.rate_setting))
        site = request.user
        if rate <= 0 or not isinstance(site, Site):
            return True
        burst = max(int(getattr(settings, self.burst_setting)), 1)
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.setdefault(site.site_id, [float(burst), now])
            bucket[0] = min(burst, bucket[0] + (now - bucket[1]) * rate)
            bucket[1] = now
            if bucket[0] >= 1:
                bucket[0] -= 1
                self._wait = 0.0
                return True
            self._wait = (1 - bucket[0]) / rate
            return False

    def wait(self) -> float:
        # Whole seconds, at least 1: Retry-After takes an integer.
        return max(1, math.ceil(self._wait))


class SiteWatchdogThrottle(SiteRateThrottle):
    """Watchdog pings: a bucket of their own per site (OUTBOX_SITE_WATCHDOG_RATE_LIMIT pings a
    second, bursts of OUTBOX_SITE_WATCHDOG_RATE_BURST), so that a site sending many
    notifications never has its pings refused, nor the other way round."""

    _buckets: dict[str, list[float]] = {}
    _lock = threading.Lock()
    rate_setting = "OUTBOX_SITE_WATCHDOG_RATE_LIMIT"
    burst_setting = "OUTBOX_SITE_WATCHDOG_RATE_BURST"


# --- failed authentication --------------------------------------------------------------------


class AuthFailureLimiter:
    """Failed authentications, counted per client address and per credential (an API key's
    prefix, a token), as token buckets in each web process.

    Every failure takes a token from each of the request's buckets. A client address whose
    bucket is empty is answered 429 with Retry-After *before* its credential is checked, so
    guessing from one place costs the server nothing beyond the refusal. A credential whose
    bucket is empty (its prefix guessed from many places) turns further failures into 429s; a
    request presenting the right credential is never refused for it, so guessing cannot lock a
    site out. A bucket holds OUTBOX_AUTH_FAILURE_BURST failures and
    refills at OUTBOX_AUTH_FAILURE_RATE per minute. Successful requests do not count. Per
    process, like the site limit: the fleet-wide allowance is this times the web processes.
    """

    MAX_BUCKETS = 50_000

    def __init__(self, *, burst: str = "OUTBOX_AUTH_FAILURE_BURST", rate: str = "OUTBOX_AUTH_FAILURE_RATE") -> None:
        """``burst``, ``rate``: the names of the settings that hold the bucket's size and its
        refill per minute (the console's logins have settings of their own)."""
        self._burst_setting, self._rate_setting = burst, rate
        self._buckets: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    def _rate(self) -> float:
        return float(getattr(settings, self._rate_setting))

    def _refilled(self, key: tuple[str, str], now: float) -> list[float]:
        burst = float(max(getattr(settings, self._burst_setting), 1))
        per_second = self._rate() / 60.0
        bucket = self._buckets.get(key)
        if bucket is None:
            return [burst, now]
        bucket[0] = min(burst, bucket[0] + (now - bucket[1]) * per_second)
        bucket[1] = now
        return bucket

    def wait(self, keys: list[tuple[str, str]]) -> float:
        """Seconds until every one of ``keys`` may fail again; 0 when none is exhausted."""
        if self._rate() <= 0:
            return 0.0
        now = time.monotonic()
        per_second = self._rate() / 60.0
        waits = []
        with self._lock:
            for key in keys:
                if key in self._buckets:
                    bucket = self._refilled(key, now)
                    if bucket[0] < 1:
                        waits.append((1 - bucket[0]) / per_second)
        return max(waits, default=0.0)

    def record(self, keys: list[tuple[str, str]]) -> None:
        """Count one failed authentication against each of ``keys``."""
        if self._rate() <= 0:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) >= self.MAX_BUCKETS:
                self._buckets.clear()
            for key in keys:
                bucket = self._refilled(key, now)
                bucket[0] = max(bucket[0] - 1, 0.0)
                self._buckets[key] = bucket

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()


auth_failures = AuthFailureLimiter()


def client_address(request: Any) -> str:
    """The client's address: REMOTE_ADDR, or behind the reverse proxy (OUTBOX_BEHIND_PROXY) the
    last address of X-Forwarded-For, the one our proxy appended."""
    meta = request.META
    if settings.OUTBOX_BEHIND_PROXY:
        forwarded = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-1][:64]
    return str(meta.get("REMOTE_ADDR") or "-")[:64]


def auth_failures_check(keys: list[tuple[str, str]]) -> None:
    """Raise DRF's Throttled (429 with Retry-After) when one of ``keys`` (failure buckets such
    as ``("client", address)``) has no failure left."""
    wait = auth_failures.wait(keys)
    if wait > 0:
        raise exceptions.Throttled(
            wait=max(1, math.ceil(wait)), detail="Too many failed authentications; retry after the indicated delay."
        )
