"""The outbox page's read models beyond the list: Parked rows grouped by cause, and the
progress of one bulk Retry (a redrive). Both read small slices through indexes made for them
(migration 0012_console_outbox), never the delivered history.

A *cause* is the first ``db.CAUSE_LENGTH`` characters of a Parked row's last error: rows that
failed the same way share it. Rows whose failure has a stable code (``failure_code``) are
recognised by the code, never by the wording of their error.
"""

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, F, Max, Min, Q, QuerySet
from django.db.models.lookups import Exact, GreaterThan, LessThanOrEqual

from notifications import db
from notifications.list_names import notification_lists_by_name
from notifications.models import Notification
from notifications.vocabulary import FailureCode, TargetOutcome, target_outcome

Status = Notification.Status

# Distinct (cause, list, site) combinations read at most; beyond, the view says it is partial.
GROUP_ROWS_MAX = 5000


@dataclass
class ParkedGroup:
    """The Parked rows sharing one cause."""

    cause: str
    count: int = 0
    sites: dict[str, int] = field(default_factory=dict)
    lists: dict[str, int] = field(default_factory=dict)
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    # Lists this group's rows name that are not configured (a "create the list" link each).
    missing_lists: list[str] = field(default_factory=list)
    # The cause says "unknown list X" and X is configured now: Retry should deliver them.
    list_now_exists: str | None = None
    # Of count, the rows some recipients already have: a partial delivery, not an outage.
    partially_delivered: int = 0

    @property
    def key(self) -> str:
        """A short stable handle of the cause (for element ids and links)."""
        return cause_key(self.cause)


# The generic start the dispatcher gives an error ("Permanent failure (recipient_rejected): …"):
# the table shows the class and what follows, the part that differs from row to row.
_GENERIC_START = re.compile(
    r"^(?:Permanent failure|Channel failure|Transient failure|Retries exhausted|Outcome unknown)"
    r" \((?P<detail>[^)]*)\): (?P<rest>.*)$",
    re.DOTALL,
)


def error_specific(text: str) -> str:
    """``text`` (a row's last error) with its generic start reduced to the failure class:
    "Channel failure (connection; retried until the channel recovers): [Errno 111] refused"
    → "connection: [Errno 111] refused". Other errors come back as they are."""
    match = _GENERIC_START.match(text)
    if match is None:
        return text
    detail = match["detail"].split(";")[0].split(",")[0].strip()
    if detail.endswith("failed attempts") or detail.isdigit():
        detail = "retries exhausted"
    return f"{detail}: {match['rest']}"


def cause_key(cause: str) -> str:
    return hashlib.sha256(cause.encode()).hexdigest()[:12]


def _indexed(short: bool) -> Any:
    """The condition of the cause index (short errors) or of the long-error index."""
    length = db.OctetLength(F("last_error"))
    return LessThanOrEqual(length, db.CAUSE_INDEXED_BYTES) if short else GreaterThan(length, db.CAUSE_INDEXED_BYTES)


def cause_q(cause: str) -> Q:
    """Parked rows whose cause is ``cause``. A cause shorter than CAUSE_LENGTH is a whole error:
    compared with the last error itself, which the cause index answers on PostgreSQL."""
    if len(cause) < db.CAUSE_LENGTH:
        condition = Q(status=Status.PARKED, last_error=cause)
        if connection.vendor == "postgresql" and len(cause.encode()) <= db.CAUSE_INDEXED_BYTES:
            condition &= Q(_indexed(short=True))
        return condition
    return Q(status=Status.PARKED) & Q(Exact(db.ParkedCause(), cause))


def parked_cause_rows(cause: str) -> QuerySet[Notification]:
    """The Parked rows whose cause is ``cause``."""
    return Notification.objects.filter(cause_q(cause))


