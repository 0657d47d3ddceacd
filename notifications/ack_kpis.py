"""Acknowledgement figures for the KPIs, the console and the metrics (docs/acknowledgement.md):
the notifications still waiting for someone to acknowledge them, and how long people took.

- **Unacknowledged**: asks for acknowledgement, neither acknowledged nor cleared (escalation
  steps included: each is a message someone has not answered); one aggregate over a partial
  index of exactly those rows.
- **Time to acknowledge**: for the notifications acknowledged within the interval (escalation
  steps left out: they are acknowledged with their parent), from central's creation of the
  notification to its acknowledgement, per list and per site: count, median and 90th
  percentile, from a partial index of acknowledged rows.
"""

import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Count, Q

from notifications.models import PRIORITY_NAMES, Notification

# The time-to-acknowledge figures read at most this many acknowledgements of the interval (the
# newest): people acknowledge a few hundred alarms an hour at most.
MAX_ACKNOWLEDGEMENTS_READ = 10_000


def unacknowledged_q() -> Q:
    """Notifications that ask for acknowledgement and have neither been acknowledged nor cleared."""
    return Q(asks_ack=True, acknowledged_at__isnull=True, cleared_at__isnull=True)


def unacknowledged_counts() -> tuple[dict[str, int], dict[str, int]]:
    """``(by priority name, every priority included; by site)``."""
    by_priority = dict.fromkeys(PRIORITY_NAMES, 0)
    by_site: dict[str, int] = {}
    rows = (
        Notification.objects.filter(unacknowledged_q())
        .values("priority", "source_site_id")
        .annotate(n=Count("created_at"))
        .order_by()
    )
    for row in rows:
        by_priority[Notification.Priority(row["priority"]).label] += row["n"]
        by_site[row["source_site_id"]] = by_site.get(row["source_site_id"], 0) + row["n"]
    return by_priority, by_site


def time_to_ack(*, since: datetime) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"per_list": {name: figures}, "per_site": {site_id: figures}}`` over the notifications
    acknowledged at or after ``since``; figures: ``acknowledged``, ``median_seconds``,
    ``p90_seconds``."""
    rows = (
        Notification.objects.filter(acknowledged_at__gte=since, escalation_of__isnull=True)
        .order_by("-acknowledged_at")
        .values_list("list_name", "source_site_id", "created_at", "acknowledged_at")[:MAX_ACKNOWLEDGEMENTS_READ]
    )
    per_list: dict[str, list[float]] = {}
    per_site: dict[str, list[float]] = {}
    for list_name, site_id, created_at, acknowledged_at in rows:
        if acknowledged_at is None:  # never, by the filter; for the type checker
            continue
        seconds = max(0.0, (acknowledged_at - created_at).total_seconds())
        per_list.setdefault(list_name, []).append(seconds)
        per_site.setdefault(site_id, []).append(seconds)
    return {
        "per_list": {name: _figures(values) for name, values in sorted(per_list.items())},
        "per_site": {name: _figures(values) for name, values in sorted(per_site.items())},
    }


def _figures(seconds: Iterable[float]) -> dict[str, Any]:
    values = sorted(seconds)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return {
        "acknowledged": len(values),
        "median_seconds": round(statistics.median(values), 3),
        "p90_seconds": round(p90, 3),
    }
