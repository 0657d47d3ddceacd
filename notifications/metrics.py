"""Prometheus metrics (docs/observability.md): what ``GET /metrics`` exports.

Two kinds of figures, with their names fixed (dashboards and alert rules use them):

* **Counted by the dispatcher** where deliveries finish (:func:`deliveries_observe`):
  ``outbox_deliveries_total{channel,outcome}`` (outcome: delivered, retrying, parked),
  ``outbox_delivery_seconds{channel}`` (the adapter call of every started attempt) and
  ``outbox_ingest_to_delivered_seconds`` (from a row's ``created_at`` to its delivery); and,
  where a notification is acknowledged (web processes), ``outbox_time_to_ack_seconds``.
  Worker and web processes are many (django-q2 forks its workers, gunicorn its own), so the
  values live in prometheus-client's multiprocess files under ``PROMETHEUS_MULTIPROC_DIR``
  (set by manage.py and gunicorn.conf.py, ``var/metrics`` by default): every process writes
  its own file and a scrape of any web process sums them all. Processes on one host must
  share the directory; a directory of its own per host (a tmpfs such as /run, emptied at
  boot).
* **Read from the database at scrape time** (:class:`KpiCollector`): ``outbox_queue_depth
  {site}``, ``outbox_queue_depth_by_priority{priority}``, ``outbox_unacknowledged{priority}``, ``outbox_parked{site}``, ``outbox_suppressed_last_interval{site}``, ``outbox_held_for_digest{site}``, ``outbox_stuck``, ``outbox_oldest_pending_seconds``,
  ``outbox_site_backlog{site}``, ``outbox_channel_open{channel}``. They come from the same
  index-only queries as the console's KPIs (notifications.kpis), cached for
  OUTBOX_METRICS_CACHE_SECONDS per process, so a scrape costs at most one KPI pass and a
  burst of scrapes one in all. With them, ``outbox_worker_last_seen_seconds``: seconds since
  any worker process last ran (notifications.workers).

This module is imported by web processes (the view) and by the dispatcher; it imports
nothing of the worker.
"""

import hmac
import ipaddress
import os
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from notifications.kpis import kpis_compute
from notifications.metrics_files import MetricsFilesCollector
from notifications.vocabulary import ADAPTER_PATHS
from notifications.workers import workers_last_seen_seconds
from sites.services import sites_kpis

# prometheus-client picks its mode once, when it is first imported: with PROMETHEUS_MULTIPROC_DIR
# set, metric values are written to files in that directory, which must then exist.
MULTIPROCESS = values.ValueClass is not values.MutexValue
if MULTIPROCESS:
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

DELIVERY_OUTCOMES = ("delivered", "retrying", "parked")

