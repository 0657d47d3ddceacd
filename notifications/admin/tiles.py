"""The outbox page's KPI tiles and per-site table for the rows its filters and search match.

Without a filter the tiles show the KPIs (notifications.kpis: counts the database keeps).
With one — a site, a list, a channel, a status, a priority, a time range, a search — each
figure counts the matching rows that have its property, by site, reading at most
FILTERED_COUNT_MAX + 1 of them ("10,000+" beyond). All of them together get FILTERED_BUDGET_MS:
each statement may take what the ones before it left (PostgreSQL cancels it there), and a
figure not counted in time says so ("—"), the most urgent figures first. The rows of each
figure are found by its own condition, through the partial index made for it (named below),
with the page's filters applied to them: a bounded read whatever the filters are.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from django.conf import settings
from django.db.models import Min, Q, QuerySet
from django.utils import timezone

from notifications import db
from notifications.ack_kpis import unacknowledged_q
from notifications.admin.filters import stuck_q
from notifications.models import Notification

Status = Notification.Status
T = TypeVar("T")

# Counted exactly up to this many rows; beyond, "10,000+".
FILTERED_COUNT_MAX = 10_000
# All the figures' reads together get this long (ms); none gets less than FILTERED_STATEMENT_MIN_MS.
FILTERED_BUDGET_MS = 120
FILTERED_STATEMENT_MIN_MS = 10


@dataclass(frozen=True)
class FilteredFigure:
    """One figure of the matching rows: exact; ``capped`` (more than FILTERED_COUNT_MAX match,
    ``value`` is what was read: at least that many); or not counted within the budget
    (``value`` None)."""

    value: int | None
    capped: bool = False

    def __str__(self) -> str:
        if self.value is None:
            return "—"
        return f"{self.value:,}+" if self.capped else str(self.value)

    @property
    def nonzero(self) -> bool:
        return bool(self.value)


@dataclass
class FilteredTiles:
    """``figures``: each tile's count of the matching rows; ``per_site``: the same by site (only
    the sites with any), each with ``oldest_pending_age_seconds`` (None: none queued, or not
    read within the budget)."""

    figures: dict[str, FilteredFigure]
    oldest_pending_age_seconds: float | None
    per_site: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the figures left of FILTERED_BUDGET_MS: the page's other counts of the matching rows
    # (notifications.console's matches by site and list) share the budget.
    budget_left_ms: int = 0


def _figure_conditions(*, now: datetime) -> dict[str, Q]:
    """Each figure's rows, and (in the comments) the index they are found by."""
    since = now - timedelta(seconds=settings.OUTBOX_KPI_INTERVAL)
    delivered = Q(status=Status.DELIVERED, delivered_at__gte=since)
    return {
        # notif_kpi_open_idx: the open rows (Pending, Retrying, Parked) by site, status, creation,
        # expiry and requeue time.
        "queue_depth": Q(status__in=Notification.NON_TERMINAL),
        "stuck": stuck_q(now - timedelta(seconds=settings.OUTBOX_STUCK_AGE)),
        "parked": Q(status=Status.PARKED),
        # notif_unacknowledged_idx: the rows asking for acknowledgement that have none.
        "unacknowledged": unacknowledged_q(),
        "expired": Q(status=Status.PARKED, expired_at__isnull=False),  # notif_kpi_open_idx
        # notif_trend_delivered_idx: the delivered rows by delivery time, site and channel.
        "delivered_last_interval": delivered,
        # notif_partial_idx: the delivered rows some target refused, by delivery time.
        "partially_delivered_last_interval": delivered & Q(targets_refused__gt=0),
        # notif_status_created_idx: the Suppressed rows by creation (duplicates, silenced, in digests).
        "suppressed_last_interval": Q(status=Status.SUPPRESSED, created_at__gte=since),
    }


def filtered_tiles(queryset: QuerySet[Notification], *, now: datetime | None = None) -> FilteredTiles:
    """The tiles' figures over ``queryset`` (the page's filtered and searched rows), in total
    and by site."""
    now = now or timezone.now()
    deadline = time.monotonic() + FILTERED_BUDGET_MS / 1000

    def within(read: Callable[[], T]) -> T | None:
        """``read()`` within what is left of the budget; None when it is spent or runs out."""
        left = int((deadline - time.monotonic()) * 1000)
        return db.run_within(read, left) if left >= FILTERED_STATEMENT_MIN_MS else None

    rows = queryset.order_by()
    figures: dict[str, FilteredFigure] = {}
    per_site: dict[str, dict[str, Any]] = {}
    for name, condition in _figure_conditions(now=now).items():
        sample = rows.filter(condition).values_list("source_site_id")[: FILTERED_COUNT_MAX + 1]
        counted = within(partial(db.grouped_counts, sample, columns=["source_site_id"]))
        if counted is None:
            figures[name] = FilteredFigure(None)
            continue
        by_site = {site_id: n for (site_id,), n in counted[0].items()}
        capped = counted[1] > FILTERED_COUNT_MAX
        figures[name] = FilteredFigure(min(counted[1], FILTERED_COUNT_MAX), capped)
        for site_id, n in by_site.items():
            per_site.setdefault(site_id, {})[name] = FilteredFigure(n, capped)

    # notif_kpi_open_idx again: per site, its oldest queued row first.
    def oldest_queued() -> dict[str, datetime]:
        queued = rows.filter(status__in=Notification.NON_TERMINAL).values("source_site_id")
        return dict(queued.annotate(oldest=Min("created_at")).values_list("source_site_id", "oldest"))

    oldest_by_site = within(oldest_queued) or {}
    for site_id, figures_of_site in per_site.items():
        for name in figures:
            figures_of_site.setdefault(name, FilteredFigure(None if figures[name].value is None else 0))
        then = oldest_by_site.get(site_id)
        figures_of_site["oldest_pending_age_seconds"] = _age(now, then)
    oldest = min(oldest_by_site.values(), default=None)
    return FilteredTiles(
        figures=figures,
        oldest_pending_age_seconds=_age(now, oldest),
        per_site=dict(sorted(per_site.items())),
        budget_left_ms=max(0, int((deadline - time.monotonic()) * 1000)),
    )


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())
