"""Per-site rate limits, shared by every web process on every host (docs/operations.md, "Rate
limits").

A site has several budgets, each a token bucket that refills at its rate up to its burst:

- ``notifications``: the notifications it sends, counted one by one (a batch of N draws N);
- ``critical``: its critical notifications, on a budget of their own, so that a flood of
  ordinary ones never gets a critical one refused;
- one per kind of other request, never drawn by notifications: ``agent`` (its agent's
  heartbeats, parked reports and command acknowledgements), ``watchdog`` (pings), ``ack``
  (acknowledging and clearing from the site), ``read`` (status and list reads) and
  ``requests`` (any other site call).

A request that needs more tokens than a budget has is refused whole (429 with Retry-After),
and draws nothing.

**Shared, and cheap.** The buckets live in the database (``SiteRateBucket``), one row per site
and budget, so every web process on every host draws from the same tokens. A process takes
tokens in chunks — about a tenth of a second's worth of the rate, in one conditional UPDATE
that also refills the bucket on the database's clock — and spends them locally, so a single
post costs a round trip only once per chunk. Tokens a process took but has not spent within a
second are dropped: the fleet may spend less than its budgets allow for a moment, never more.
The database rather than Redis: it is always there (Redis is optional), it is the clock every
process already agrees on, and a chunk costs one short statement, not one per request.
"""

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Field

from notifications.db import database_now
from sites.models import Site, SiteRateBucket

NOTIFICATIONS = "notifications"
CRITICAL = "critical"
AGENT = "agent"
WATCHDOG = "watchdog"
ACK = "ack"
READ = "read"
REQUESTS = "requests"
SCOPES = (NOTIFICATIONS, CRITICAL, AGENT, WATCHDOG, ACK, READ, REQUESTS)

# A process takes about this many seconds' worth of a budget's rate at a time (and at most a
# twentieth of its burst), and drops what it has not spent after LEASE_SECONDS.
CHUNK_SECONDS = 0.1
LEASE_SECONDS = 1.0


@dataclass(frozen=True)
class Budget:
    """A bucket's shape: refills at ``rate`` tokens a second, holds at most ``burst``."""

    rate: float
    burst: float

    @property
    def chunk(self) -> float:
        """How many tokens beyond its need a process takes at a time."""
        return float(max(0, math.floor(min(self.rate * CHUNK_SECONDS, self.burst / 20))))


class RateLimited(Exception):
    """A site lacks tokens in ``scope``: the request is refused; retry after ``wait`` seconds."""

    def __init__(self, *, scope: str, wait: float) -> None:
        super().__init__(f"{scope} budget exhausted; retry in {wait:.1f} s")
        self.scope = scope
        self.wait = wait

    @property
    def retry_after(self) -> int:
        """``wait`` in whole seconds, at least 1 (Retry-After takes an integer)."""
        return max(1, math.ceil(self.wait))


def site_budget(*, site: Site, scope: str) -> Budget | None:
    """The budget ``scope`` of ``site``: its own limit where it has one (notifications), else the
    installation's; None when unlimited (OUTBOX_SITE_RATE_LIMIT=0 switches every limit off, a
    site's limit of 0 its notification limit)."""
    if not settings.OUTBOX_SITE_RATE_LIMIT:
        return None
    largest_batch = settings.OUTBOX_BATCH_MAX_ITEMS
    if scope == NOTIFICATIONS:
        rate = settings.OUTBOX_SITE_RATE_LIMIT if site.rate_limit is None else site.rate_limit
        burst = settings.OUTBOX_SITE_RATE_BURST if site.rate_burst is None else site.rate_burst
        return Budget(rate=rate, burst=max(burst, largest_batch)) if rate else None
    if scope == CRITICAL:
        burst = max(settings.OUTBOX_SITE_CRITICAL_RATE_BURST, largest_batch)
        return Budget(rate=settings.OUTBOX_SITE_CRITICAL_RATE_LIMIT, burst=burst)
    return Budget(rate=settings.OUTBOX_SITE_REQUEST_RATE_LIMIT, burst=settings.OUTBOX_SITE_REQUEST_RATE_BURST)


def notifications_needs(items: Iterable[Any]) -> dict[str, int]:
    """The tokens a request of these submitted items draws: one per item, from ``critical`` for
    the items that say ``"priority": "critical"``, else from ``notifications`` (an invalid item
    counts too: refusing it costs the server as much)."""
    needs = {NOTIFICATIONS: 0, CRITICAL: 0}
    for item in items:
        critical = isinstance(item, dict) and item.get("priority") == "critical"
        needs[CRITICAL if critical else NOTIFICATIONS] += 1
    return needs


def site_rate_draw(*, site: Site, needs: Mapping[str, int]) -> None:
    """Take ``needs[scope]`` tokens from each of ``site``'s budgets, all or none: raises
    :class:`RateLimited` (the longest wait of the budgets that lack tokens) and takes nothing
    when one lacks them."""
    budgets = {scope: site_budget(site=site, scope=scope) for scope, need in needs.items() if need > 0}
    limited = {scope: budget for scope, budget in budgets.items() if budget is not None}
    refusals = [
        refusal
        for scope, budget in limited.items()
        if (refusal := leases.reserve(site=site, scope=scope, need=needs[scope], budget=budget)) is not None
    ]
    if refusals:
        raise max(refusals, key=lambda refusal: refusal.wait)
    for scope in limited:
        leases.spend(site=site, scope=scope, count=needs[scope])