DELIVERIES = Counter(
    "outbox_deliveries_total",
    "Delivery attempts finished, by channel and what they led to (delivered, retrying, parked).",
    ["channel", "outcome"],
)
DELIVERY_SECONDS = Histogram(
    "outbox_delivery_seconds",
    "Duration of one delivery attempt (the channel adapter's call), by channel.",
    ["channel"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
TIME_TO_ACK = Histogram(
    "outbox_time_to_ack_seconds",
    "Time from a notification's creation at central to its acknowledgement (escalation steps count for their parent).",
    buckets=(10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0),
)
INGEST_TO_DELIVERED = Histogram(
    "outbox_ingest_to_delivered_seconds",
    "Time from a notification's ingest at central to its delivery.",
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0),
)


def deliveries_observe(
    *,
    finished: Iterable[tuple[str, str, int]],
    durations: Iterable[tuple[str, float]],
    delivered_created: Iterable[datetime],
    now: datetime,
) -> None:
    """Record what one finish applied: ``finished`` (channel, outcome, rows) for the rows it
    changed, ``durations`` (channel, seconds) for every started attempt, and the ingest times
    of the rows it delivered (``now`` being their delivery time)."""
    for channel, outcome, count in finished:
        if count:
            DELIVERIES.labels(channel=channel, outcome=outcome).inc(count)
    children: dict[str, Histogram] = {}
    for channel, seconds in durations:
        if channel not in children:
            children[channel] = DELIVERY_SECONDS.labels(channel=channel)
        children[channel].observe(seconds)
    for created_at in delivered_created:
        INGEST_TO_DELIVERED.observe(max(0.0, (now - created_at).total_seconds()))


def time_to_ack_observe(seconds: float) -> None:
    """Record one acknowledgement, ``seconds`` after its notification was created at central."""
    TIME_TO_ACK.observe(max(0.0, seconds))


# --- figures from the database ------------------------------------------------------------------


class _KpiCache:
    """The last KPI figures of this process and when they were read; one reader at a time, so
    concurrent scrapes share one pass."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_at: float | None = None
        self.figures: dict[str, Any] = {}
        self.passes = 0  # KPI passes run by this process (the tests count them)

    def get(self) -> dict[str, Any]:
        with self.lock:
            ttl = settings.OUTBOX_METRICS_CACHE_SECONDS
            if self.read_at is None or time.monotonic() - self.read_at >= ttl:
                self.figures = kpi_figures()
                self.read_at = time.monotonic()
                self.passes += 1
            return self.figures

    def clear(self) -> None:
        with self.lock:
            self.read_at = None


kpi_cache = _KpiCache()


def kpi_figures() -> dict[str, Any]:
    """One KPI pass (notifications.kpis with the sites' heartbeats), reduced to what the gauges
    export."""
    kpis = kpis_compute()
    open_channels = {entry["channel"] for entry in kpis["channels"]}  # open or half open
    return {
        "per_site": {
            site: {
                "queue_depth": figures["queue_depth"],
                "parked": figures["parked"],
                "suppressed_last_interval": figures["suppressed_last_interval"],
                "held_for_digest": figures["held_for_digest"],
            }
            for site, figures in kpis["per_site"].items()
        },
        "by_priority": kpis["global"]["queue_depth_by_priority"],
        "unacknowledged_by_priority": kpis["global"]["unacknowledged_by_priority"],
        "stuck": kpis["global"]["stuck"],
        "oldest_pending_seconds": kpis["global"]["oldest_pending_age_seconds"] or 0.0,
        "site_backlog": {
            site: figures["site_backlog"]
            for site, figures in sites_kpis().items()
            if figures["site_backlog"] is not None
        },
        "channel_open": {name: int(name in open_channels) for name in sorted(ADAPTER_PATHS)},
        "worker_last_seen_seconds": workers_last_seen_seconds(),
    }


class KpiCollector(Collector):
    """The gauges read from the database, from the cached KPI figures."""

    def collect(self) -> Iterator[Metric]:
        figures = kpi_cache.get()
        per_site = figures["per_site"]
        depth = GaugeMetricFamily(
            "outbox_queue_depth", "Notifications waiting for delivery (Pending + Retrying), by site.", labels=["site"]
        )
        parked = GaugeMetricFamily(
            "outbox_parked",
            "Notifications parked (delivery given up until an operator acts), by site.",
            labels=["site"],
        )
        suppressed = GaugeMetricFamily(
            "outbox_suppressed_last_interval",
            "Notifications suppressed (duplicates, silenced, folded into digests) among those created within "
            "OUTBOX_KPI_INTERVAL, by site.",
            labels=["site"],
        )
        held = GaugeMetricFamily(
            "outbox_held_for_digest",
            "Notifications a flood holds for its digest (in the queue depth), by site.",
            labels=["site"],
        )
        for site, site_figures in sorted(per_site.items()):
            depth.add_metric([site], site_figures["queue_depth"])
            parked.add_metric([site], site_figures["parked"])
            suppressed.add_metric([site], site_figures.get("suppressed_last_interval", 0))
            held.add_metric([site], site_figures.get("held_for_digest", 0))
        yield depth
        yield parked
        yield suppressed
        yield held
        # Beside the per-site depth, never instead of it: alerts that sum outbox_queue_depth
        # over its site label keep summing exactly the rows they always did.
        by_priority = GaugeMetricFamily(
            "outbox_queue_depth_by_priority",
            "Notifications waiting for delivery (Pending + Retrying), by priority.",
            labels=["priority"],
        )
        for priority, count in figures["by_priority"].items():
            by_priority.add_metric([priority], count)
        yield by_priority
        unacknowledged = GaugeMetricFamily(
            "outbox_unacknowledged",
            "Notifications that ask for acknowledgement and are neither acknowledged nor cleared, by priority.",
            labels=["priority"],
        )
        for priority, count in figures["unacknowledged_by_priority"].items():
            unacknowledged.add_metric([priority], count)
        yield unacknowledged
        yield GaugeMetricFamily(
            "outbox_stuck",
            "Non-terminal notifications older than OUTBOX_STUCK_AGE.",
            value=figures["stuck"],
        )
        yield GaugeMetricFamily(
            "outbox_oldest_pending_seconds",
            "Age of the oldest non-terminal notification (0 when none waits).",
            value=figures["oldest_pending_seconds"],
        )
        backlog = GaugeMetricFamily(
            "outbox_site_backlog",
            "Notifications a site's agent holds for central, as its latest heartbeat reported.",
            labels=["site"],
        )
        for site, buffered in sorted(figures["site_backlog"].items()):
            backlog.add_metric([site], buffered)
        yield backlog
        channel_open = GaugeMetricFamily(
            "outbox_channel_open",
            "1 while an endpoint of the channel has its circuit breaker open (or half open, probing), else 0.",
            labels=["channel"],
        )
        for channel, value in figures["channel_open"].items():
            channel_open.add_metric([channel], value)
        yield channel_open
        # One series, without a host label, on purpose: the workers are one pool fed by one
        # queue and a task goes to whichever worker takes it first, so a healthy host may stay
        # idle for many minutes while another runs the sweep. Per host, "not seen lately" would
        # not tell an idle host from a dead one, and a host taken out of service would alert
        # for ever. What must never happen is that no worker runs at all.
        yield GaugeMetricFamily(
            "outbox_worker_last_seen_seconds",
            "Seconds since the most recent activity of any worker process (+Inf: none has ever run).",
            value=figures["worker_last_seen_seconds"],
        )


def metrics_registry() -> CollectorRegistry:
    """A registry for one scrape: the counters and histograms of every process (multiprocess
    mode) or of this one, and the gauges from the database."""
    registry = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        MetricsFilesCollector(registry, directory=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    else:
        for metric in (DELIVERIES, DELIVERY_SECONDS, INGEST_TO_DELIVERED, TIME_TO_ACK):
            registry.register(metric)
    registry.register(KpiCollector())
    return registry


# --- the view -------------------------------------------------------------------------------

# Headers a reverse proxy adds: a request carrying one was relayed, and its loopback source
# address says nothing about the client.
RELAYED_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED")


def metrics_access(request: HttpRequest) -> int | None:
    """None when ``request`` may read the metrics, else the status to answer: 401 for a wrong
    or missing bearer token when OUTBOX_METRICS_TOKEN is set, 403 for a client that is neither
    authenticated nor on this host.

    With a token configured, a request bearing it is let in from anywhere. Without one (or
    without presenting it) only a direct loopback client is: one whose address is 127.0.0.0/8
    or ::1 and that no proxy relayed (no X-Forwarded-For, X-Real-IP or Forwarded header)."""
    return access_refusal(
        authorization=request.META.get("HTTP_AUTHORIZATION", ""),
        remote_addr=str(request.META.get("REMOTE_ADDR", "")),
        relayed=any(request.META.get(name) for name in RELAYED_HEADERS),
    )


def access_refusal(*, authorization: str, remote_addr: str, relayed: bool) -> int | None:
    """The rule of :func:`metrics_access` on plain values (also used by ``serve_metrics``)."""
    token = settings.OUTBOX_METRICS_TOKEN
    if token and authorization:
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
            return None
        return 401
    if not relayed and _loopback(remote_addr):
        return None
    return 401 if token else 403


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


REFUSALS = {
    401: "Authentication required: Authorization: Bearer <OUTBOX_METRICS_TOKEN>.\n",
    403: "Metrics are served to this host only (or with OUTBOX_METRICS_TOKEN).\n",
}


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the Prometheus text format, or 401/403 (see :func:`metrics_access`)."""
    refused = metrics_access(request)
    if refused is not None:
        response = HttpResponse(REFUSALS[refused], status=refused, content_type="text/plain; charset=utf-8")
        if refused == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
