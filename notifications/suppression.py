"""Suppression (docs/suppression.md): which notifications are never sent on their own, decided
when central ingests them, and the flood digests that replace held ones.

- **Silences** and **maintenance windows**: a notification matching an active one when it is
  ingested is stored ``Suppressed`` (``silence:<id>``; a maintenance window: ``silence:mw<id>``).
  ``high`` and ``critical`` ones only when the silence includes them.
- **Duplicates**: a list's ``dedup_window_seconds``. A notification with a ``dedup_key`` whose
  *anchor* — the last notification of the same site, list and key that was not itself
  suppressed — was created less than the window ago and is neither acknowledged nor cleared is
  stored ``Suppressed`` (``duplicate:<anchor id>``) unless its priority is higher than the
  anchor's; the anchor counts it (``occurrences``, ``last_occurrence_at``).
- **Floods**: a list's ``flood_threshold`` per ``flood_window_seconds``, per site and channel.
  Beyond the threshold, non-critical notifications are stored ``Pending`` but *held*
  (``held_for_digest`` = the window's end; the dispatcher never claims them). At the window's
  end :func:`digests_flush` makes one digest notification of them and turns them ``Suppressed``
  (``digest:<digest id>``) in the same transaction.

Checks run in that order: a silenced notification is neither a duplicate nor counted in a
flood; a duplicate is not counted in a flood. Decisions that depend on earlier rows (duplicates,
floods) are taken under a transaction-level lock of the site and list (PostgreSQL: an advisory
lock; SQLite: its IMMEDIATE transactions serialise writers), in the transaction that inserts
the rows, so two concurrent ingests of one key neither lose a count nor both become anchors.
On PostgreSQL the commonest case — one notification with a key, to a list without a flood
threshold — is decided in the statement that inserts it (:func:`row_duplicate_insert`), holding
the list's lock shared and its key's alone.
"""

import hashlib
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models import BooleanField, Count, F, Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from notifications import db
from notifications.acknowledgement import ListSettings, asks_ack
from notifications.counts import alarm_counts, counts_fold, counts_kept
from notifications.db import database_now
from notifications.escalation import escalation_first_after, notifications_escalation_start
from notifications.list_names import notification_lists_by_name
from notifications.models import FloodWindow, MaintenanceWindow, Notification, NotificationList, Silence
from notifications.trigger import dispatch_request

Status = Notification.Status
Priority = Notification.Priority

# Active silences, maintenance windows and the lists' settings are read at most this often per
# process (ingest would otherwise pay three queries per request; docs/performance.md). A change
# made in the console reaches the process that made it at once (suppression_rules_forget) and
# the others within this time.
RULES_TTL_SECONDS = 1.0
DIGEST_LINES = 50  # the held notifications listed one by one in a digest's body


def notifications_released_escalation_start(*, notification_ids: list[Any], released_at: datetime) -> None:
    """Called in the transaction that releases notifications (Deliver anyway): a released row's
    escalation counts from its release, not from its creation (a suppressed row never
    escalated)."""
    rows = list(
        Notification.objects.filter(pk__in=notification_ids, escalation_of__isnull=True).only(
            "notification_id", "priority", "list_name"
        )
    )
    lists = _lists_settings(names={row.list_name for row in rows})
    starting = {}
    for row in rows:
        after = escalation_first_after(priority=row.priority, list_settings=lists.get(row.list_name))
        if after:
            starting[row.pk] = (released_at, after)
    notifications_escalation_start(created=starting)


def _lists_settings(*, names: set[str]) -> dict[str, ListSettings]:
    """The acknowledgement and escalation settings of the lists ``names`` refer to, read now (a
    release or a digest is rare; ingest reads them through acknowledgement.list_settings_by_key)."""
    return {
        name: ListSettings(found.ack_required_from, found.escalation, found.repeat_last_every_seconds)
        for name, found in notification_lists_by_name(names=names).items()
    }


# --- the rules, cached briefly ------------------------------------------------------------------


@dataclass(frozen=True)
class ListRules:
    dedup_window_seconds: int
    flood_threshold: int
    flood_window_seconds: int


@dataclass
class _Rules:
    read_at: float = -1e9
    silences: list[Silence] = field(default_factory=list)
    windows: list[MaintenanceWindow] = field(default_factory=list)
    lists: dict[str, ListRules] = field(default_factory=dict)


