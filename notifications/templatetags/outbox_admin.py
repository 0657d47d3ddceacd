"""Template helpers for the operations console (KPI tiles on the outbox page and dashboard)."""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django import template
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from notifications.console_time import console_time
from notifications.kpis import kpis_compute
from notifications.workers import WorkerSilence, workers_silence

register = template.Library()


@register.simple_tag(takes_context=True)
def outbox_dashboard_kpis(context: template.Context) -> dict[str, Any] | None:
    """The KPIs for the admin index, or None when the user may not view notifications."""
    request = context.get("request")
    if request is None or not request.user.has_perm("notifications.view_notification"):
        return None
    return kpis_compute()


@register.simple_tag(takes_context=True)
def outbox_worker_silence(context: template.Context) -> WorkerSilence | None:
    """For users who may view notifications: a :class:`WorkerSilence` when no worker process
    has run for two minutes (nothing is being delivered), else None."""
    request = context.get("request")
    if request is None or not request.user.has_perm("notifications.view_notification"):
        return None
    return workers_silence()


@register.filter
def age(seconds: float | None) -> str:
    """A queue age for a tile: "—" when nothing is queued, else the two largest units."""
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.simple_tag
def kpi_interval() -> str:
    """The "delivered in the last …" window (OUTBOX_KPI_INTERVAL), in words."""
    return age(settings.OUTBOX_KPI_INTERVAL)


@register.simple_tag
def stuck_minutes() -> int:
    """The stuck-age threshold (OUTBOX_STUCK_AGE) in whole minutes."""
    return settings.OUTBOX_STUCK_AGE // 60


@register.filter
def sorted_items(mapping: Mapping[Any, Any] | None) -> list[tuple[Any, Any]]:
    """The items of ``mapping`` sorted by key (as text)."""
    return sorted((mapping or {}).items(), key=lambda item: str(item[0]))


@register.filter
def nonzero_items(mapping: Mapping[Any, Any] | None) -> list[tuple[Any, Any]]:
    """The items of ``mapping`` whose value is not zero, in its order."""
    return [(key, value) for key, value in (mapping or {}).items() if value]


@register.filter
def iso_utc(value: object) -> str:
    """ "2026-11-23T08:09:41.293676Z" (or a datetime) → "2026-11-23 08:09:41 UTC", in the
    console's zone (UTC unless the operator chose theirs)."""
    if isinstance(value, datetime):
        return console_time(value)
    text = str(value or "")
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is not None and timezone.is_aware(moment):
        return console_time(moment)
    return f"{text[:10]} {text[11:19]} UTC" if len(text) >= 19 else text


RANGE_LABELS = {"24h": "last 24 hours", "7d": "last 7 days"}


@register.simple_tag(takes_context=True)
def outbox_dashboard_trends(context: template.Context) -> dict[str, Any] | None:
    """The dashboard's trend charts (notifications.trends) for the range in ``?trends=`` (24h
    by default), or None when the user may not view notifications."""
    from notifications.charts import bar_chart, sparkline
    from notifications.trends import LABELS, METRICS, trends_compute

    request = context.get("request")
    if request is None or not request.user.has_perm("notifications.view_notification"):
        return None
    range_name = request.GET.get("trends", "24h")
    if range_name not in RANGE_LABELS:
        range_name = "24h"
    label = RANGE_LABELS[range_name]
    trends = trends_compute(range_name=range_name)
    # The hours in the console's chosen zone (the counts are per UTC hour, which is a whole
    # hour in every zone of whole-hour offset; a half-hour zone shows its labels at :30).
    hours = [timezone.localtime(hour) for hour in trends.hour_starts()]

    def sparks(series: Any) -> list[tuple[str, int, str]]:
        return [
            (
                metric,
                series.total(metric),
                sparkline(values=series.counts[metric], metric=metric, range_label=label, label=LABELS[metric]),
            )
            for metric in METRICS
        ]

    return {
        "range_name": range_name,
        "range_label": label,
        "zone": timezone.get_current_timezone_name(),
        "ranges": list(RANGE_LABELS.items()),
        "charts": [
            (
                metric,
                LABELS[metric],
                trends.overall.total(metric),
                bar_chart(
                    values=trends.overall.counts[metric],
                    hours=hours,
                    metric=metric,
                    range_label=label,
                    label=LABELS[metric],
                ),
            )
            for metric in METRICS
        ],
        # The failed attempts the failed chart leaves out: recipients refusing inside a partial delivery.
        "failed_partial": trends.overall.total("failed_partial"),
        "labels": [LABELS[metric] for metric in METRICS],
        "tile_sparks": {metric: spark for metric, _, spark in sparks(trends.overall)},
        "by_site": [(site, sparks(series)) for site, series in list(trends.by_site.items())[:20]],
        "more_sites": max(0, len(trends.by_site) - 20),
        "by_channel": [(channel, sparks(series)) for channel, series in trends.by_channel.items()],
    }


