"""Delivery KPIs (DESIGN §6), computed on demand from the notifications table.

One aggregate statement grouped by source site gives every figure; the global figures are
sums (and the minimum age) of the per-site ones. It reads only open rows (Pending, Retrying,
Parked) and rows delivered within the interval, each half from a partial index, so it stays
fast on a table that is mostly delivered history.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DateTimeField, Min, Q, Value
from django.utils import timezone

from notifications.models import Notification

Status = Notification.Status
KEYS = ("queue_depth", "stuck", "parked", "delivered_last_interval", "oldest_pending_age_seconds")


def kpis_compute(*, now=None):
    """``{"global": {...}, "per_site": {site_id: {...}}, "computed_at": iso}``; each figure set
    holds queue_depth (Pending + Retrying), stuck (non-terminal and older than
    OUTBOX_STUCK_AGE), parked, delivered_last_interval (within OUTBOX_KPI_INTERVAL) and
    oldest_pending_age_seconds (the oldest non-terminal notification's age; None when none)."""
    now = now or timezone.now()
    stuck_before = now - timedelta(seconds=settings.OUTBOX_STUCK_AGE)
    since = now - timedelta(seconds=settings.OUTBOX_KPI_INTERVAL)
    non_terminal = Q(status__in=Notification.NON_TERMINAL)
    # One statement, two halves, each answered from a small partial index alone (index-only
    # scans; migration 0005): the open rows (Pending, Retrying, Parked) and the rows delivered
    # within the interval. counting an indexed column, not the pk, which would need the table itself.
    open_rows = (
        Notification.objects.filter(status__in=[*Notification.NON_TERMINAL, Status.PARKED])
        .values("source_site_id")
        .annotate(
            queue_depth=Count("created_at", filter=non_terminal),
            stuck=Count("created_at", filter=non_terminal & Q(created_at__lt=stuck_before)),
            parked=Count("created_at", filter=Q(status=Status.PARKED)),
            delivered_last_interval=Value(0),
            oldest=Min("created_at", filter=non_terminal),
        )
        .order_by()
    )
    delivered = (
        Notification.objects.filter(status=Status.DELIVERED, delivered_at__gte=since)
        .values("source_site_id")
        .annotate(
            queue_depth=Value(0), stuck=Value(0), parked=Value(0), delivered_last_interval=Count("delivered_at"),
            oldest=Value(None, output_field=DateTimeField()),
        )
        .order_by()
    )  # fmt: skip
    merged = {}
    for row in open_rows.union(delivered, all=True):
        site = merged.setdefault(row["source_site_id"], {**dict.fromkeys(KEYS[:-1], 0), "oldest": None})
        for key in KEYS[:-1]:
            site[key] += row[key]
        if row["oldest"] is not None and (site["oldest"] is None or row["oldest"] < site["oldest"]):
            site["oldest"] = row["oldest"]
    rows = [{"source_site_id": site_id, **figures} for site_id, figures in merged.items()]
    per_site = {}
    overall = dict.fromkeys(KEYS[:-1], 0)
    oldest_overall = None
    for row in rows:
        oldest = row.pop("oldest")
        site_id = row.pop("source_site_id")
        per_site[site_id] = {**row, "oldest_pending_age_seconds": _age(now, oldest)}
        for key in overall:
            overall[key] += row[key]
        if oldest is not None and (oldest_overall is None or oldest < oldest_overall):
            oldest_overall = oldest
    overall["oldest_pending_age_seconds"] = _age(now, oldest_overall)
    return {
        "global": overall,
        "per_site": dict(sorted(per_site.items())),
        "computed_at": now.isoformat().replace("+00:00", "Z"),
    }


def _age(now, then):
    return None if then is None else round(max(0.0, (now - then).total_seconds()), 3)