_rules = _Rules()


def suppression_rules_forget(**kwargs: Any) -> None:
    """Drop this process's cached rules (a silence, window or list was saved or deleted)."""
    global _rules
    _rules = _Rules()


def _rules_now(now: datetime) -> _Rules:
    global _rules
    if time.monotonic() - _rules.read_at < RULES_TTL_SECONDS:
        return _rules
    # Silences that end within the cache's lifetime are read too; each is judged at ingest time.
    fresh = _Rules(
        read_at=time.monotonic(),
        silences=list(Silence.objects.filter(ends_at__gt=now, starts_at__lte=now + timedelta(minutes=5))),
        windows=list(MaintenanceWindow.objects.all()),
        lists={
            row.name.casefold(): ListRules(row.dedup_window_seconds, row.flood_threshold, row.flood_window_seconds)
            for row in NotificationList.objects.filter(Q(dedup_window_seconds__gt=0) | Q(flood_threshold__gt=0)).only(
                "name", "dedup_window_seconds", "flood_threshold", "flood_window_seconds"
            )
        },
    )
    _rules = fresh
    return fresh


# --- silences and maintenance windows -----------------------------------------------------------


def _priority_included(priority: int, *, include_high: bool, include_critical: bool) -> bool:
    if priority == Priority.CRITICAL:
        return include_critical
    if priority == Priority.HIGH:
        return include_high
    return True


def silence_matches(silence: Silence, row: dict[str, Any], *, now: datetime) -> bool:
    """Whether ``silence`` is active at ``now`` and matches the notification ``row``."""
    if not (silence.starts_at <= now < silence.ends_at):
        return False
    if silence.site and silence.site != row["source_site_id"]:
        return False
    if silence.list_name and silence.list_name.casefold() != row["list_name"].casefold():
        return False
    if silence.source_instance_id and silence.source_instance_id != row["source_instance_id"]:
        return False
    if silence.subject_contains and silence.subject_contains.casefold() not in row["subject"].casefold():
        return False
    return _priority_included(
        row["priority"], include_high=silence.include_high, include_critical=silence.include_critical
    )


