"""Business rules for sites: their API keys, their agents' heartbeats, the notifications
parked at them, and the operator commands that reach their agents."""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from notifications.clock import database_now
from notifications.models import AcknowledgedVia, Notification
from sites.models import (
    Site,
    SiteAPIKey,
    SiteCommand,
    SiteHeartbeat,
    SiteKeyRefusal,
    SiteParkedNotification,
    StaffAPIKey,
    WatchdogAlert,
)

Parked = SiteParkedNotification.State


class SiteKeyError(Exception):
    """A key operation that cannot be done; the message says why."""


def site_key_issue(*, site: Site, name: str = "", expiry_date: datetime | None = None) -> tuple[SiteAPIKey, str]:
    """Create a new key for ``site``; returns ``(api_key, plaintext)``. The plaintext is shown
    once and never stored; existing keys stay valid (rotation)."""
    api_key, plaintext = SiteAPIKey.objects.create_key(
        site=site, name=name or f"{site.site_id} key", expiry_date=expiry_date
    )
    return cast(SiteAPIKey, api_key), plaintext


@transaction.atomic
def site_key_revoke(*, prefix: str) -> SiteAPIKey:
    """Revoke the key whose prefix is ``prefix``; returns it. Revocation cannot be undone."""
    api_key = SiteAPIKey.objects.select_for_update().filter(prefix=prefix).select_related("site").first()
    if api_key is None:
        raise SiteKeyError(f"No API key with prefix {prefix!r}.")
    if not api_key.revoked:
        api_key.revoked = True
        api_key.save(update_fields=["revoked"])
    return api_key


def site_key_refusal_record(*, prefix: str, reason: str, client: str) -> SiteKeyRefusal | None:
    """Count one refused request that carried the key whose prefix is ``prefix`` (a
    :class:`SiteKeyRefusal.Reason`: revoked, expired, wrong secret or site deactivated) from
    ``client``, for that key's site; returns the count's row, or None when the prefix is no
    site's key (nothing to show on a site's page; such guesses are only rate-limited)."""
    site_id = SiteAPIKey.objects.filter(prefix=prefix).values_list("site_id", flat=True).first()
    if site_id is None:
        return None
    now = timezone.now()
    changes = {"reason": reason, "last_at": now, "last_client": client[:64]}
    for _ in range(2):  # a concurrent first refusal may create the row between our two statements
        if SiteKeyRefusal.objects.filter(prefix=prefix).update(count=F("count") + 1, **changes):
            return SiteKeyRefusal.objects.filter(prefix=prefix).first()
        try:
            with transaction.atomic():
                return SiteKeyRefusal.objects.create(site_id=site_id, prefix=prefix, count=1, first_at=now, **changes)
        except IntegrityError:
            continue
    return None


def site_get(*, site_id: str) -> Site:
    """The site whose site_id is ``site_id``; SiteKeyError naming it if there is none."""
    site = Site.objects.filter(site_id=site_id).first()
    if site is None:
        raise SiteKeyError(f"No site with site_id {site_id!r}. Create it in the admin or with outbox_config import.")
    return site


# --- staff keys -------------------------------------------------------------------------------

STAFF_KEY_DEFAULT_DAYS = 90


class StaffKeyError(Exception):
    """A staff key operation that cannot be done; the message says why."""


def staff_key_issue(*, user: User, name: str, expiry_date: datetime) -> tuple[StaffAPIKey, str]:
    """Issue a key of the staff API to ``user``; returns ``(staff_key, plaintext)``. The
    plaintext is shown once and never stored. StaffKeyError when ``user`` is not an active staff
    user, the name is blank or the expiry is not in the future."""
    if not user.is_active or not user.is_staff:
        raise StaffKeyError(f"User {user.get_username()!r} is not an active staff user; staff keys are for staff only.")
    name = name.strip()
    if not name:
        raise StaffKeyError("A staff key needs a name (what uses it, e.g. 'monitoring').")
    limit = StaffAPIKey._meta.get_field("name").max_length
    if limit is not None and len(name) > limit:
        raise StaffKeyError(f"The key name can be at most {limit} characters long.")
    if expiry_date <= timezone.now():
        raise StaffKeyError("The expiry must be in the future; a key that expired at once would be useless.")
    staff_key, plaintext = StaffAPIKey.objects.create_key(user=user, name=name, expiry_date=expiry_date)
    return cast(StaffAPIKey, staff_key), plaintext


