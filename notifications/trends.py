"""Hourly delivery trends for the dashboard: delivered, parked and failed per hour over the last
24 hours or 7 days, in total, by site and by channel (notification type).

- delivered: rows delivered in the hour (``delivered_at``), counted from a partial index of
  delivered rows on (delivered_at, source_site_id, type) alone (migration 0008);
- parked: rows parked now, by the hour they parked (the age expiry, else their last attempt,
  else their creation), from the small partial index of open rows; a row retried since is no
  longer counted;
- failed: failed delivery attempts started in the hour (any failure class), from the partial
  index of failed attempts, joined to their notification for the site and channel.

Three grouped statements, each returning at most hours × sites × channels rows.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Q
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from notifications.models import DeliveryAttempt, Notification

Status = Notification.Status
METRICS = ("delivered", "parked", "failed")
RANGES = {"24h": 24, "7d": 24 * 7}


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

    overall = Series(hours)
    by_site: dict[str, Series] = {}
    by_channel: dict[str, Series] = {}
    for metric, rows in (("delivered", delivered), ("parked", parked), ("failed", failed)):
        for row in _rows(rows):
            index = int((row["hour"] - start).total_seconds() // 3600)
            if not 0 <= index < hours:
                continue  # a clock a little ahead of ours; not this range
            for series in (
                overall,
                by_site.setdefault(row["source_site_id"], Series(hours)),
                by_channel.setdefault(row["type"], Series(hours)),
            ):
                series.counts[metric][index] += row["n"]
    return Trends(
        range_name=range_name,
        hours=hours,
        start=start,
        overall=overall,
        by_site=_by_volume(by_site),
        by_channel=_by_volume(by_channel),
    )


def _rows(queryset: Any) -> Iterable[dict[str, Any]]:
    return iter(queryset)


def _by_volume(groups: dict[str, Series]) -> dict[str, Series]:
    def volume(item: tuple[str, Series]) -> tuple[int, str]:
        return (-sum(item[1].total(metric) for metric in METRICS), item[0])

    return dict(sorted(groups.items(), key=volume))