def maintenance_window_covers(window: MaintenanceWindow, moment: datetime) -> bool:
    """Whether the weekly ``window`` covers ``moment`` (aware): judged on the wall clock of the
    window's time zone, so it keeps its local hours across daylight-saving changes. A window
    whose end is not after its start crosses midnight and belongs to the day it starts on."""
    try:
        zone = ZoneInfo(window.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    local = moment.astimezone(zone)
    days = {int(day) for day in window.days}
    clock = local.time().replace(tzinfo=None)
    if window.starts < window.ends:
        return local.weekday() in days and window.starts <= clock < window.ends
    if local.weekday() in days and clock >= window.starts:
        return True
    return (local.weekday() - 1) % 7 in days and clock < window.ends


def _silenced_by(row: dict[str, Any], rules: _Rules, now: datetime) -> str:
    for silence in rules.silences:
        if silence_matches(silence, row, now=now):
            return f"silence:{silence.pk}"
    for window in rules.windows:
        if window.site != row["source_site_id"]:
            continue
        included = _priority_included(
            row["priority"], include_high=window.include_high, include_critical=window.include_critical
        )
        if included and maintenance_window_covers(window, now):
            return f"silence:mw{window.pk}"
    return ""


def _suppress(row: dict[str, Any], reason: str) -> None:
    row["status"] = Status.SUPPRESSED
    row["suppressed_by"] = reason
    row["next_attempt_at"] = None


# --- at ingest ------------------------------------------------------------------------------------


def rows_suppression_columns(rows: Sequence[dict[str, Any]]) -> None:
    """Give every row the columns suppression may set (so that all rows of one insert have the
    same columns): Pending, not suppressed, not held."""
    for row in rows:
        row.setdefault("status", Status.PENDING)
        row.setdefault("suppressed_by", "")
        row.setdefault("held_for_digest", None)
        row.setdefault("next_attempt_at", None)


def rows_silence(rows: Sequence[dict[str, Any]], *, now: datetime | None = None) -> None:
    """Mark the rows an active silence or maintenance window covers as Suppressed. A silence's
    edges are judged on this process's clock (default ``now``): it has minute-sized edges set
    by people, and asking the database for the time would cost every ingest a round trip."""
    now = now or timezone.now()
    rules = _rules_now(now)
    if not rules.silences and not rules.windows:
        return
    for row in rows:
        reason = _silenced_by(row, rules, now)
        if reason:
            _suppress(row, reason)


def rows_need_lock(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lists (as given) whose rows need decisions depending on earlier rows: a dedup window
    and a row with a dedup_key, or a flood threshold; only rows not already suppressed count."""
    rules = _rules_now(timezone.now())
    wanted = []
    for row in rows:
        if row["status"] == Status.SUPPRESSED:
            continue
        settings = rules.lists.get(row["list_name"].casefold())
        if settings is None:
            continue
        if settings.flood_threshold or (settings.dedup_window_seconds and row.get("dedup_key")):
            wanted.append(row["list_name"])
    return sorted(set(wanted), key=str.casefold)


def suppression_lock(*, site_id: str, list_name: str) -> datetime:
    """Hold, until the transaction ends, the lock of one site's list: duplicate and flood
    decisions, and digest flushing, for it run one at a time. SQLite's IMMEDIATE transactions
    already run one at a time. Returns the database's time once the lock is held (in the same
    round trip: ingest pays for every one)."""
    if connection.vendor != "postgresql":
        return database_now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement_timestamp() FROM (SELECT pg_advisory_xact_lock(%s, %s)) AS locked",
            [LOCK_CLASS, _lock_key(site_id=site_id, list_name=list_name)],
        )
        return cursor.fetchone()[0]


# The advisory lock of one site's list: (LOCK_CLASS, _lock_key). outbox_duplicate_anchor
# (migration 0037) takes it shared, and the lock of the list's key (class 0x0B0D) alone: the
# transaction that holds the list's lock excludes every one-statement decision of its keys,
# which exclude each other only per key.
LOCK_CLASS = 0x0B0C


def _lock_key(*, site_id: str, list_name: str, dedup_key: str | None = None) -> int:
    """The advisory lock's key of a site's list, or of one of its dedup keys (two keys that
    hash alike share a lock: they only wait for each other)."""
    name = f"outbox-suppression\x00{site_id}\x00{list_name.casefold()}"
    if dedup_key is not None:
        name += f"\x00{dedup_key}"
    return zlib.crc32(name.encode()) - (1 << 31)


@dataclass
class _Anchor:
    notification_id: Any
    created_at: datetime
    priority: int
    open: bool  # neither acknowledged nor cleared
    duplicates: int = 0


# The condition of the index of rows that can be anchors (notif_dedup_anchor_idx), as SQL text:
# SQLite uses a partial index only when the query states its condition literally, and the ORM
# would bind '' as a parameter. (PostgreSQL proves it either way.)
_CAN_BE_ANCHOR = RawSQL("NOT dedup_key = '' AND suppressed_by = ''", (), output_field=BooleanField())


def anchor_candidates(*, site_id: str, list_name: str, dedup_keys: Iterable[str]) -> QuerySet[Notification]:
    """The rows of a site, list and keys that a new duplicate could be anchored to, newest
    first: those that were not suppressed (a row delivered anyway keeps its ``suppressed_by``)."""
    return (
        Notification.objects.filter(
            _CAN_BE_ANCHOR, source_site_id=site_id, list_name=list_name, dedup_key__in=list(dedup_keys)
        )
        .exclude(status=Status.SUPPRESSED)
        .order_by("-created_at")
    )


# Keys looked up in one query (SQLite allows 999 parameters in a statement before 3.32).
_ANCHOR_KEYS_PER_QUERY = 500


def _anchors_find(*, site_id: str, list_name: str, dedup_keys: set[str], since: datetime) -> dict[str, _Anchor | None]:
    """The anchor of each key: its newest candidate created after ``since`` (the start of the
    dedup window; an older one anchors nothing), or None. One query per 500 keys, so that a
    batch of many keys costs a round trip, not one per key; within a window a key has few
    candidates (its anchor, and a row that broke through or followed an acknowledgement)."""
    found: dict[str, _Anchor | None] = dict.fromkeys(dedup_keys)
    keys = sorted(dedup_keys)
    for start in range(0, len(keys), _ANCHOR_KEYS_PER_QUERY):
        candidates = (
            anchor_candidates(
                site_id=site_id, list_name=list_name, dedup_keys=keys[start : start + _ANCHOR_KEYS_PER_QUERY]
            )
            .filter(created_at__gt=since)
            .values_list("dedup_key", "notification_id", "created_at", "priority", "acknowledged_at", "cleared_at")
        )
        for key, notification_id, created_at, priority, acknowledged_at, cleared_at in candidates:
            if found[key] is None:  # newest first: the first one met is the anchor
                found[key] = _Anchor(
                    notification_id=notification_id,
                    created_at=created_at,
                    priority=priority,
                    open=acknowledged_at is None and cleared_at is None,
                )
    return found


class _ListDecisions:
    """Duplicate and flood decisions for the new rows of one site's list, under its lock."""

    def __init__(self, *, site_id: str, rules: ListRules, now: datetime) -> None:
        self.site_id = site_id
        self.rules = rules
        self.now = now
        self.anchors: dict[str, _Anchor | None] = {}  # the current anchor of each key
        self.counting: list[_Anchor] = []  # every anchor a row was counted to (a key's may change)
        self.windows: dict[str, FloodWindow] = {}
        # Per row decided: the anchor it was counted to and the window it was counted in.
        self.counted: dict[Any, tuple[_Anchor | None, FloodWindow | None]] = {}

    def decide(self, rows: Iterable[dict[str, Any]]) -> None:
        """Decide ``rows``, in order (each may be the anchor of those after it); the anchors of
        their keys are looked up together first."""
        rows = [row for row in rows if row["status"] != Status.SUPPRESSED]
        if self.rules.dedup_window_seconds:
            # The keys not seen yet, each looked up under the list's name as its first row spells it.
            spelled: dict[str, str] = {}
            for row in rows:
                if row.get("dedup_key") and row["dedup_key"] not in self.anchors:
                    spelled.setdefault(row["dedup_key"], row["list_name"])
            keys: dict[str, set[str]] = {}
            for key, list_name in spelled.items():
                keys.setdefault(list_name, set()).add(key)
            since = self.now - timedelta(seconds=self.rules.dedup_window_seconds)
            for list_name, dedup_keys in keys.items():
                self.anchors.update(
                    _anchors_find(site_id=self.site_id, list_name=list_name, dedup_keys=dedup_keys, since=since)
                )
        for row in rows:
            self._decide(row)

    def _decide(self, row: dict[str, Any]) -> None:
        if self.rules.dedup_window_seconds and row.get("dedup_key") and self._duplicate(row):
            return
        if self.rules.flood_threshold:
            self._flood_count(row)

    def _duplicate(self, row: dict[str, Any]) -> bool:
        key = row["dedup_key"]
        anchor = self.anchors[key]  # looked up by decide()
        window = timedelta(seconds=self.rules.dedup_window_seconds)
        inside = anchor is not None and anchor.open and anchor.created_at > self.now - window
        if anchor is not None and inside and row["priority"] <= anchor.priority:
            _suppress(row, f"duplicate:{anchor.notification_id}")
            if not anchor.duplicates:
                self.counting.append(anchor)
            anchor.duplicates += 1
            self.counted[row["notification_id"]] = (anchor, None)
            return True
        # Delivered on its own: the anchor of the ones that follow.
        self.anchors[key] = _Anchor(row["notification_id"], self.now, row["priority"], open=True)
        return False

    def _flood_count(self, row: dict[str, Any]) -> None:
        channel = row["type"]
        window = self.windows.get(channel)
        if window is None:
            window = _flood_window(site_id=self.site_id, list_name=row["list_name"], channel=channel, now=self.now)
            self.windows[channel] = window
        if window.ends_at <= self.now:
            window.started_at = self.now
            window.ends_at = self.now + timedelta(seconds=self.rules.flood_window_seconds)
            window.count = 0
        window.count += 1
        self.counted[row["notification_id"]] = (None, window)
        if window.count > self.rules.flood_threshold and row["priority"] != Priority.CRITICAL:
            row["held_for_digest"] = window.ends_at
            # Due when its digest is: it sorts after the rows due now in the claim index.
            row["next_attempt_at"] = window.ends_at

    def save(self, inserted: Iterable[Any]) -> None:
        """Record the decisions of the rows actually inserted: the anchors' occurrences and the
        flood windows' counts (a row not inserted, a replay, is taken back out of them)."""
        inserted = set(inserted)
        for row_id, (anchor, window) in self.counted.items():
            if row_id in inserted:
                continue
            if anchor is not None:
                anchor.duplicates -= 1
            if window is not None:
                window.count -= 1
        for window in self.windows.values():
            window.save()
        # One statement per number of duplicates (a batch of many keys has few distinct ones).
        by_number: dict[int, list[Any]] = {}
        for anchor in self.counting:
            if anchor.duplicates:
                by_number.setdefault(anchor.duplicates, []).append(anchor.notification_id)
        for number, anchor_ids in by_number.items():
            Notification.objects.filter(pk__in=anchor_ids).update(
                occurrences=F("occurrences") + number, last_occurrence_at=self.now
            )


def _flood_window(*, site_id: str, list_name: str, channel: str, now: datetime) -> FloodWindow:
    """The window row of the key, locked (a new one has ended already: the caller starts it)."""
    window, _ = FloodWindow.objects.select_for_update().get_or_create(
        site=site_id, list_name=list_name.casefold(), type=channel, defaults={"started_at": now, "ends_at": now}
    )
    return window


def list_decisions(*, site_id: str, list_name: str, now: datetime) -> _ListDecisions:
    """The decision maker for one site's list; call under :func:`suppression_lock`."""
    rules = _rules_now(now).lists[list_name.casefold()]
    return _ListDecisions(site_id=site_id, rules=rules, now=now)


# --- one notification with a key, in one statement (PostgreSQL) ---------------------------------

# The ingest of one notification with a dedup_key (the commonest keyed request): the decision
# of _ListDecisions._duplicate in one statement instead of a transaction of five round trips
# (the lock, the anchor's lookup, the insert, the count, COMMIT). It is insert_ignoring_conflicts'
# own INSERT, reading its row from outbox_duplicate_decided (migration 0038) instead of the rows
# document itself: the function returns the row as it is to be stored, decided by
# outbox_duplicate_anchor (migration 0037), which takes the list's lock shared and its key's
# alone, then looks the anchor up afresh (the rule is there, in SQL). The row stored calls
# outbox_duplicate_count in its RETURNING, so that only a row stored is counted (a replay stores
# nothing). Why a second way beside the transaction: keyed posts come in floods of one
# chattering alarm, exactly when ingest must keep up; measured in one process, a keyed single
# post ran at 0.41-0.48 x a plain one with the transaction, about 0.9 x with this
# (docs/performance.md, "Suppression's cost"). Tests run every duplicate case both ways.
_DUPLICATE_DECIDED = "outbox_duplicate_decided(%s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s)"
# The columns the decision sets, submitted (null) so that the statement reads them from the row.
_DUPLICATE_COLUMNS = ("status", "suppressed_by", "next_attempt_at", "escalation_due_at", "escalation_step")
# Only a suppressed row (a duplicate) counts on its anchor: the function reads it afresh too.
_DUPLICATE_COUNTED = (f"CASE WHEN status = '{Status.SUPPRESSED}' THEN outbox_duplicate_count(suppressed_by) END",)


def row_duplicate_insert(
    *, site_id: str, row: dict[str, Any], escalate_after: int | None
) -> dict[Any, datetime] | None:
    """Insert one new ``row`` with a ``dedup_key`` to a list with a dedup window and no flood
    threshold, deciding in the same statement, under its key's lock, whether it is a duplicate
    (then it is stored Suppressed, and ``row`` says so) and counting it on its anchor:
    ``{id: ingest time}`` when it was inserted, ``{}`` for a replay. ``escalate_after``: seconds
    to its first escalation step if it is sent. None when it is not for this (not PostgreSQL,
    no key, a flood threshold): the caller decides it in a transaction (:func:`list_decisions`)."""
    if connection.vendor != "postgresql" or row["status"] == Status.SUPPRESSED or not row.get("dedup_key"):
        return None
    rules = _rules_now(timezone.now()).lists.get(row["list_name"].casefold())
    if rules is None or not rules.dedup_window_seconds or rules.flood_threshold:
        return None
    submitted = {**dict.fromkeys(_DUPLICATE_COLUMNS), **row}
    sql, params = db.insert_ignoring_conflicts_sql(
        Notification,
        tuple(submitted),
        stamped=("created_at",),
        stamped_if_null=("site_enqueued_at",),
        rows=_DUPLICATE_DECIDED,
        returning=_DUPLICATE_COUNTED,
    )
    decided = [
        site_id,
        row["list_name"],
        row["dedup_key"],
        row["priority"],
        rules.dedup_window_seconds,
        _lock_key(site_id=site_id, list_name=row["list_name"]),
        _lock_key(site_id=site_id, list_name=row["list_name"], dedup_key=row["dedup_key"]),
        escalate_after,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, db.rows_document([submitted]), *decided])
        stored = cursor.fetchone()
    if stored is None:
        return {}  # a replay: nothing stored, nothing counted
    inserted_id, stamp, anchor_id = stored
    if anchor_id is not None:
        _suppress(row, f"duplicate:{anchor_id}")
    return {inserted_id: stamp}