@transaction.atomic
def staff_key_revoke(*, prefix: str) -> StaffAPIKey:
    """Revoke the staff key whose prefix is ``prefix``; returns it. Revocation cannot be undone."""
    staff_key = StaffAPIKey.objects.select_for_update().filter(prefix=prefix).select_related("user").first()
    if staff_key is None:
        raise StaffKeyError(f"No staff key with prefix {prefix!r}.")
    if not staff_key.revoked:
        staff_key.revoked = True
        staff_key.save(update_fields=["revoked"])
    return staff_key


def staff_key_verify(*, key: str) -> StaffAPIKey | None:
    """The unrevoked staff key (with its user) that ``key`` is, or None. Expiry and the user's
    state are for the caller to check. A key is ``prefix.secret``; a token carried over from the
    former plaintext tokens has no dot, and its first 8 characters are its prefix."""
    prefix = key.partition(".")[0] if "." in key else key[:8]
    staff_key = StaffAPIKey.objects.get_usable_keys().filter(prefix=prefix).first()
    if staff_key is None or not staff_key.is_valid(key):
        return None
    return cast(StaffAPIKey, staff_key)


def staff_key_touch_last_used(*, staff_key: StaffAPIKey) -> None:
    """Record that ``staff_key`` authenticated a request now, at most once a minute (one UPDATE)."""
    now = timezone.now()
    if staff_key.last_used_at is None or now - staff_key.last_used_at >= timedelta(seconds=60):
        StaffAPIKey.objects.filter(pk=staff_key.pk).update(last_used_at=now)
        staff_key.last_used_at = now


# --- heartbeats ---------------------------------------------------------------------------------


def site_is_silent(*, last_heartbeat_at: datetime | None, now: datetime) -> bool:
    """True when a site's agent, which has sent heartbeats, has sent none for
    OUTBOX_SITE_SILENT_AFTER seconds. A site whose agent never sent one (``last_heartbeat_at``
    None: a site that posts directly, or one not heard from yet) is never silent: nothing
    promised heartbeats."""
    if last_heartbeat_at is None:
        return False
    return now - last_heartbeat_at > timedelta(seconds=settings.OUTBOX_SITE_SILENT_AFTER)


# The heartbeat capability of an agent that stores acknowledgements made at central.
ACKNOWLEDGED_CAPABILITY = "acknowledged"
# How long an acknowledgement made at central is offered to its site; one the agent has not
# taken by then is expired (the alarm is a day old: the plant has moved on).
ACKNOWLEDGEMENT_OFFERED_FOR = timedelta(hours=24)
# Commands per lane in one heartbeat answer: operator commands, then acknowledgements.
COMMANDS_PER_LANE = 100
# How long an acknowledged command is kept (the console's history) after it stopped being
# offered; it can never be offered again by then, its acknowledgement being far older than a day.
ACKNOWLEDGED_COMMANDS_KEPT = timedelta(days=30)


def site_heartbeat_record(*, site: Site, report: dict[str, Any]) -> list[SiteCommand]:
    """Store ``report`` (agent_version, buffered, parked, oldest_buffered_at, last_forward_at,
    last_error; from newer agents capabilities, server_errors and fallback) as the site's
    latest heartbeat; returns the commands the agent is to execute (they stay pending until it
    acknowledges them), in two lanes of up to COMMANDS_PER_LANE each: the operators' Retry and
    Discard commands, oldest first, then — for an agent whose capabilities include
    ``acknowledged`` — the acknowledgements made at central (site_acknowledgements_pending).
    The lanes are counted apart, so acknowledgements never delay or displace an operator's
    command."""
    now = database_now()
    SiteHeartbeat.objects.update_or_create(
        site=site,
        defaults={
            "received_at": now,
            "agent_version": report.get("agent_version") or "",
            "buffered": report.get("buffered") or 0,
            "parked": report.get("parked") or 0,
            "oldest_buffered_at": report.get("oldest_buffered_at"),
            "last_forward_at": report.get("last_forward_at"),
            "last_error": report.get("last_error") or "",
            "capabilities": list(report.get("capabilities") or []),
            "server_errors": _json_ready(report.get("server_errors")),
            "fallback": _json_ready(report.get("fallback")),
        },
    )
    pending = list(
        SiteCommand.objects.filter(
            site=site, state=SiteCommand.State.PENDING, action__in=SiteCommand.OPERATOR_ACTIONS
        ).order_by("created_at")[:COMMANDS_PER_LANE]
    )
    if ACKNOWLEDGED_CAPABILITY in (report.get("capabilities") or []):
        pending += site_acknowledgements_pending(site=site, now=now)
    if pending:
        SiteCommand.objects.filter(pk__in=[command.pk for command in pending]).update(sent_at=now)
    return pending


