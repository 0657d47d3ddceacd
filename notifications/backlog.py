"""What waits for delivery, beyond its count: by priority, and as deliveries per site.

- **By priority** (the gauge ``outbox_queue_depth_by_priority{priority}`` and the KPIs):
  critical, high and low rows are counted off the claim index, key by key (usually a handful
  of rows); normal is the rest of the queue depth the KPIs already have. On SQLite, counted.
- **Deliveries per site** ("fan-out", the KPIs' ``deliveries_queued``): each waiting
  notification times the targets its list has for its channel now — what the site's backlog
  will cost to send. One notification to a list of 5 in individual mode is 5 messages; a site
  flooding a large list shows here first. Read from the claim index (site, channel, list) and
  the lists' targets as delivery would resolve them.
"""

from collections import defaultdict
from typing import Any

from django.db import connection
from django.db.models import Count

from notifications import db
from notifications.adapters import adapter_for
from notifications.models import PRIORITY_NAMES, Notification
from notifications.vocabulary import ADAPTER_PATHS

Priority = Notification.Priority


def _statuses() -> str:
    return ", ".join(f"'{status}'" for status in Notification.NON_TERMINAL)


def _not_normal_counts_sql() -> str:
    """Per priority other than normal, its open rows: the keys of the claim index, then each
    such key's rows (one range each)."""
    open_rows = f"o.status IN ({_statuses()})"
    return (
        f"WITH RECURSIVE {db.claim_keys_cte(open_rows)} "
        "SELECT k.p, (SELECT count(*) FROM notifications_notification AS n "
        f"WHERE n.source_site_id = k.s AND n.priority = k.p AND n.type = k.t AND n.status IN ({_statuses()})) "
        f"FROM keys AS k WHERE k.p <> {Priority.NORMAL.value}"
    )


def queue_depth_by_priority(*, queue_depth: int) -> dict[str, int]:
    """``{priority name: waiting rows}`` for every priority, most urgent first; ``queue_depth``
    is every waiting row (Pending and Retrying), as the KPIs count it."""
    counts = dict.fromkeys(PRIORITY_NAMES, 0)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_not_normal_counts_sql())
            rows = list(cursor.fetchall())
        for value, count in rows:
            counts[Priority(value).label] += int(count)
        counts[Priority.NORMAL.label] = max(0, queue_depth - sum(counts.values()))
        return counts
    waiting = Notification.objects.filter(status__in=Notification.NON_TERMINAL).order_by()
    for value, count in waiting.values_list("priority").annotate(count=Count("pk")):
        counts[Priority(value).label] = count
    return counts


def deliveries_queued_by_site() -> dict[str, int]:
    """``{site_id: deliveries}`` for the sites with waiting rows: each waiting row counts the
    targets its list has for its channel now (0 for a list that has none: it will park)."""
    # COUNT(*), not of a column: the waiting rows' claim index (notif_claim_idx: site, priority,
    # channel, the list included) then answers alone, an index-only scan. Counting the primary
    # key read every waiting row from the table: 780 ms for 500,000 waiting rows of 10,000,000,
    # on every console page (the KPIs); 300 ms so.
    waiting = (
        Notification.objects.filter(status__in=Notification.NON_TERMINAL)
        .values_list("source_site_id", "type", "list_name")
        .annotate(count=Count("*"))
        .order_by()
    )
    by_channel: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
    for site_id, channel, list_name, count in waiting:
        by_channel[channel][(site_id, list_name)] = count
    deliveries: dict[str, int] = defaultdict(int)
    for channel, counts in by_channel.items():
        targets = _targets_per_list(channel, {list_name for _, list_name in counts})
        for (site_id, list_name), count in counts.items():
            deliveries[site_id] += count * targets.get(list_name, 0)
    return dict(deliveries)


def _targets_per_list(channel: str, list_names: set[str]) -> dict[str, int]:
    """How many targets each of ``list_names`` has for ``channel``, as delivery resolves them."""
    if channel not in ADAPTER_PATHS:
        return {}
    resolved: dict[str, Any] = adapter_for(channel).resolve_targets(list_names=list_names)
    return {name: len(targets) for name, targets in resolved.items()}