# --- flood digests ------------------------------------------------------------------------------


def digests_next_due(*, now: datetime | None = None) -> datetime | None:
    """When the next digest is due: the earliest ``held_for_digest`` of a held row, or None.
    (``now``: the signature of the worker's due-time sources; a digest already due is due now.)"""
    due: datetime | None = Notification.objects.filter(held_for_digest__isnull=False, status=Status.PENDING).aggregate(
        due=Min("held_for_digest")
    )["due"]
    return due


def digests_flush(*, now: datetime | None = None) -> list[Any]:
    """Make the digests that are due at ``now``: per site, list, channel and window, one digest
    notification of its held rows, which turn Suppressed (``digest:<digest id>``) in the same
    transaction. Returns the ids of the digests made."""
    now = now or database_now()
    groups = (
        Notification.objects.filter(held_for_digest__isnull=False, held_for_digest__lte=now, status=Status.PENDING)
        .values_list("source_site_id", "list_name", "type", "held_for_digest")
        .distinct()
        .order_by()
    )
    made = []
    for site_id, list_name, channel, due in list(groups):
        assert due is not None  # filtered above
        digest_id = _digest_make(site_id=site_id, list_name=list_name, channel=channel, due=due)
        if digest_id is not None:
            made.append(digest_id)
    return made