class _Leases:
    """This process's tokens, per (site, budget): taken from the shared bucket, not yet spent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], list[float]] = {}  # -> [tokens, dropped after (monotonic)]

    def reserve(self, *, site: Site, scope: str, need: int, budget: Budget) -> RateLimited | None:
        """Make sure ``need`` tokens are held here, taking a chunk from the bucket if not; the
        refusal when the bucket lacks them (what was held stays held)."""
        key = (site.pk, scope)
        with self._lock:
            held = self._held.get(key)
            if held is not None and held[1] < time.monotonic():
                held = self._held.pop(key)  # leased too long ago: dropped, never spent late
                held[0] = 0.0
            have = 0.0 if held is None else held[0]
            if have >= need:
                return None
        granted, wait = bucket_take(
            site=site, scope=scope, need=need - have, want=need - have + budget.chunk, budget=budget
        )
        if granted is None:
            return RateLimited(scope=scope, wait=wait)
        with self._lock:
            held = self._held.setdefault(key, [0.0, 0.0])
            held[0] += granted
            held[1] = time.monotonic() + LEASE_SECONDS
        return None

    def spend(self, *, site: Site, scope: str, count: int) -> None:
        with self._lock:
            held = self._held.get((site.pk, scope))
            if held is not None:
                held[0] = max(0.0, held[0] - count)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


leases = _Leases()


# --- the shared buckets -------------------------------------------------------------------------------

# Refill on the database's clock and take ``want`` tokens, or just ``need`` when fewer are left,
# in one statement that locks the row: concurrent takers queue on it and each sees the tokens
# the one before left (the SET is evaluated on the row as it is when the lock is granted).
_AVAILABLE = (
    "LEAST(%(burst)s, tokens + GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - refilled_at)) * %(rate)s)"
)
_TABLE = SiteRateBucket._meta.db_table
_TAKE_SQL = f"""
UPDATE {_TABLE} SET
    granted = CASE WHEN {_AVAILABLE} >= %(want)s THEN %(want)s ELSE %(need)s END,
    tokens = {_AVAILABLE} - CASE WHEN {_AVAILABLE} >= %(want)s THEN %(want)s ELSE %(need)s END,
    refilled_at = statement_timestamp()
WHERE site_id = %(site)s AND scope = %(scope)s AND {_AVAILABLE} >= %(need)s
RETURNING granted
"""
_AVAILABLE_SQL = f"SELECT {_AVAILABLE} FROM {_TABLE} WHERE site_id = %(site)s AND scope = %(scope)s"


def bucket_take(*, site: Site, scope: str, need: float, want: float, budget: Budget) -> tuple[float | None, float]:
    """Take ``want`` tokens (or, if fewer are left, ``need``) from ``site``'s shared bucket
    ``scope`` after refilling it: ``(tokens taken, 0)``, or ``(None, seconds until need is
    there)`` when even ``need`` is not. A bucket used for the first time starts full."""
    params: dict[str, Any] = {
        "site": site.pk,
        "scope": scope,
        "need": need,
        "want": want,
        "rate": budget.rate,
        "burst": budget.burst,
    }
    if connection.vendor != "postgresql":
        return _bucket_take_portable(site=site, scope=scope, need=need, want=want, budget=budget)
    with connection.cursor() as cursor:
        for _ in range(3):
            cursor.execute(_TAKE_SQL, params)
            row = cursor.fetchone()
            if row is not None:
                return float(row[0]), 0.0
            cursor.execute(_AVAILABLE_SQL, params)
            available = cursor.fetchone()
            if available is None:
                _bucket_create(site=site, scope=scope, budget=budget)
            elif float(available[0]) < need:
                return None, (need - float(available[0])) / budget.rate
            # else the bucket was created by another process between the two statements: again
    # Tokens there, and taken by others each time we tried: come back in a moment.
    return None, 1.0 / budget.rate


def _bucket_create(*, site: Site, scope: str, budget: Budget) -> None:
    try:
        with transaction.atomic():
            SiteRateBucket.objects.create(site=site, scope=scope, tokens=budget.burst, refilled_at=database_now())
    except IntegrityError:
        pass  # created by another process meanwhile


def _bucket_take_portable(
    *, site: Site, scope: str, need: float, want: float, budget: Budget
) -> tuple[float | None, float]:
    """The same on SQLite, whose IMMEDIATE transactions serialise writers."""
    with transaction.atomic():
        now = database_now()
        bucket, _ = SiteRateBucket.objects.get_or_create(
            site=site, scope=scope, defaults={"tokens": budget.burst, "refilled_at": now}
        )
        elapsed = max(0.0, (now - bucket.refilled_at).total_seconds())
        available = min(budget.burst, bucket.tokens + elapsed * budget.rate)
        if available < need:
            return None, (need - available) / budget.rate
        taken = want if available >= want else need
        SiteRateBucket.objects.filter(pk=bucket.pk).update(tokens=available - taken, refilled_at=now, granted=taken)
        return taken, 0.0


def site_rate_problems(*, rate_limit: Any, rate_burst: Any) -> dict[str, str]:
    """What is wrong with a site's own limit and burst (None: the installation's), per field, in
    the words of the console's site form (the configuration file says the same)."""
    problems = {}
    if rate_limit is not None:
        if isinstance(rate_limit, bool) or not isinstance(rate_limit, (int, float)) or not math.isfinite(rate_limit):
            problems["rate_limit"] = "Must be a number of notifications per second (0: no limit)."
        elif messages := _field_problems("rate_limit", rate_limit):
            problems["rate_limit"] = messages
    if rate_burst is not None:
        if isinstance(rate_burst, bool) or not isinstance(rate_burst, int):
            problems["rate_burst"] = "Must be a whole number of notifications."
        elif messages := _field_problems("rate_burst", rate_burst):
            problems["rate_burst"] = messages
    return problems


def _field_problems(name: str, value: Any) -> str:
    try:
        cast(Field, Site._meta.get_field(name)).run_validators(value)
    except ValidationError as error:
        return " ".join(error.messages)
    return ""
