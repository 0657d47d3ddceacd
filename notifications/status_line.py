"""The console's status line: one answer to "is everything OK right now?" — OK, Degraded or Down
— with since when and the one next step, at the top of the dashboard and the outbox page.

It is a list of small checks (:data:`STATUS_CHECKS`), each a function of the figures the page
has already computed (:class:`StatusInputs`) that returns its findings. A finding is Degraded or
Down, says what is wrong in a few words, since when (when known), the next step and where to
take it. The line is Down when any finding is, Degraded when any is, OK otherwise; its since is
the earliest since of the worst findings and its next step the first worst finding's (the checks
are in order of urgency). A new condition is one more function appended to the list.

Every check reads an index or the figures given (docs/console.md names them): the status line
of a million-row outbox costs a few milliseconds beyond the KPIs the page shows anyway.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from notifications.counts import counts_kept, hourly_counts
from notifications.models import MaintenanceWindow, Notification, NotificationPriority, Silence
from notifications.suppression import maintenance_window_covers
from notifications.workers import workers_silence
from sites.models import Watchdog
from sites.services import sites_kpis

Status = Notification.Status
OK, DEGRADED, DOWN = "ok", "degraded", "down"
STATE_WORDS = {OK: "OK", DEGRADED: "Degraded", DOWN: "Down"}
# Counts shown on the line are exact up to this and "10,000+" beyond: a count stops there.
COUNT_CAP = 10_000


def capped(count: int) -> str:
    """``count`` for people, "10,000+" past :data:`COUNT_CAP`."""
    return f"{COUNT_CAP:,}+" if count > COUNT_CAP else f"{count:,}"


@dataclass(frozen=True)
class Finding:
    """One thing that is not OK."""

    level: str  # DEGRADED or DOWN
    what: str
    next_step: str
    link: str = ""
    since: datetime | None = None
    key: str = ""  # a stable handle (tests, element ids): "channel:webhook", "stuck", …


@dataclass(frozen=True)
class StatusInputs:
    """What the checks read: the page's KPIs (notifications.kpis.kpis_compute) and the clock."""

    kpis: dict[str, Any]
    now: datetime


@dataclass(frozen=True)
class Quiet:
    """A silence or maintenance window in force now, shown beside the line so that nobody forgets
    one: what it covers, who set it and why, until when."""

    what: str
    who: str
    why: str
    until: datetime | None
    link: str


@dataclass
class StatusLine:
    state: str
    since: datetime | None
    next_step: str
    link: str
    findings: list[Finding] = field(default_factory=list)
    quiet: list[Quiet] = field(default_factory=list)

    @property
    def word(self) -> str:
        return STATE_WORDS[self.state]