def _digest_make(*, site_id: str, list_name: str, channel: str, due: datetime) -> Any:
    with transaction.atomic():
        suppression_lock(site_id=site_id, list_name=list_name)
        held = list(
            Notification.objects.select_for_update()
            .filter(
                source_site_id=site_id, list_name=list_name, type=channel, held_for_digest=due, status=Status.PENDING
            )
            .order_by("created_at")
            .only("notification_id", "priority", "subject", "source_instance_id", "created_at")
        )
        if not held:
            return None
        now = database_now()
        digest = _digest_row(site_id=site_id, list_name=list_name, channel=channel, held=held, now=now)
        # A digest is a notification like any other: it asks for acknowledgement and escalates
        # as its list says for its priority, counted from its creation.
        list_settings = _lists_settings(names={list_name}).get(list_name)
        digest.asks_ack = asks_ack(
            priority=digest.priority, ack_required_from=list_settings.ack_required_from if list_settings else None
        )
        digest.save(force_insert=True)
        after = escalation_first_after(priority=digest.priority, list_settings=list_settings)
        if after:
            notifications_escalation_start(created={digest.pk: (now, after)})
        Notification.objects.filter(pk__in=[row.pk for row in held], status=Status.PENDING).update(
            status=Status.SUPPRESSED,
            suppressed_by=f"digest:{digest.pk}",
            held_for_digest=None,
            next_attempt_at=None,
        )
        transaction.on_commit(dispatch_request)
    return digest.pk