def site_acknowledgements_pending(*, site: Site, now: datetime) -> list[SiteCommand]:
    """The ``acknowledged`` commands to hand to ``site``'s agent at ``now``, oldest
    acknowledgement first, at most COMMANDS_PER_LANE.

    One command per notification the site raised (not an escalation child, not a watchdog's
    notification) that was acknowledged at central — by link, SMS, Teams, the console or the
    staff API; not by the site itself, which knows — within ACKNOWLEDGEMENT_OFFERED_FOR. It is
    created here, at the first heartbeat that can take it, holding the acknowledgement (masked
    for the site when it is handed out: sites.api.command_record), and handed out with every
    heartbeat until the agent acknowledges the command: an answer lost on the way is made good
    by the next heartbeat, and the agent recognises the command's id and stores the
    acknowledgement once. A unique constraint keeps it to one command per notification, so once
    acknowledged by the agent it is never handed out again. Commands still pending
    ACKNOWLEDGEMENT_OFFERED_FOR after the acknowledgement are expired here, and any
    ACKNOWLEDGED_COMMANDS_KEPT after that deleted.

    Why a record per notification and not a cursor (the latest acknowledgement time handed
    out): acknowledgements commit out of time order, so a time cursor could step over one that
    committed late; and a cursor moved when the answer is sent would lose what a lost answer
    carried."""
    Ack = SiteCommand.Action.ACKNOWLEDGED
    SiteCommand.objects.filter(site=site, action=Ack, state=SiteCommand.State.PENDING, expires_at__lte=now).update(
        state=SiteCommand.State.EXPIRED,
        detail="Not taken by the site's agent within 24 hours of the acknowledgement; no longer offered.",
    )
    SiteCommand.objects.filter(site=site, action=Ack, expires_at__lt=now - ACKNOWLEDGED_COMMANDS_KEPT).delete()
    fresh = (
        Notification.objects.filter(
            source_site_id=site.site_id,
            acknowledged_at__gt=now - ACKNOWLEDGEMENT_OFFERED_FOR,
            escalation_of__isnull=True,
        )
        .exclude(acknowledged_via=AcknowledgedVia.SITE)
        .exclude(Exists(SiteCommand.objects.filter(site=site, action=Ack, notification_id=OuterRef("pk"))))
        .exclude(Exists(WatchdogAlert.objects.filter(notification_id=OuterRef("pk"))))
        .order_by("acknowledged_at")
        .values_list("pk", "acknowledged_at", "acknowledged_via", "acknowledged_by", "acknowledged_note")
    )[:COMMANDS_PER_LANE]
    created = []
    for notification_id, acknowledged_at, via, by, note in fresh:
        at = cast(datetime, acknowledged_at)  # never None: the filter compared it
        created.append(
            SiteCommand(
                site=site,
                notification_id=notification_id,
                action=Ack,
                created_at=now,
                expires_at=at + ACKNOWLEDGEMENT_OFFERED_FOR,
                details={
                    "acknowledged_at": at.isoformat().replace("+00:00", "Z"),
                    "acknowledged_via": via,
                    "acknowledged_by": by,
                    "note": note,
                },
            )
        )
    if created:
        # A concurrent heartbeat of the same site may have created some: theirs stand.
        SiteCommand.objects.bulk_create(created, ignore_conflicts=True)
    return list(
        SiteCommand.objects.filter(site=site, action=Ack, state=SiteCommand.State.PENDING, expires_at__gt=now).order_by(
            "expires_at", "created_at"
        )[:COMMANDS_PER_LANE]
    )


def _json_ready(value: Any) -> Any:
    """A heartbeat's nested object as stored (times as ISO-8601 text); None stays None."""
    if not isinstance(value, dict):
        return None
    return {name: item.isoformat() if isinstance(item, datetime) else item for name, item in value.items()}


# --- notifications parked at sites ----------------------------------------------------------------

_TEXT_FIELDS = ("type", "list_name", "subject", "source_instance_id", "source_script")


def _fit(field: str, value: object) -> str:
    """``value`` as text cut to the column's length: a report must never be refused for a
    field the site accepted (an over-long unknown type is a reason rows park)."""
    text = "" if value is None else str(value)
    limit = getattr(SiteParkedNotification._meta.get_field(field), "max_length", None)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


class SiteParkedReportError(Exception):
    """A parked report refused as a whole; ``problems`` maps the position of each offending
    ``parked`` item to what is wrong with it."""

    def __init__(self, problems: dict[int, str]) -> None:
        super().__init__("; ".join(f"parked[{index}]: {problem}" for index, problem in problems.items()))
        self.problems = problems


