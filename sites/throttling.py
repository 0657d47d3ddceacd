"""Per-site rate limiting of the API: a token bucket per site, in each web process.

A runaway site script must not starve the others. The bucket refills at
OUTBOX_SITE_RATE_LIMIT requests per second up to OUTBOX_SITE_RATE_BURST; an empty bucket
answers 429 with Retry-After (the site agent waits that long). The limit is per web process,
so the fleet-wide limit is this times the number of processes; a shared counter would cost
a round trip per request, as much as the insert it protects. 0 disables limiting.
"""

import math
import threading
import time

from django.conf import settings
from rest_framework.throttling import BaseThrottle

from sites.models import Site


class SiteRateThrottle(BaseThrottle):
    _buckets = {}  # site_id -> [tokens, last refill (monotonic)]
    _lock = threading.Lock()

    def allow_request(self, request, view):
        rate = settings.OUTBOX_SITE_RATE_LIMIT
        site = request.user
        if rate <= 0 or not isinstance(site, Site):
            return True
        burst = max(settings.OUTBOX_SITE_RATE_BURST, 1)
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.setdefault(site.site_id, [float(burst), now])
            bucket[0] = min(burst, bucket[0] + (now - bucket[1]) * rate)
            bucket[1] = now
            if bucket[0] >= 1:
                bucket[0] -= 1
                self._wait = 0
                return True
            self._wait = (1 - bucket[0]) / rate
            return False

    def wait(self):
        # Whole seconds, at least 1: Retry-After takes an integer.
        return max(1, math.ceil(self._wait))