def _digest_row(*, site_id: str, list_name: str, channel: str, held: list[Notification], now: datetime) -> Notification:
    """The digest of ``held``: the highest held priority; a readable body."""
    subject = f"[Digest] {len(held)} notifications from {site_id} to {list_name}"
    body = digest_body(held)
    priority = max(row.priority for row in held)
    fingerprint = hashlib.sha256("\x00".join(("digest", site_id, list_name, channel, body)).encode()).hexdigest()
    return Notification(
        notification_id=uuid.uuid4(),
        type=channel,
        list_name=list_name,
        subject=subject[:255],
        body=body[: Notification.BODY_MAX_LENGTH],
        priority=priority,
        source_site_id=site_id,
        source_instance_id="",
        source_script="flood digest",
        site_enqueued_at=now,
        created_at=now,
        next_attempt_at=now,
        fingerprint=fingerprint,
    )


def digest_body(held: Sequence[Notification]) -> str:
    """Counts by source, the first and last time, and the first line of each (the first
    DIGEST_LINES of them)."""
    by_source: dict[str, int] = {}
    for row in held:
        name = row.source_instance_id or "(no source)"
        by_source[name] = by_source.get(name, 0) + 1
    first, last = held[0].created_at, held[-1].created_at
    lines = [
        f"{len(held)} notifications were held during a flood, from {first:%Y-%m-%d %H:%M:%S} "
        f"to {last:%Y-%m-%d %H:%M:%S} UTC.",
        "",
        "By source:",
        *(f"  {count:>5}  {name}" for name, count in sorted(by_source.items(), key=lambda item: (-item[1], item[0]))),
        "",
        "The notifications:",
    ]
    for row in held[:DIGEST_LINES]:
        priority = Priority(row.priority).label
        lines.append(f"  {row.created_at:%H:%M:%S}  [{priority}] {row.source_instance_id}: {row.subject}")
    if len(held) > DIGEST_LINES:
        lines.append(f"  … and {len(held) - DIGEST_LINES} more (in the console, filtered by this digest).")
    return "\n".join(lines)


