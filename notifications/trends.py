"""Hourly delivery trends for the dashboard: delivered, delivered partially, parked and failed
per hour over the last 24 hours or 7 days, in total, by site and by channel (notification type).

- delivered: rows delivered in the hour (``delivered_at``), partial deliveries included;
- partial (delivered partially): of those, the rows some target refused for good
  (``targets_refused`` > 0: one of three mailboxes does not exist);
- parked: rows parked now, by the hour they parked (the age expiry, else their last attempt,
  else their creation); a row retried since is no longer counted;
- failed: failed delivery attempts started in the hour (any failure class), by their
  notification's site and channel, except the attempts that failed while some of the
  notification's targets had it (``DeliveryAttempt.targets_delivered`` > 0: a recipient
  refusing inside a partial delivery, not an outage), which are counted apart as
  ``failed_partial`` (not charted; the failed chart's caption gives their total).

On PostgreSQL all of them are read from the hourly counts the database keeps
(notifications.counts); on SQLite they are counted from the rows (delivered from a partial
index of delivered rows on (delivered_at, source_site_id, type) alone, migration 0011; the
partial deliveries from their partial index on delivered_at, 0008; failed attempts from their
partial index, joined to their notification for the site and channel). Grouped statements,
each returning at most hours × sites × channels rows.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Q
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from notifications.counts import counts_fold, counts_kept, failed_hourly_counts, hourly_counts
from notifications.models import DeliveryAttempt, Notification

Status = Notification.Status
# The charted series, in the dashboard's order, and their words.
METRICS = ("delivered", "partial", "parked", "failed")
LABELS = {"delivered": "delivered", "partial": "delivered partially", "parked": "parked", "failed": "failed"}
# Counted too, not charted: the failed attempts left out of "failed".
SERIES = (*METRICS, "failed_partial")
RANGES = {"24h": 24, "7d": 24 * 7}
# Counts of one metric: (hour counted from the range's start, site, channel, count).
Row = tuple[int, str, str, int]


@dataclass
class Series:
    """Per-hour counts of each metric, oldest hour first."""

    hours: int
    counts: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for metric in SERIES:
            self.counts.setdefault(metric, [0] * self.hours)

    def total(self, metric: str) -> int:
        return sum(self.counts[metric])


@dataclass
class Trends:
    """The trends of one range: ``start`` is the first hour, ``overall`` the totals,
    ``by_site`` and ``by_channel`` the breakdowns (largest volume first)."""

    range_name: str
    hours: int
    start: datetime
    overall: Series
    by_site: dict[str, Series]
    by_channel: dict[str, Series]

    def hour_starts(self) -> list[datetime]:
        return [self.start + timedelta(hours=n) for n in range(self.hours)]


def trends_compute(*, range_name: str = "24h", now: datetime | None = None) -> Trends:
    """The trends over ``range_name`` ("24h" or "7d"; ValueError otherwise), ending with the
    current hour."""
    if range_name not in RANGES:
        raise ValueError(f"Unknown trend range {range_name!r}; choose one of {', '.join(RANGES)}.")
    hours = RANGES[range_name]
    now = now or timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)

    rows_by_metric = _kept_rows(start) if counts_kept() else _counted_series(start)

    overall = Series(hours)
    by_site: dict[str, Series] = {}
    by_channel: dict[str, Series] = {}
    for metric, rows in rows_by_metric.items():
        for index, site_id, channel, n in rows:
            if not 0 <= index < hours:
                continue  # a clock a little ahead of ours; not this range
            site_series = by_site.get(site_id) or by_site.setdefault(site_id, Series(hours))
            channel_series = by_channel.get(channel) or by_channel.setdefault(channel, Series(hours))
            for series in (overall, site_series, channel_series):
                series.counts[metric][index] += n
    return Trends(
        range_name=range_name,
        hours=hours,
        start=start,
        overall=overall,
        by_site=_by_volume(by_site),
        by_channel=_by_volume(by_channel),
    )


def _indexed(rows: Any, start: datetime) -> Iterable[Row]:
    """Grouped rows as ``(hour, site, channel, count)``, the hour counted from ``start``."""
    for row in rows:
        yield int((row["hour"] - start).total_seconds() // 3600), row["source_site_id"], row["type"], row["n"]


def _kept_rows(start: datetime) -> dict[str, Iterable[Row]]:
    """Every series from ``start`` on, from the hourly counts the database keeps (PostgreSQL)."""
    counts_fold()
    return {
        "delivered": hourly_counts(Status.DELIVERED, start),
        "partial": hourly_counts(Status.DELIVERED, start, partial=True),
        "parked": hourly_counts(Status.PARKED, start),
        "failed": failed_hourly_counts(start, partial=False),
        "failed_partial": failed_hourly_counts(start, partial=True),
    }


def _counted_series(start: datetime) -> dict[str, Iterable[Row]]:
    """Every series from ``start`` on, counted from the rows (SQLite)."""
    delivered, partial, parked = (_indexed(rows, start) for rows in _counted_rows(start))
    failed = (
        DeliveryAttempt.objects.filter(~Q(failure_class=""), started_at__gte=start)
        .annotate(
            hour=TruncHour("started_at"),
            source_site_id=F("notification__source_site_id"),
            type=F("notification__type"),
        )
        .values("hour", "source_site_id", "type")
        .annotate(n=Count("started_at"))
        .order_by()
    )
    return {
        "delivered": delivered,
        "partial": partial,
        "parked": parked,
        "failed": _indexed(failed.filter(targets_delivered=0), start),
        "failed_partial": _indexed(failed.filter(targets_delivered__gt=0), start),
    }


def _counted_rows(start: datetime) -> tuple[Any, Any, Any]:
    """The delivered, delivered partially and parked rows from ``start`` on, grouped by hour,
    site and channel, counted from the rows themselves (SQLite, and the reference the kept
    counts are tested against): the delivered from their partial index alone (0011), the
    partial ones from theirs on delivered_at (0008), the parked from the partial index of
    open rows."""
    delivered = (
        Notification.objects.filter(status=Status.DELIVERED, delivered_at__gte=start)
        .annotate(hour=TruncHour("delivered_at"))
        .values("hour", "source_site_id", "type")
        .annotate(n=Count("delivered_at"))
        .order_by()
    )
    partial = delivered.filter(targets_refused__gt=0)
    parked_time = Coalesce("expired_at", "last_attempt_at", "created_at")
    parked = (
        Notification.objects.filter(status=Status.PARKED)
        .annotate(parked_at=parked_time)
        .filter(parked_at__gte=start)
        .annotate(hour=TruncHour("parked_at"))
        .values("hour", "source_site_id", "type")
        .annotate(n=Count("created_at"))
        .order_by()
    )
    return delivered, partial, parked


def _by_volume(groups: dict[str, Series]) -> dict[str, Series]:
    def volume(item: tuple[str, Series]) -> tuple[int, str]:
        return (-sum(item[1].total(metric) for metric in METRICS), item[0])

    return dict(sorted(groups.items(), key=volume))