def site_parked_report(
    *, site: Site, parked: Iterable[dict[str, Any]], unparked: Iterable[dict[str, Any]]
) -> tuple[int, int]:
    """Apply a site's parked report, idempotently by notification id: ``parked`` rows are parked
    at the site now (created, or updated with the new reason); ``unparked`` rows (``outcome``
    retried or discarded) left that state. Returns ``(parked, unparked)`` rows changed.

    A site can report only its own notifications: when central holds a reported id for another
    site, the report is refused as a whole (SiteParkedReportError) and nothing is stored, so
    that no site can place its own row next to another site's notification in the console."""
    parked = list(parked)
    foreign = set(
        Notification.objects.filter(pk__in=[item["notification_id"] for item in parked])
        .exclude(source_site_id=site.site_id)
        .values_list("pk", flat=True)
    )
    if foreign:
        raise SiteParkedReportError(
            {
                index: "Central holds a notification with this id for another site; a site reports only its own."
                for index, item in enumerate(parked)
                if item["notification_id"] in foreign
            }
        )
    now = database_now()
    rows = {}
    for item in parked:
        rows[item["notification_id"]] = SiteParkedNotification(
            site=site,
            notification_id=item["notification_id"],
            **{field: _fit(field, item.get(field)) for field in _TEXT_FIELDS},
            site_enqueued_at=item.get("site_enqueued_at"),
            reason=item.get("reason") or "",
            retry_count=item.get("retry_count") or 0,
            parked_at=item.get("parked_at"),
            state=Parked.PARKED,
            state_changed_at=now,
            reported_at=now,
        )
    with transaction.atomic():
        if rows:
            SiteParkedNotification.objects.bulk_create(
                list(rows.values()),
                update_conflicts=True,
                unique_fields=["site", "notification_id"],
                update_fields=[
                    *_TEXT_FIELDS,
                    "site_enqueued_at",
                    "reason",
                    "retry_count",
                    "parked_at",
                    "state",
                    "state_changed_at",
                    "reported_at",
                ],
            )
        left = 0
        by_outcome: dict[str, list[uuid.UUID]] = {}
        for item in unparked:
            if item["notification_id"] not in rows:
                by_outcome.setdefault(item["outcome"], []).append(item["notification_id"])
        for outcome, ids in by_outcome.items():
            left += SiteParkedNotification.objects.filter(
                site=site, notification_id__in=ids, state=Parked.PARKED
            ).update(state=outcome, state_changed_at=now, reported_at=now)
    return len(rows), left


# --- operator commands --------------------------------------------------------------------------


class SiteCommandError(Exception):
    """An operator command that cannot be issued; the message says why."""


@dataclass(frozen=True)
class IssueOutcome:
    """``command`` issued (or the identical one already pending); ``error`` says why not."""

    parked: SiteParkedNotification
    command: SiteCommand | None
    error: str = ""


def site_commands_issue(
    *, parked_ids: Iterable[int], action: str, user: User | None, reason: str = ""
) -> list[IssueOutcome]:
    """Issue ``action`` (retry or discard) for each site-parked row in ``parked_ids``; the
    site's agent executes it on its next heartbeat. Only rows still parked at their site get a
    command; a row with the same action already pending keeps that one (idempotent); a row
    with the other action pending is refused. Discard needs a non-blank ``reason``. Every
    issued command gets an admin history entry naming ``user``. One outcome per row found."""
    if action not in SiteCommand.OPERATOR_ACTIONS:
        raise SiteCommandError(f"Unknown action {action!r}; use retry or discard.")
    reason = reason.strip()
    if action == SiteCommand.Action.DISCARD and not reason:
        raise SiteCommandError("A discard needs a reason (it is recorded with the command).")
    outcomes = []
    with transaction.atomic():
        rows = list(
            SiteParkedNotification.objects.select_for_update().filter(pk__in=list(parked_ids)).select_related("site")
        )
        pending = {
            (command.site_id, command.notification_id): command
            for command in SiteCommand.objects.filter(
                state=SiteCommand.State.PENDING,
                action__in=SiteCommand.OPERATOR_ACTIONS,
                site_id__in={row.site_id for row in rows},
                notification_id__in=[row.notification_id for row in rows],
            )
        }
        issued = []
        for row in rows:
            existing = pending.get((row.site_id, row.notification_id))
            if row.state != Parked.PARKED:
                outcomes.append(IssueOutcome(row, None, f"no longer parked at the site ({row.get_state_display()})"))
            elif existing is not None and existing.action == action:
                outcomes.append(IssueOutcome(row, existing))
            elif existing is not None:
                outcomes.append(IssueOutcome(row, None, f"a {existing.get_action_display()} is already pending"))
            else:
                command = SiteCommand.objects.create(
                    site=row.site,
                    notification_id=row.notification_id,
                    action=action,
                    reason=reason,
                    created_by=user if user is not None and user.pk else None,
                )
                outcomes.append(IssueOutcome(row, command))
                issued.append(row)
        if issued and user is not None and user.pk:
            message = f"{action.capitalize()} sent to the site's agent" + (f"; reason: {reason}" if reason else "")
            LogEntry.objects.log_actions(
                user_id=user.pk, queryset=issued, action_flag=CHANGE, change_message=message[:2000]
            )
    return outcomes