# --- silences -------------------------------------------------------------------------------------

SILENCE_MATCHERS = ("site", "list_name", "source_instance_id", "subject_contains")


def silence_problems(
    *, matchers: dict[str, str], starts_at: datetime, ends_at: datetime, reason: str, now: datetime
) -> dict[str, list[str]]:
    """What is wrong with a silence, per field (empty: nothing): at least one matcher, a reason,
    an end after its start and after now, at most OUTBOX_SILENCE_MAX_DAYS long."""
    problems: dict[str, list[str]] = {}
    if not any(matchers.get(name) for name in SILENCE_MATCHERS):
        problems["non_field_errors"] = [
            "Say what to silence: a site, a list, a source or subject text (a silence of everything is refused)."
        ]
    if not reason.strip():
        problems["reason"] = ["A reason is required."]
    longest = timedelta(days=django_settings.OUTBOX_SILENCE_MAX_DAYS)
    if ends_at <= starts_at:
        problems["ends_at"] = ["Must be after the start."]
    elif ends_at <= now:
        problems["ends_at"] = ["Must be in the future."]
    elif ends_at - starts_at > longest:
        problems["ends_at"] = [f"A silence lasts at most {longest.days} days (OUTBOX_SILENCE_MAX_DAYS)."]
    return problems


def silence_end(*, silence: Silence, now: datetime | None = None) -> bool:
    """End ``silence`` now: one that has started keeps its record (rows name it) and ends now;
    one that has not started is deleted. False when it had already ended."""
    now = now or database_now()
    if silence.ends_at <= now:
        return False
    if silence.starts_at >= now:
        silence.delete()
    else:
        silence.ends_at = now
        silence.save(update_fields=["ends_at"])
    return True


def silence_suppressed(silence_id: Any) -> Any:
    """The rows ``silence_id`` suppressed that are still Suppressed (for Deliver anyway)."""
    return Notification.objects.filter(status=Status.SUPPRESSED, suppressed_by=f"silence:{silence_id}")


# --- the flood report ---------------------------------------------------------------------------

ISA_FLOOD_BENCHMARK = 10  # ISA-18.2: more than 10 alarms per operator in 10 minutes is a flood
FLOOD_BUCKET_SECONDS = 600
TOP_SOURCES = 10


def _ten_minute_bucket_sql() -> str:
    """The start of a row's 10-minute interval as SQL: a timestamp on PostgreSQL (``date_bin``,
    as the alarm counts' triggers compute it), seconds since the epoch on SQLite."""
    if connection.vendor == "postgresql":
        return "date_bin('10 minutes', created_at, timestamptz 'epoch')"
    return "(CAST(strftime('%%s', created_at) AS INTEGER) / 600) * 600"


def _epoch_seconds(bucket: datetime | int) -> int:
    return int(bucket.timestamp()) if isinstance(bucket, datetime) else int(bucket)


