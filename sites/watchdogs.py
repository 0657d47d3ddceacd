"""Watchdogs: dead-man switches for site scripts (docs/operations.md, "Watchdogs").

A site script pings a watchdog (``POST /api/v1/sites/watchdogs/``, or the agent's
``outbox.watchdog()``) at least every ``every_seconds``. Central keeps the latest ping (the
site's ``pinged_at``, never later than central's clock, and never moving backwards) and judges
the watchdogs with :func:`watchdogs_evaluate`, which the worker runs every minute and which can
be run at any time: it is idempotent.

* **Silent.** A watchdog that has missed two intervals raises one ``high`` notification for its
  list and channel ("Watchdog plant-a/pump-loop silent since …") and is ``silent``; when it pings
  again it raises one ``normal`` notification and is ``ok`` again. One of each per silence.
* **Judged against what the site could tell.** The site agent forwards the latest ping of each
  watchdog *before* each heartbeat, so when a heartbeat arrives central holds every ping the
  site had. A watchdog of a site whose agent heart-beats is therefore overdue only when its two
  intervals ran out *before the site's latest heartbeat*: a link that is down (no heartbeats
  either) never makes a watchdog look silent. It is silent once a *later* heartbeat still
  brings no newer ping: the link may come back between the agent's ping (which failed) and its
  heartbeat (which got through), and the ping is sent again before the next heartbeat. This
  costs one heartbeat interval (30 s by default) of latency. A site that only posts directly
  is judged against central's clock, at once.
* **A silent site** (its agent has heart-beated, but not for ``OUTBOX_SITE_SILENT_AFTER``)
  raises one ``high`` "site silent" notification per list and channel its watchdogs report to,
  instead of one per watchdog, and its watchdogs are not judged one by one until it is heard
  from again; then one ``normal`` "heard from again" notification per list, and each of its
  watchdogs gets one interval of grace from that heartbeat (pings normally arrive before it, so
  the grace only covers a ping that could not be forwarded first).
* **Retired** watchdogs are not judged. A ping made after the retirement brings a watchdog back
  (its script runs again); an older ping, forwarded late, does not.

Notifications are raised through the normal ingest path as the site (so they are delivered,
counted and audited like any other row) with ids derived from the watchdog, or the site and
list, and the start of the silence (uuid5): whoever raises them, however often, there is one
row per silence. Each is recorded as a :class:`~sites.models.WatchdogAlert`.
"""

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from notifications.clock import database_now
from notifications.ingest import notification_validate, notifications_ingest
from notifications.list_names import list_name_key
from sites.models import Site, SiteHeartbeat, SiteSilence, Watchdog, WatchdogAlert

logger = logging.getLogger(__name__)

State = Watchdog.State
Kind = WatchdogAlert.Kind
# The namespace of the ids of the notifications watchdogs raise (uuid5 of what the silence is).
WATCHDOG_NAMESPACE = uuid.UUID("5f0c3a8e-2b7d-4c1e-9a46-0d8e3f1b7c21")
MISSED_INTERVALS = 2  # a watchdog is silent when this many intervals passed without a ping
SOURCE_SCRIPT = "outbox watchdogs"
SUBJECT_LIMIT = 255


@dataclass
class WatchdogReport:
    """What one evaluation did: notifications raised by kind, sites judged."""

    sites: int = 0
    raised: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str) -> None:
        self.raised[kind] = self.raised.get(kind, 0) + 1

    def __str__(self) -> str:
        raised = ", ".join(f"{count} {kind}" for kind, count in sorted(self.raised.items())) or "nothing raised"
        return f"watchdogs of {self.sites} site(s) judged: {raised}"


