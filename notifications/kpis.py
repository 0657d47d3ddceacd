"""Delivery KPIs (docs/operations.md), computed on demand, exact.

Per source site; the global figures are sums (and the minimum age) of the per-site ones.

- Queue depth, parked, expired and stuck: on PostgreSQL from the counts the database keeps
  (notifications.counts: a few hundred count rows, plus the queued rows of the one minute the
  stuck threshold falls in), with one index probe per site and status for the oldest queued
  row; on SQLite one aggregate over the open rows (Pending, Retrying, Parked) from their
  partial index.
- Delivered (and delivered partially) within the interval: one statement of two halves, each
  from a partial index alone.
- Failed attempts of the interval by failure class (a partial index of failed attempts) and
  the channels whose circuit breaker is open (a table of one row per channel endpoint).
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db.models import Count, Min, Q, Value
from django.utils import timezone

from notifications.ack_kpis import time_to_ack, unacknowledged_counts
from notifications.backlog import deliveries_queued_by_site, queue_depth_by_priority
from notifications.counts import counts_fold, counts_kept, failures_since, oldest_queued, open_counts, stuck_counts
from notifications.health import channels_unhealthy
from notifications.models import DeliveryAttempt, Notification
from notifications.vocabulary import FailureClass

Status = Notification.Status
COUNTS = (
    "queue_depth",
    "stuck",
    "parked",
    "expired",
    "delivered_last_interval",
    "partially_delivered_last_interval",
    "deliveries_queued",
    "suppressed_last_interval",
    "held_for_digest",
)
OPEN_COUNTS = ("queue_depth", "stuck", "parked", "expired")


def kpis_compute(*, now: datetime | None = None) -> dict[str, Any]:
    """``{"global": {...}, "per_site": {site_id: {...}}, "channels": [...], "computed_at": iso}``.

    Each figure set holds queue_depth (Pending + Retrying), stuck (non-terminal and queued longer
    than OUTBOX_STUCK_AGE, counted from the last operator Retry or Requeue, else from creation),
    parked, expired (the parked ones that were parked for their age), delivered_last_interval
    (within OUTBOX_KPI_INTERVAL), partially_delivered_last_interval (of those, the ones some
    targets refused for good), deliveries_queued (the waiting notifications times the targets
    of their lists: notifications.backlog), suppressed_last_interval (created within the
    interval and Suppressed: duplicates, silenced, folded into digests), held_for_digest (Pending
    rows a flood holds for its digest; part of queue_depth) and oldest_pending_age_seconds (the oldest
    non-terminal notification's age; None when none). The global set also holds
    failures_last_interval: failed attempts within the interval, per failure class (every
    class, 0 included), and queue_depth_by_priority (every priority, 0 included). ``channels``: the open or half-open channel endpoints
    (notifications.health.channels_unhealthy), empty when all are healthy."""
    now = now or timezone.now()
    stuck_before = now - timedelta(seconds=settings.OUTBOX_STUCK_AGE)
    since = now - timedelta(seconds=settings.OUTBOX_KPI_INTERVAL)
    if counts_kept():
        counts, oldest = _open_figures_kept(stuck_before)
    else:
        counts, oldest = _open_figures_counted(stuck_before)
    for row in cast(Iterable[dict[str, Any]], _delivered_rows(since)):
        figures = counts.setdefault(row["source_site_id"], dict.fromkeys(COUNTS, 0))
        figures["delivered_last_interval"] += row["delivered"]
        figures["partially_delivered_last_interval"] += row["partial"]
    for site_id, figures_of_site in suppression_counts_by_site(since=since).items():
        counts.setdefault(site_id, dict.fromkeys(COUNTS, 0)).update(figures_of_site)
    for site_id, deliveries in deliveries_queued_by_site().items():
        counts.setdefault(site_id, dict.fromkeys(COUNTS, 0))["deliveries_queued"] = deliveries
    per_site = {
        site_id: {**figures, "oldest_pending_age_seconds": _age(now, oldest.get(site_id))}
        for site_id, figures in counts.items()
    }
    overall: dict[str, Any] = {key: sum(figures[key] for figures in counts.values()) for key in COUNTS}
    oldest_overall = min((then for then in oldest.values() if then is not None), default=None)
    overall["oldest_pending_age_seconds"] = _age(now, oldest_overall)
    overall["failures_last_interval"] = _failures_since(since)
    overall["queue_depth_by_priority"] = queue_depth_by_priority(queue_depth=overall["queue_depth"])
    _acknowledgement_add(overall=overall, per_site=per_site, since=since)
    return {
        "global": overall,
        "per_site": dict(sorted(per_site.items())),
        "channels": channels_unhealthy(queue_depth=overall["queue_depth"]),
        "computed_at": now.isoformat().replace("+00:00", "Z"),
    }


def _acknowledgement_add(*, overall: dict[str, Any], per_site: dict[str, dict[str, Any]], since: datetime) -> None:
    """The acknowledgement figures (notifications.ack_kpis): ``unacknowledged`` (and by priority,
    globally) and ``time_to_ack`` (per list and site globally; each site's own beside its
    other figures, a site without any left as it is)."""
    by_priority, by_site = unacknowledged_counts()
    overall["unacknowledged"] = sum(by_priority.values())
    overall["unacknowledged_by_priority"] = by_priority
    overall["time_to_ack"] = time_to_ack(since=since)
    for site_id, figures in per_site.items():
        figures["unacknowledged"] = by_site.get(site_id, 0)
        figures["time_to_ack"] = overall["time_to_ack"]["per_site"].get(site_id)


def _open_figures_kept(stuck_before: datetime) -> tuple[dict[str, dict[str, int]], dict[str, datetime]]:
    """Per site: the open-row figures and the oldest queued row's creation, from the counts
    the database keeps (notifications.counts): a few hundred count rows, the queued rows of
    the stuck threshold's minute, and one index probe per site and status."""
    counts_fold()
    counts: dict[str, dict[str, int]] = {}
    for site_id, figures in open_counts().items():
        counts[site_id] = {**dict.fromkeys(COUNTS, 0), **figures}
    for site_id, stuck in stuck_counts(stuck_before).items():
        counts.setdefault(site_id, dict.fromkeys(COUNTS, 0))["stuck"] = stuck
    queued = [site_id for site_id, figures in counts.items() if figures["queue_depth"]]
    return counts, oldest_queued(queued)


def _open_figures_counted(stuck_before: datetime) -> tuple[dict[str, dict[str, int]], dict[str, datetime]]:
    """The same figures counted from the rows: one aggregate over the open rows (Pending,
    Retrying, Parked), answered from their partial index alone (an index-only scan; migration
    0005). SQLite, and the reference the kept counts are tested against."""
    non_terminal = Q(status__in=Notification.NON_TERMINAL)
    rows = (
        Notification.objects.filter(status__in=[*Notification.NON_TERMINAL, Status.PARKED])
        .values("source_site_id")
        .annotate(
            queue_depth=Count("created_at", filter=non_terminal),
            # Stuck counts from the last enqueue or operator Retry/Requeue (requeued_at), not creation.
            stuck=Count(
                "created_at",
                filter=non_terminal
                & Q(created_at__lt=stuck_before)
                & (Q(requeued_at__isnull=True) | Q(requeued_at__lt=stuck_before)),
            ),
            parked=Count("created_at", filter=Q(status=Status.PARKED)),
            expired=Count("created_at", filter=Q(status=Status.PARKED, expired_at__isnull=False)),
            oldest=Min("created_at", filter=non_terminal),
        )
        .order_by()
    )
    counts: dict[str, dict[str, int]] = {}
    oldest: dict[str, datetime] = {}
    for row in cast(Iterable[dict[str, Any]], rows):
        site_id = row["source_site_id"]
        counts[site_id] = {**dict.fromkeys(COUNTS, 0), **{key: row[key] for key in OPEN_COUNTS}}
        if row["oldest"] is not None:
            oldest[site_id] = row["oldest"]
    return counts, oldest


def _delivered_rows(since: datetime) -> Any:
    """Per site, the rows delivered since ``since`` and, of those, the ones delivered partially:
    two halves of one statement, each from a partial index alone (0011 and 0008)."""
    delivered = (
        Notification.objects.filter(status=Status.DELIVERED, delivered_at__gte=since)
        .values("source_site_id")
        .annotate(delivered=Count("delivered_at"), partial=Value(0))
        .order_by()
    )
    partial = (
        Notification.objects.filter(status=Status.DELIVERED, targets_refused__gt=0, delivered_at__gte=since)
        .values("source_site_id")
        .annotate(delivered=Value(0), partial=Count("delivered_at"))
        .order_by()
    )
    return delivered.union(partial, all=True)


def _failures_since(since: datetime) -> dict[str, int]:
    """Failed attempts started at or after ``since``, per failure class (0 for the absent):
    from the counts the database keeps where it keeps them, else counted."""
    counts = dict.fromkeys(FailureClass.values, 0)
    if counts_kept():
        counts.update(failures_since(since))
        return counts
    rows = (
        DeliveryAttempt.objects.filter(started_at__gte=since)
        .exclude(failure_class="")
        .values("failure_class")
        .annotate(count=Count("started_at"))
        .order_by()
    )
    for row in rows:
        counts[row["failure_class"]] = row["count"]
    return counts


def _earliest(first: datetime | None, second: datetime | None) -> datetime | None:
    return min((then for then in (first, second) if then is not None), default=None)


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round(max(0.0, (now - then).total_seconds()), 3)


def suppression_counts_by_site(*, since: datetime) -> dict[str, dict[str, int]]:
    """Per site: ``suppressed_last_interval`` (Suppressed rows created since ``since``: the
    status-and-creation index) and ``held_for_digest`` (Pending rows held now: a partial index
    of a handful of rows). One statement."""
    suppressed = Q(status=Notification.Status.SUPPRESSED, created_at__gte=since)
    held = Q(held_for_digest__isnull=False, status=Notification.Status.PENDING)
    rows = (
        Notification.objects.filter(suppressed | held)
        .values("source_site_id")
        .annotate(
            suppressed_last_interval=Count("created_at", filter=suppressed),
            held_for_digest=Count("created_at", filter=held),
        )
        .order_by()
    )
    return {
        row["source_site_id"]: {
            "suppressed_last_interval": row["suppressed_last_interval"],
            "held_for_digest": row["held_for_digest"],
        }
        for row in rows
    }