def parked_groups() -> tuple[list[ParkedGroup], bool]:
    """Parked rows grouped by cause, largest group first, and whether the grouping is partial
    (more than GROUP_ROWS_MAX cause/list/site combinations). On PostgreSQL two statements, for
    the errors the cause index holds (an index-only scan) and the rare longer ones."""
    parked = Notification.objects.filter(status=Status.PARKED)
    parts = [parked.filter(_indexed(short=True)), parked.filter(_indexed(short=False))]
    if connection.vendor != "postgresql":
        parts = [parked]
    combos = [
        combo
        for part in parts
        for combo in part.annotate(cause=db.ParkedCause())
        .values("cause", "list_name", "source_site_id")
        .annotate(count=Count("created_at"), first=Min("created_at"), last=Max("created_at"))
        .order_by()[: GROUP_ROWS_MAX + 1]
    ]
    partial = len(combos) > GROUP_ROWS_MAX
    groups: dict[str, ParkedGroup] = {}
    for combo in combos[:GROUP_ROWS_MAX]:
        group = groups.setdefault(combo["cause"], ParkedGroup(cause=combo["cause"]))
        group.count += combo["count"]
        group.sites[combo["source_site_id"]] = group.sites.get(combo["source_site_id"], 0) + combo["count"]
        group.lists[combo["list_name"]] = group.lists.get(combo["list_name"], 0) + combo["count"]
        group.first_seen = _pick(min, group.first_seen, combo["first"])
        group.last_seen = _pick(max, group.last_seen, combo["last"])
    names = {name for group in groups.values() for name in group.lists}
    configured = notification_lists_by_name(names=names)
    ready = {item.cause: item.list_name for item in parked_for_lists_now_existing()}
    partial_counts = parked_partially_delivered()
    for group in groups.values():
        group.partially_delivered = partial_counts.get(group.cause, 0)
        group.missing_lists = sorted(name for name in group.lists if name not in configured)
        group.list_now_exists = ready.get(group.cause)
        group.sites = dict(sorted(group.sites.items(), key=lambda item: (-item[1], item[0])))
        group.lists = dict(sorted(group.lists.items(), key=lambda item: (-item[1], item[0])))
    ordered = sorted(groups.values(), key=lambda group: (-group.count, group.cause))
    return ordered, partial


def parked_partially_delivered() -> dict[str, int]:
    """Per cause, the Parked rows that some of their targets already have ("delivered to 1 of
    3", one mailbox full): a partial delivery, told apart from an outage. PostgreSQL: one
    grouped read of the Parked rows (jsonb containment); elsewhere the rows' targets are read."""
    parked = Notification.objects.filter(status=Status.PARKED).annotate(cause=db.ParkedCause())
    if connection.vendor == "postgresql":
        rows = (
            parked.filter(resolved_targets__contains=[{"outcome": TargetOutcome.DELIVERED.value}])
            .values("cause")
            .annotate(count=Count("created_at"))
            .order_by()[:GROUP_ROWS_MAX]
        )
        return {row["cause"]: row["count"] for row in rows}
    counts: dict[str, int] = {}
    for cause, targets in parked.values_list("cause", "resolved_targets")[: GROUP_ROWS_MAX * 10]:
        entries = targets if isinstance(targets, list) else []
        if any(isinstance(entry, dict) and target_outcome(entry) == TargetOutcome.DELIVERED for entry in entries):
            counts[cause] = counts.get(cause, 0) + 1
    return counts


def _pick(choose: Any, current: datetime | None, new: datetime | None) -> datetime | None:
    values = [value for value in (current, new) if value is not None]
    return choose(values) if values else None


@dataclass(frozen=True)
class RedriveProgress:
    """Where the rows of one bulk Retry (sharing its ``requeued_at``) are now."""

    at: datetime
    waiting: int  # Pending or Retrying
    delivered: int
    parked: int
    discarded: int

    @property
    def total(self) -> int:
        return self.waiting + self.delivered + self.parked + self.discarded

    @property
    def finished(self) -> int:
        return self.total - self.waiting

    @property
    def done(self) -> bool:
        return self.total > 0 and self.waiting == 0


def redrive_progress(at: datetime) -> RedriveProgress:
    """The counts by status of the rows retried or requeued at ``at`` (one action's instant:
    every row one Retry changes gets the same ``requeued_at``), from the requeued_at index."""
    counts = dict(
        Notification.objects.filter(requeued_at=at)
        .values("status")
        .annotate(count=Count("requeued_at"))
        .order_by()
        .values_list("status", "count")
    )
    return RedriveProgress(
        at=at,
        waiting=counts.get(Status.PENDING, 0) + counts.get(Status.RETRYING, 0),
        delivered=counts.get(Status.DELIVERED, 0),
        parked=counts.get(Status.PARKED, 0),
        discarded=counts.get(Status.DISCARDED, 0),
    )


def retried_at(ids: list[Any]) -> datetime | None:
    """The instant of the Retry (or Requeue) that just changed some of ``ids``: their latest
    ``requeued_at``."""
    found = Notification.objects.filter(pk__in=ids, requeued_at__isnull=False).aggregate(at=Max("requeued_at"))
    return found["at"]


@dataclass(frozen=True)
class ListNowExists:
    """Parked rows that failed because their list did not exist, which it does now."""

    list_name: str
    cause: str
    count: int