def _outbox(**params: str) -> str:
    url = reverse("admin:notifications_notification_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def check_worker(inputs: StatusInputs) -> list[Finding]:
    """Down when no worker process has run for a while: nothing is delivered at all."""
    silence = workers_silence()
    if silence is None:
        return []
    since = silence.last.last_seen_at if silence.last else None
    return [
        Finding(
            level=DOWN,
            what="no worker is running" if since is None else "the workers stopped",
            next_step="Start the workers (manage.py qcluster); nothing is delivered until one runs.",
            link=reverse("admin:notifications_workerprocess_changelist"),
            since=since,
            key="worker",
        )
    ]


def check_open_channels(inputs: StatusInputs) -> list[Finding]:
    """Degraded per open (or half-open) channel, with its waiting rows; Down when every channel
    with waiting rows is open and nothing was delivered in the interval."""
    findings = []
    for channel in inputs.kpis.get("channels", []):
        since = _parse(channel.get("since"))
        findings.append(
            Finding(
                level=DEGRADED,
                what=f"{channel['channel']} channel {channel['state'].replace('_', '-')}, "
                f"{capped(channel['rows_waiting'])} waiting",
                next_step=f"See which sites and lists the {channel['channel']} outage hits.",
                link=reverse("admin:notifications_notification_channel")
                + "?"
                + urlencode({"channel": channel["channel"]}),
                since=since,
                key=f"channel:{channel['channel']}",
            )
        )
    overall = inputs.kpis.get("global", {})
    if findings and overall.get("queue_depth") and not overall.get("delivered_last_interval"):
        findings = [replace(finding, level=DOWN) for finding in findings]
    return findings


def check_stuck(inputs: StatusInputs) -> list[Finding]:
    """Degraded when rows have waited longer than the stuck age."""
    overall = inputs.kpis.get("global", {})
    stuck = overall.get("stuck") or 0
    if not stuck:
        return []
    age = overall.get("oldest_pending_age_seconds")
    since = inputs.now - timedelta(seconds=age) if age is not None else None
    return [
        Finding(
            level=DEGRADED,
            what=f"{capped(stuck)} stuck",
            next_step="Open the stuck rows: their last error says what they wait for.",
            link=_outbox(stuck="1"),
            since=since,
            key="stuck",
        )
    ]


def parked_last_hour(now: datetime) -> int:
    """Rows parked since the start of the previous hour (and still Parked): from the hourly
    counts the database keeps (PostgreSQL), else from the Parked rows' index."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    if counts_kept():
        return sum(n for _, _, _, n in hourly_counts(Status.PARKED, start))
    parked = Notification.objects.filter(status=Status.PARKED).filter(
        Q(expired_at__gte=start) | Q(expired_at__isnull=True, last_attempt_at__gte=start)
    )
    return parked[: COUNT_CAP + 1].count()


def check_parked_growth(inputs: StatusInputs) -> list[Finding]:
    """Degraded when rows were parked in the last hour or so."""
    grown = parked_last_hour(inputs.now)
    if not grown:
        return []
    return [
        Finding(
            level=DEGRADED,
            what=f"{capped(grown)} parked in the last hour",
            next_step="Look at the parked rows by cause; Retry those whose cause is fixed.",
            link=reverse("admin:notifications_notification_parked"),
            key="parked",
        )
    ]


def check_unacknowledged_critical(inputs: StatusInputs) -> list[Finding]:
    """Degraded while critical notifications that ask for acknowledgement have none (and are not
    cleared): read from the unacknowledged index (notif_unacknowledged_idx)."""
    waiting = Notification.objects.filter(
        asks_ack=True, acknowledged_at__isnull=True, cleared_at__isnull=True, priority=NotificationPriority.CRITICAL
    )
    count = waiting[: COUNT_CAP + 1].count()
    if not count:
        return []
    oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    return [
        Finding(
            level=DEGRADED,
            what=f"{capped(count)} critical unacknowledged",
            next_step="Make sure someone has the critical notifications in hand.",
            link=_outbox(priority="critical"),
            since=oldest,
            key="unacknowledged",
        )
    ]


def check_silent_sites(inputs: StatusInputs) -> list[Finding]:
    """Degraded per site whose agent heart-beated before and has stopped (a site that posts
    directly is never silent)."""
    silent = [site_id for site_id, figures in sites_kpis().items() if figures["silent"]]
    if not silent:
        return []
    shown = ", ".join(silent[:3]) + (", …" if len(silent) > 3 else "")
    return [
        Finding(
            level=DEGRADED,
            what=f"{len(silent)} site{'s' if len(silent) != 1 else ''} silent ({shown})",
            next_step="Check the silent sites' agents (their page shows the last heartbeat).",
            link=reverse("admin:sites_site_changelist"),
            key="sites",
        )
    ]


def check_watchdogs(inputs: StatusInputs) -> list[Finding]:
    """Degraded while watchdogs of active sites are silent (a site script stopped pinging)."""
    silent = Watchdog.objects.filter(state=Watchdog.State.SILENT, site__active=True)
    count = silent[: COUNT_CAP + 1].count()
    if not count:
        return []
    return [
        Finding(
            level=DEGRADED,
            what=f"{capped(count)} watchdog{'s' if count != 1 else ''} failing",
            next_step="Check the site scripts whose watchdogs went silent.",
            link=reverse("admin:sites_watchdog_changelist") + "?state__exact=silent",
            key="watchdogs",
        )
    ]


# In order of urgency: the first worst finding gives the line its next step.
STATUS_CHECKS: list[Callable[[StatusInputs], list[Finding]]] = [
    check_worker,
    check_open_channels,
    check_stuck,
    check_unacknowledged_critical,
    check_parked_growth,
    check_silent_sites,
    check_watchdogs,
]


def quiet_now(now: datetime) -> list[Quiet]:
    """The silences and maintenance windows in force at ``now`` (a small table each: silences by
    their end, every window judged in its own time zone)."""
    quiet = [
        Quiet(
            what=str(silence).split(" until ")[0].capitalize(),
            who=silence.created_by,
            why=silence.reason,
            until=silence.ends_at,
            link=reverse("admin:notifications_silence_change", args=[silence.pk]),
        )
        for silence in Silence.objects.filter(starts_at__lte=now, ends_at__gt=now).order_by("ends_at")[:20]
    ]
    quiet += [
        Quiet(
            what=f"Maintenance window of {window.site} ({window})",
            who="",
            why=window.reason,
            until=None,
            link=reverse("admin:notifications_maintenancewindow_change", args=[window.pk]),
        )
        for window in MaintenanceWindow.objects.all()
        if maintenance_window_covers(window, now)
    ]
    return quiet


def status_line_compute(*, kpis: dict[str, Any], now: datetime | None = None) -> StatusLine:
    """The status line from ``kpis`` (kpis_compute's answer) and :data:`STATUS_CHECKS`, with the
    silences and maintenance windows in force beside it."""
    inputs = StatusInputs(kpis=kpis, now=now or timezone.now())
    findings = [finding for check in STATUS_CHECKS for finding in check(inputs)]
    quiet = quiet_now(inputs.now)
    if not findings:
        return StatusLine(state=OK, since=None, next_step="Nothing to do.", link="", findings=[], quiet=quiet)
    state = DOWN if any(finding.level == DOWN for finding in findings) else DEGRADED
    worst = [finding for finding in findings if finding.level == state]
    sinces = [finding.since for finding in worst if finding.since is not None]
    return StatusLine(
        state=state,
        since=min(sinces) if sinces else None,
        next_step=worst[0].next_step,
        link=worst[0].link,
        findings=findings,
        quiet=quiet,
    )


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