def _interval_start(moment: datetime) -> datetime:
    """The start of the 10-minute interval ``moment`` falls in (intervals start at the epoch)."""
    return datetime.fromtimestamp(int(moment.timestamp()) // FLOOD_BUCKET_SECONDS * FLOOD_BUCKET_SECONDS, tz=UTC)


def alarms_per_list_counted(start: datetime) -> list[tuple[str, int, int]]:
    """``(list name, interval start in epoch seconds, notifications)`` of the 10-minute intervals
    from ``start`` on, counted from the rows themselves (SQLite; on PostgreSQL the alarm counts
    hold the same figures, notifications.counts)."""
    rows = (
        Notification.objects.filter(created_at__gte=start)
        .annotate(bucket=RawSQL(_ten_minute_bucket_sql(), []))
        .values_list("list_name", "bucket")
        .annotate(n=Count("created_at"))
        .order_by()
    )
    return [(name, _epoch_seconds(bucket), n) for name, bucket, n in rows]


def alarms_per_list(start: datetime) -> list[tuple[str, int, int]]:
    """:func:`alarms_per_list_counted`'s figures, from the alarm counts where the database keeps
    them (PostgreSQL: a day of a million notifications is 144 intervals per list there),
    folded first as the KPIs' readers do (the dispatcher's passes fold them too, when it runs)."""
    if counts_kept():
        counts_fold()
        return [(name, _epoch_seconds(bucket), n) for name, bucket, n in alarm_counts(start)]
    return alarms_per_list_counted(start)


def flood_report(*, now: datetime | None = None) -> dict[str, Any]:
    """Alarms (every notification ingested, suppressed ones included: each was raised) per list
    per 10 minutes over the last 24 hours against the ISA-18.2 benchmark, and the top sources by
    count over 24 hours and 7 days (docs/suppression.md, "Figures"). The periods are whole
    10-minute intervals: from the start of the interval 24 hours (7 days) ago to now."""
    now = now or database_now()
    current = _epoch_seconds(_interval_start(now))
    day_start, week_start = _interval_start(now - timedelta(days=1)), _interval_start(now - timedelta(days=7))
    lists: dict[str, dict[str, Any]] = {}
    for list_name, bucket, n in alarms_per_list(day_start):
        entry = lists.setdefault(
            list_name, {"list_name": list_name, "max_per_10_min": 0, "floods": 0, "last_10_min": 0}
        )
        entry["max_per_10_min"] = max(entry["max_per_10_min"], n)
        entry["floods"] += int(n > ISA_FLOOD_BENCHMARK)
        if bucket == current:
            entry["last_10_min"] = n
    top_day, top_week = _top_sources(day_start=day_start, week_start=week_start)
    return {
        "benchmark_per_10_min": ISA_FLOOD_BENCHMARK,
        "lists_24h": sorted(lists.values(), key=lambda entry: (-entry["max_per_10_min"], entry["list_name"])),
        "top_sources_24h": top_day,
        "top_sources_7d": top_week,
    }


def _top_sources(*, day_start: datetime, week_start: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The top sources by count over the last day and over the last week, from one pass over
    the week's rows (a day's rows are the week's too): each source is counted for both, and
    ranked here."""
    suppressed = Q(status=Status.SUPPRESSED)
    in_day = Q(created_at__gte=day_start)
    rows: Sequence[Mapping[str, Any]] = list(
        Notification.objects.filter(created_at__gte=week_start)
        .values("source_site_id", "source_instance_id")
        .annotate(
            week=Count("created_at"),
            week_suppressed=Count("created_at", filter=suppressed),
            day=Count("created_at", filter=in_day),
            day_suppressed=Count("created_at", filter=suppressed & in_day),
        )
        .order_by()
    )

    def top(window: str) -> list[dict[str, Any]]:
        ranked = sorted(
            (row for row in rows if row[window]),
            key=lambda row: (-row[window], row["source_site_id"], row["source_instance_id"]),
        )
        return [
            {
                "site": row["source_site_id"],
                "source_instance_id": row["source_instance_id"],
                "count": row[window],
                "suppressed": row[f"{window}_suppressed"],
            }
            for row in ranked[:TOP_SOURCES]
        ]

    return top("day"), top("week")