def _iso(moment: datetime) -> str:
    """``moment`` for people: UTC, to the second."""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _key_time(moment: datetime) -> str:
    """``moment`` in a notification id's key: UTC, to the microsecond (two silences of one
    watchdog may start within a second)."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


# --- pings ----------------------------------------------------------------------------------------


def watchdog_ping(
    *, site: Site, name: str, every_seconds: int, list_name: str, type: str, pinged_at: datetime | None
) -> Watchdog:
    """Record one ping of ``site``'s watchdog ``name`` (created by its first ping); returns it.

    The ping counts at ``min(pinged_at, now)`` on central's clock and never moves the last ping
    backwards; interval, list and channel are the ping's. A silent watchdog that pings again
    raises its "pinging again" notification now; a retired one comes back when the ping was
    made after it was retired."""
    now = database_now()
    moment = min(pinged_at or now, now)
    with transaction.atomic():
        watchdog = _locked_or_created(site=site, name=name, moment=moment, now=now)
        watchdog.every_seconds, watchdog.list_name, watchdog.type = every_seconds, list_name, type
        if moment > watchdog.last_ping_at:
            watchdog.last_ping_at, watchdog.overdue_heard_at = moment, None
        if watchdog.state == State.RETIRED and watchdog.retired_at is not None and moment > watchdog.retired_at:
            watchdog.state, watchdog.state_changed_at = State.OK, now
            watchdog.retired_at, watchdog.retired_by = None, ""
        if watchdog.state == State.SILENT:
            _recovered_if_pinged(watchdog, site=site, now=now, report=WatchdogReport())
        watchdog.save()
    return watchdog


def _locked_or_created(*, site: Site, name: str, moment: datetime, now: datetime) -> Watchdog:
    """``site``'s watchdog ``name``, locked for this transaction; created (pinged at ``moment``)
    if it does not exist yet, by this ping or a concurrent one."""
    for _ in range(2):
        watchdog = Watchdog.objects.select_for_update().filter(site=site, name=name).first()
        if watchdog is not None:
            return watchdog
        try:
            with transaction.atomic():
                return Watchdog.objects.create(
                    site=site, name=name, every_seconds=1, list_name="", last_ping_at=moment, state_changed_at=now
                )
        except IntegrityError:
            continue  # created by a concurrent first ping: lock that one
    raise RuntimeError(f"watchdog {site.site_id}/{name} could be neither created nor found")


# --- retiring -------------------------------------------------------------------------------------


def watchdogs_retire(*, watchdog_ids: Iterable[int], user: User) -> tuple[int, int]:
    """Retire the watchdogs ``watchdog_ids`` that are not retired yet: they are no longer judged
    (a silent one raises no "pinging again"). Recorded in the admin history under ``user``.
    Returns ``(retired, skipped)``."""
    ids = set(watchdog_ids)
    now = database_now()
    with transaction.atomic():
        targets = list(Watchdog.objects.select_for_update().filter(pk__in=ids).exclude(state=State.RETIRED))
        Watchdog.objects.filter(pk__in=[watchdog.pk for watchdog in targets]).update(
            state=State.RETIRED,
            state_changed_at=now,
            silent_since=None,
            retired_at=now,
            retired_by=user.get_username()[:150],
        )
        if targets and user.pk:
            LogEntry.objects.log_actions(
                user_id=user.pk,
                queryset=targets,
                action_flag=CHANGE,
                change_message="Retired: no longer watched (a ping made later brings it back).",
            )
    return len(targets), len(ids) - len(targets)


# --- evaluation -----------------------------------------------------------------------------------


def watchdogs_evaluate(*, now: datetime | None = None) -> WatchdogReport:
    """Judge every watchdog that is not retired, site by site (see the module's rules), raising
    the notifications that are due. Idempotent: a second run at the same ``now`` (default: the
    database clock) raises nothing."""
    now = now or database_now()
    report = WatchdogReport()
    sites = (
        Site.objects.filter(active=True, watchdogs__state__in=[State.OK, State.SILENT]).distinct().order_by("site_id")
    )
    for site in sites:
        report.sites += 1
        site_watchdogs_evaluate(site=site, now=now, report=report)
    return report


def site_watchdogs_evaluate(*, site: Site, now: datetime, report: WatchdogReport) -> None:
    """Judge ``site``'s watchdogs at ``now``, in one transaction holding them locked, so that
    two workers (or a ping) never judge one watchdog at the same time."""
    with transaction.atomic():
        watchdogs = list(
            Watchdog.objects.select_for_update().filter(site=site, state__in=[State.OK, State.SILENT]).order_by("pk")
        )
        if not watchdogs:
            return
        heard_at = SiteHeartbeat.objects.filter(site=site).values_list("received_at", flat=True).first()
        if heard_at is not None and now - heard_at > timedelta(seconds=settings.OUTBOX_SITE_SILENT_AFTER):
            _site_silent(site=site, since=heard_at, watchdogs=watchdogs, now=now, report=report)
            return
        if heard_at is not None:
            _site_back(site=site, heard_at=heard_at, now=now, report=report)
        grace_from = (
            SiteSilence.objects.filter(site=site, back_at__isnull=False)
            .order_by("-back_at")
            .values_list("back_at", flat=True)
            .first()
        )
        for watchdog in watchdogs:
            _watchdog_judge(watchdog, site=site, heard_at=heard_at, grace_from=grace_from, now=now, report=report)


def _overdue(watchdog: Watchdog, *, heard_at: datetime | None, grace_from: datetime | None, now: datetime) -> bool:
    """Whether an ``ok`` watchdog's two intervals ran out before what the site could tell us:
    its latest heartbeat ``heard_at`` (pings go first), or ``now`` for a site without one; and,
    after the site was silent, not within one interval of its return ``grace_from``."""
    interval = timedelta(seconds=watchdog.every_seconds)
    deadline = watchdog.last_ping_at + MISSED_INTERVALS * interval
    if grace_from is not None:
        deadline = max(deadline, grace_from + interval)
    return deadline < (heard_at if heard_at is not None else now)


def _watchdog_judge(
    watchdog: Watchdog,
    *,
    site: Site,
    heard_at: datetime | None,
    grace_from: datetime | None,
    now: datetime,
    report: WatchdogReport,
) -> None:
    """Raise what one watchdog is owed: "pinging again" for a silent one with a newer ping;
    "silent" for an overdue one — for a site whose agent heart-beats, only once a later
    heartbeat than the one that first found it overdue still brought no newer ping (a ping
    that failed while the link came back, the heartbeat right after it getting through, is
    sent again before the next heartbeat)."""
    if watchdog.state == State.SILENT:
        if _recovered_if_pinged(watchdog, site=site, now=now, report=report):
            watchdog.save()
        return
    if not _overdue(watchdog, heard_at=heard_at, grace_from=grace_from, now=now):
        if watchdog.overdue_heard_at is not None:
            watchdog.overdue_heard_at = None
            watchdog.save(update_fields=["overdue_heard_at"])
        return
    if heard_at is not None and (watchdog.overdue_heard_at is None or heard_at <= watchdog.overdue_heard_at):
        if watchdog.overdue_heard_at is None:
            watchdog.overdue_heard_at = heard_at
            watchdog.save(update_fields=["overdue_heard_at"])
        return
    _silent(watchdog, site=site, now=now, report=report)


def _silent(watchdog: Watchdog, *, site: Site, now: datetime, report: WatchdogReport) -> None:
    """``watchdog`` is silent: one ``high`` notification for its list and channel."""
    deadline = watchdog.last_ping_at + MISSED_INTERVALS * timedelta(seconds=watchdog.every_seconds)
    watchdog.state, watchdog.state_changed_at, watchdog.silent_since = State.SILENT, now, watchdog.last_ping_at
    watchdog.overdue_heard_at = None
    watchdog.save(update_fields=["state", "state_changed_at", "silent_since", "overdue_heard_at"])
    since = _iso(watchdog.last_ping_at)
    _raise(
        site=site,
        kind=Kind.SILENT,
        key=f"{site.site_id}/{watchdog.name}/{_key_time(watchdog.last_ping_at)}",
        list_name=watchdog.list_name,
        type=watchdog.type,
        priority="high",
        subject=_subject(f"Watchdog {site.site_id}/", watchdog.name, f" silent since {since}"),
        body=(
            f"Watchdog {watchdog.name!r} of site {site.site_id} is to be pinged at least every "
            f"{watchdog.every_seconds} s; its last ping was at {since}, and none came for two intervals.\n"
            "The script that pings it may have stopped, hung, or lost its way to the site agent.\n"
            "Central raises this once per silence, and once more when the watchdog pings again."
        ),
        enqueued_at=deadline,
        watchdog=watchdog,
        report=report,
    )


def _recovered_if_pinged(watchdog: Watchdog, *, site: Site, now: datetime, report: WatchdogReport) -> bool:
    """A silent watchdog with a ping newer than its silence is ``ok`` again and raises its
    "pinging again" notification (the caller saves it); whether it was."""
    since = watchdog.silent_since
    if since is None or watchdog.last_ping_at <= since:
        return False
    watchdog.state, watchdog.state_changed_at, watchdog.silent_since = State.OK, now, None
    _raise(
        site=site,
        kind=Kind.RECOVERED,
        key=f"{site.site_id}/{watchdog.name}/{_key_time(since)}",
        list_name=watchdog.list_name,
        type=watchdog.type,
        priority="normal",
        subject=_subject(f"Watchdog {site.site_id}/", watchdog.name, " pinging again"),
        body=(
            f"Watchdog {watchdog.name!r} of site {site.site_id}, silent since {_iso(since)}, "
            f"pinged again at {_iso(watchdog.last_ping_at)}."
        ),
        enqueued_at=watchdog.last_ping_at,
        watchdog=watchdog,
        report=report,
    )
    return True


def _site_silent(
    *, site: Site, since: datetime, watchdogs: list[Watchdog], now: datetime, report: WatchdogReport
) -> None:
    """``site`` has been silent since its heartbeat ``since``: record the silence (ending one
    that an unseen return ended) and raise one "site silent" notification per list and channel
    of ``watchdogs``."""
    silence = SiteSilence.objects.select_for_update().filter(site=site, back_at__isnull=True).first()
    if silence is not None and silence.since != since:
        # Heard from (and silent again) between two evaluations: that silence ended.
        _site_back(site=site, heard_at=since, now=now, report=report)
        silence = None
    if silence is None:
        silence, _ = SiteSilence.objects.get_or_create(site=site, since=since, defaults={"noticed_at": now})
    names = ", ".join(sorted(watchdog.name for watchdog in watchdogs))
    for list_name, type_name in _lists_of(watchdogs):
        _raise(
            site=site,
            kind=Kind.SITE_SILENT,
            key=f"{site.site_id}/{list_name_key(list_name)}/{type_name}/{_key_time(since)}",
            list_name=list_name,
            type=type_name,
            priority="high",
            subject=_subject("Site ", site.site_id, f" silent since {_iso(since)}"),
            body=(
                f"Central has had no heartbeat from the agent of site {site.site_id} since {_iso(since)} "
                f"(more than {settings.OUTBOX_SITE_SILENT_AFTER} s). Its link to central may be down, or its "
                "agent stopped: its notifications and its watchdogs' pings wait at the site.\n"
                f"Its watchdogs ({names}) cannot be watched until it is heard from again; central raises this "
                "once per list instead of once per watchdog, and once more when the site is back."
            ),
            enqueued_at=since + timedelta(seconds=settings.OUTBOX_SITE_SILENT_AFTER),
            silence=silence,
            report=report,
        )


def _site_back(*, site: Site, heard_at: datetime, now: datetime, report: WatchdogReport) -> None:
    """End ``site``'s open silence, if any, at its heartbeat ``heard_at``, with one "heard from
    again" notification to each list that was told it was silent."""
    silence = SiteSilence.objects.select_for_update().filter(site=site, back_at__isnull=True).first()
    if silence is None:
        return
    silence.back_at = heard_at
    silence.save(update_fields=["back_at"])
    told = {
        (alert.list_name, alert.type)
        for alert in WatchdogAlert.objects.filter(silence=silence, kind=Kind.SITE_SILENT).order_by("pk")
    }
    for list_name, type_name in sorted(told):
        _raise(
            site=site,
            kind=Kind.SITE_BACK,
            key=f"{site.site_id}/{list_name_key(list_name)}/{type_name}/{_key_time(silence.since)}",
            list_name=list_name,
            type=type_name,
            priority="normal",
            subject=_subject("Site ", site.site_id, " heard from again"),
            body=(
                f"Site {site.site_id}, silent since {_iso(silence.since)}, sent a heartbeat again at {_iso(heard_at)}. "
                "Its watchdogs are watched again."
            ),
            enqueued_at=heard_at,
            silence=silence,
            report=report,
        )


def _lists_of(watchdogs: Iterable[Watchdog]) -> list[tuple[str, str]]:
    """The lists and channels ``watchdogs`` report to, each once (list names compared as lists
    are), as the first watchdog spells them."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for watchdog in watchdogs:
        seen.setdefault((list_name_key(watchdog.list_name), watchdog.type), (watchdog.list_name, watchdog.type))
    return sorted(seen.values())


def _subject(prefix: str, name: str, suffix: str) -> str:
    """``prefix + name + suffix`` within a subject's length, the name cut if it must be."""
    room = SUBJECT_LIMIT - len(prefix) - len(suffix)
    if len(name) > room:
        name = name[: max(room - 1, 0)] + "…"
    return prefix + name + suffix


def _raise(
    *,
    site: Site,
    kind: str,
    key: str,
    list_name: str,
    type: str,
    priority: str,
    subject: str,
    body: str,
    enqueued_at: datetime,
    report: WatchdogReport,
    watchdog: Watchdog | None = None,
    silence: SiteSilence | None = None,
) -> None:
    """Ingest one notification as ``site`` (its id derived from ``kind`` and ``key``, so that it
    exists once whoever raises it) and record it as a WatchdogAlert; nothing when it was raised
    before."""
    notification_id = uuid.uuid5(WATCHDOG_NAMESPACE, f"{kind}/{key}")
    if WatchdogAlert.objects.filter(notification_id=notification_id).exists():
        return
    payload: dict[str, Any] = {
        "notification_id": str(notification_id),
        "type": type,
        "list_name": list_name,
        "subject": subject,
        "body": body,
        "priority": priority,
        "source_instance_id": watchdog.name if watchdog is not None else "",
        "source_script": SOURCE_SCRIPT,
        "site_enqueued_at": _iso(enqueued_at),
    }
    item, rejection = notification_validate(payload, site_id=site.site_id)
    if rejection is not None:
        # The ping was checked as ingest checks a notification; this is a bug, not bad input.
        logger.error("watchdog notification %s for %s refused: %s", kind, key, rejection.errors)
        return
    assert item is not None
    (outcome,) = notifications_ingest(site_id=site.site_id, inputs=[item])
    if outcome.result == "conflict":
        logger.error("watchdog notification %s for %s: id %s taken by another notification", kind, key, notification_id)
        return
    _, created = WatchdogAlert.objects.get_or_create(
        notification_id=notification_id,
        defaults={
            "site": site,
            "watchdog": watchdog,
            "silence": silence,
            "kind": kind,
            "list_name": list_name,
            "type": type,
        },
    )
    if created:
        report.add(kind)
        logger.info("%s: %s", WatchdogAlert.Kind(kind).label, subject, extra={"site": site.site_id, "outcome": kind})
