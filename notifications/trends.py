"""Hourly delivery trends for the dashboard: delivered, parked and failed per hour over the last
24 hours or 7 days, in total, by site and by channel (notification type).

- delivered: rows delivered in the hour (``delivered_at``);
- parked: rows parked now, by the hour they parked (the age expiry, else their last attempt,
  else their creation); a row retried since is no longer counted;
- failed: failed delivery attempts started in the hour (any failure class), by their
  notification's site and channel.

On PostgreSQL all three are read from the hourly counts the database keeps
(notifications.counts); on SQLite they are counted from the rows (delivered from a partial
index of delivered rows on (delivered_at, source_site_id, type) alone, migration 0011; failed
attempts from their partial index, joined to their notification for the site and channel).
Three grouped statements, each returning at most hours × sites × channels rows.
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
METRICS = ("delivered", "parked", "failed")
RANGES = {"24h": 24, "7d": 24 * 7}
# Counts of one metric: (hour counted from the range's start, site, channel, count).
Row = tuple[int, str, str, int]


@dataclass
class Series:
    """Per-hour counts of each metric, oldest hour first."""

    hours: int
    counts: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for metric in METRICS:
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

    if counts_kept():
        counts_fold()
        delivered: Iterable[Row] = hourly_counts(Status.DELIVERED, start)
        parked: Iterable[Row] = hourly_counts(Status.PARKED, start)
    else:
        delivered, parked = (_indexed(rows, start) for rows in _counted_rows(start))
    failed: Iterable[Row]
    if counts_kept():
        failed = failed_hourly_counts(start)
    else:
        failed = _indexed(
            DeliveryAttempt.objects.filter(~Q(failure_class=""), started_at__gte=start)
            .annotate(
                hour=TruncHour("started_at"),
                source_site_id=F("notification__source_site_id"),
                type=F("notification__type"),
            )
            .values("hour", "source_site_id", "type")
            .annotate(n=Count("started_at"))
            .order_by(),
            start,
        )

    overall = Series(hours)
    by_site: dict[str, Series] = {}
    by_channel: dict[str, Series] = {}
    for metric, rows in (("delivered", delivered), ("parked", parked), ("failed", failed)):
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


def _counted_rows(start: datetime) -> tuple[Any, Any]:
    """The delivered and parked rows from ``start`` on, grouped by hour, site and channel,
    counted from the rows themselves (SQLite, and the reference the kept counts are tested
    against): the delivered from their partial index alone (0011), the parked from the
    partial index of open rows."""
    delivered = (
        Notification.objects.filter(status=Status.DELIVERED, delivered_at__gte=start)
        .annotate(hour=TruncHour("delivered_at"))
        .values("hour", "source_site_id", "type")
        .annotate(n=Count("delivered_at"))
        .order_by()
    )
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
    return delivered, parked


def _by_volume(groups: dict[str, Series]) -> dict[str, Series]:
    def volume(item: tuple[str, Series]) -> tuple[int, str]:
        return (-sum(item[1].total(metric) for metric in METRICS), item[0])

    return dict(sorted(groups.items(), key=volume))