def parked_for_lists_now_existing() -> list[ListNowExists]:
    """The Parked rows that failed because their list did not exist (failure code
    ``unknown_list``, whatever the wording of their error) and whose list is configured now,
    by list and cause, with their counts: the outbox page offers to retry them. Reads the
    small index of coded Parked rows (notif_parked_code_idx)."""
    parked = Notification.objects.filter(status=Status.PARKED, failure_code=FailureCode.UNKNOWN_LIST)
    counts = list(
        parked.values("list_name", "last_error").annotate(count=Count("created_at")).order_by()[:GROUP_ROWS_MAX]
    )
    existing = notification_lists_by_name(names={row["list_name"] for row in counts})
    return sorted(
        (
            ListNowExists(list_name=row["list_name"], cause=row["last_error"], count=row["count"])
            for row in counts
            if row["list_name"] in existing and len(row["last_error"]) < db.CAUSE_LENGTH
        ),
        key=lambda item: (-item.count, item.list_name),
    )


@dataclass(frozen=True)
class WaitingBreakdown:
    """The rows waiting (Pending or Retrying) on one channel, by site and by list, largest
    first; ``partial``: more than GROUP_ROWS_MAX site/list combinations, the rest not read."""

    channel: str
    total: int
    sites: list[tuple[str, int]]
    lists: list[tuple[str, int]]
    partial: bool


def waiting_breakdown(*, channel: str) -> WaitingBreakdown:
    """Where an open channel hits: its waiting rows counted by site and list, from the claim
    index (notif_claim_idx: the open rows by site, priority and channel, the list included)."""
    combos = list(
        Notification.objects.filter(status__in=Notification.NON_TERMINAL, type=channel)
        .values("source_site_id", "list_name")
        .annotate(count=Count("created_at"))
        .order_by()[: GROUP_ROWS_MAX + 1]
    )
    partial = len(combos) > GROUP_ROWS_MAX
    sites: dict[str, int] = {}
    lists: dict[str, int] = {}
    for combo in combos[:GROUP_ROWS_MAX]:
        sites[combo["source_site_id"]] = sites.get(combo["source_site_id"], 0) + combo["count"]
        lists[combo["list_name"]] = lists.get(combo["list_name"], 0) + combo["count"]

    def largest(counts: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))

    return WaitingBreakdown(
        channel=channel, total=sum(sites.values()), sites=largest(sites), lists=largest(lists), partial=partial
    )


# "Matches by site and list" counts at most this many of the matches ("10,000+" beyond), within
# MATCHES_BUDGET_MS; a count cancelled there falls back to the rows the page shows, already read.
# (The newest 10,000 of a million rows, grouped by the database: under 20 ms; read into
# Python one by one they cost 44 ms. A search whose plan reads and sorts all its 100,000 matches
# of ten million takes 1.5 s for any number of them: that is what the budget stops.)
MATCHES_COUNT_MAX = 10_000
MATCHES_BUDGET_MS = 100
MATCHES_BUDGET_MIN_MS = 10  # less is not worth a statement


@dataclass(frozen=True)
class Matches:
    """The rows the outbox page's filters and search match, counted by site and by list;
    ``capped``: more than ``total`` match and the counts are of the newest ``total``;
    ``page_only``: counting them took too long, the counts are of the rows the page shows."""

    total: int
    capped: bool
    sites: list[tuple[str, int]]
    lists: list[tuple[str, int]]
    page_only: bool = False


def matches_by_site_and_list(
    queryset: QuerySet[Notification],
    *,
    shown: Sequence[Notification] | None = None,
    budget_ms: int = MATCHES_BUDGET_MS,
) -> Matches:
    """Counts by site and by list of ``queryset`` (the page's filtered and searched rows, in
    its order), grouped by the database over at most MATCHES_COUNT_MAX + 1 of them read
    through the index the page's order uses (notif_created_idx for the default newest first,
    or the index the filters' own plan takes), within ``budget_ms``: a bounded cost whatever
    the filters match. Beyond the budget (or with none: the page knows that reading its
    matches costs more than it can spend), the counts of ``shown`` (the page's rows)."""
    limit = MATCHES_COUNT_MAX
    newest = queryset.values_list("source_site_id", "list_name")
    # One row more than counted is read, to know whether there are more.
    counted = (
        db.run_within(
            lambda: db.grouped_counts(newest[: limit + 1], columns=["source_site_id", "list_name"], first=limit),
            budget_ms,
        )
        if budget_ms >= MATCHES_BUDGET_MIN_MS
        else None
    )
    page_only = counted is None
    if counted is None:
        combos: dict[tuple[Any, ...], int] = {}
        for row in shown or []:
            key = (row.source_site_id, row.list_name)
            combos[key] = combos.get(key, 0) + 1
        read = sum(combos.values())
        capped = True
    else:
        combos, read = counted
        capped = read > limit
    sites: dict[str, int] = {}
    lists: dict[str, int] = {}
    for (site, list_name), count in combos.items():
        sites[site] = sites.get(site, 0) + count
        lists[list_name] = lists.get(list_name, 0) + count

    def largest(counts: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:10]

    return Matches(
        total=min(read, limit), capped=capped, sites=largest(sites), lists=largest(lists), page_only=page_only
    )