@register.filter(name="console_time")
def console_time_filter(value: datetime | None) -> str:
    """A timestamp as every console page shows it: seconds and zone."""
    return console_time(value)


@register.simple_tag(takes_context=True)
def outbox_status_line(context: template.Context, kpis: dict[str, Any] | None) -> Any:
    """The status line (notifications.status_line) from the page's ``kpis``, or None when the
    user may not view notifications."""
    from notifications.status_line import status_line_compute

    request = context.get("request")
    if kpis is None or request is None or not request.user.has_perm("notifications.view_notification"):
        return None
    return status_line_compute(kpis=kpis)


@register.simple_tag
def outbox_filtered_tiles(changelist: Any) -> dict[str, Any] | None:
    """For an outbox page with a filter or a search: the tiles' and the per-site table's
    figures over the rows they match (notifications.admin.tiles), and the tiles' links, which
    keep the filters; None on the unfiltered page (the tiles then show the KPIs)."""
    from notifications.admin.tiles import filtered_tiles

    if not (changelist.has_active_filters or changelist.query):
        return None
    tiles = filtered_tiles(changelist.queryset)
    # The counts beside the rows share the tiles' budget: the matches by site and list take what
    # is left (a filter whose matches are costly to read, a common word at a million rows, then
    # costs the page the tiles' 120 ms of counts, not 120 + 100).
    changelist.counts_budget_left_ms = tiles.budget_left_ms
    links = {
        "queue_depth": {"status": "queued"},
        "stuck": {"stuck": "1"},
        "parked": {"status": "Parked"},
        "unacknowledged": {"ack": "unacknowledged"},
        "suppressed": {"status": "Suppressed"},
        "expired": {"status": "Parked"},
        "delivered": {"status": "Delivered"},
        "partial": {"targets": "partial"},
        "oldest": {"status": "queued", "o": "8"},
    }
    return {
        "figures": tiles.figures,
        "capped": any(figure.capped for figure in tiles.figures.values()),
        "uncounted": any(figure.value is None for figure in tiles.figures.values()),
        "oldest_pending_age_seconds": tiles.oldest_pending_age_seconds,
        "per_site": tiles.per_site,
        # Back to the first page ("p": None removes exactly that parameter; remove= takes prefixes).
        "links": {name: changelist.get_query_string({**params, "p": None}) for name, params in links.items()},
    }


@register.simple_tag
def outbox_matches(changelist: Any) -> Any:
    """The outbox page's matches counted by site and by list (notifications.console), following
    its filters and search, within what the tiles left of their budget; those of the
    rows the page shows where counting the matches was already cut at its budget (the
    paginator's ``count_cut``)."""
    from notifications.console import MATCHES_BUDGET_MS, matches_by_site_and_list

    if getattr(changelist.paginator, "count_cut", False):
        budget_ms = 0
    else:
        budget_ms = min(MATCHES_BUDGET_MS, getattr(changelist, "counts_budget_left_ms", MATCHES_BUDGET_MS))
    return matches_by_site_and_list(changelist.queryset, shown=changelist.result_list, budget_ms=budget_ms)