def site_command_acknowledge(*, site: Site, command_id: uuid.UUID, result: str, detail: str) -> SiteCommand | None:
    """Record the agent's result (done or failed) of one of ``site``'s commands; the first
    result wins, so a repeated acknowledgement changes nothing. A done Retry or Discard also
    moves its row out of the parked state (the agent's own report says the same). An
    ``acknowledged`` command expired while its result was on the way takes the result (the
    site has the acknowledgement after all). None when ``site`` has no such command."""
    with transaction.atomic():
        command = SiteCommand.objects.select_for_update().filter(pk=command_id, site=site).first()
        if command is None:
            return None
        if command.action == SiteCommand.Action.ACKNOWLEDGED:
            if command.state in (SiteCommand.State.PENDING, SiteCommand.State.EXPIRED):
                command.state = result
                command.detail = detail
                command.acknowledged_at = database_now()
                command.save(update_fields=["state", "detail", "acknowledged_at"])
            return command
        if command.state == SiteCommand.State.PENDING:
            now = database_now()
            command.state = result
            command.detail = detail
            command.acknowledged_at = now
            command.save(update_fields=["state", "detail", "acknowledged_at"])
            if result == SiteCommand.State.DONE:
                outcome = Parked.RETRIED if command.action == SiteCommand.Action.RETRY else Parked.DISCARDED
                SiteParkedNotification.objects.filter(
                    site=site, notification_id=command.notification_id, state=Parked.PARKED
                ).update(state=outcome, state_changed_at=now)
    return command


# --- site figures for the KPIs ------------------------------------------------------------------


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def sites_kpis() -> dict[str, dict[str, Any]]:
    """For every active site: ``site_backlog`` (rows its agent holds for central),
    ``parked_at_site``, ``silent`` and ``last_heartbeat_at`` (ISO, None if never), from the
    latest heartbeats; ``direct`` (its agent never sent a heartbeat: it posts directly, and is
    never silent) and ``last_seen_at`` (its last authenticated request, ISO, None if never).
    The backlog and parked figures are None for a site whose agent was never heard from."""
    now = database_now()
    figures = {}
    for site_id, received_at, buffered, parked, last_seen_at in Site.objects.filter(active=True).values_list(
        "site_id", "heartbeat__received_at", "heartbeat__buffered", "heartbeat__parked", "last_seen_at"
    ):
        figures[site_id] = {
            "site_backlog": buffered,
            "parked_at_site": parked,
            "silent": site_is_silent(last_heartbeat_at=received_at, now=now),
            "last_heartbeat_at": _iso_or_none(received_at),
            "direct": received_at is None,
            "last_seen_at": _iso_or_none(last_seen_at),
        }
    return figures


def site_kpis_add(kpis: dict[str, Any]) -> dict[str, Any]:
    """``kpis`` (notifications.kpis.kpis_compute's answer) with every active site's figures
    (see sites_kpis) added to its per-site entry (created, with zero notification figures, for
    a site that has none), and ``site_backlog``, ``parked_at_site`` and ``silent_sites`` added
    to the global figures."""
    from notifications.kpis import COUNTS

    per_site = kpis["per_site"]
    totals = {"site_backlog": 0, "parked_at_site": 0, "silent_sites": 0}
    for site_id, figures in sites_kpis().items():
        entry = per_site.setdefault(site_id, {**dict.fromkeys(COUNTS, 0), "oldest_pending_age_seconds": None})
        entry.update(figures)
        totals["site_backlog"] += figures["site_backlog"] or 0
        totals["parked_at_site"] += figures["parked_at_site"] or 0
        totals["silent_sites"] += int(figures["silent"])
    kpis["per_site"] = dict(sorted(per_site.items()))
    kpis["global"].update(totals)
    return kpis
