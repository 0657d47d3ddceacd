"""Delivery KPIs (DESIGN §6), computed on demand from the notifications table.

One aggregate query grouped by source site gives every figure; the global figures are sums
(and the minimum age) of the per-site ones. The query reads only non-terminal rows, Parked
rows and rows delivered within the interval — each behind a partial index — so it stays fast
on a table that is mostly delivered history.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min, Q
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
    delivered_recently = Q(status=Status.DELIVERED, delivered_at__gte=since)
    rows = (
        Notification.objects.filter(non_terminal | Q(status=Status.PARKED) | delivered_recently)
        .values("source_site_id")
        .annotate(
            queue_depth=Count("pk", filter=non_terminal),
            stuck=Count("pk", filter=non_terminal & Q(created_at__lt=stuck_before)),
            parked=Count("pk", filter=Q(status=Status.PARKED)),
            delivered_last_interval=Count("pk", filter=delivered_recently),
            oldest=Min("created_at", filter=non_terminal),
        )
        .order_by()
    )
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
