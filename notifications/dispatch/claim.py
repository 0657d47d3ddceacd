"""Claiming due notifications (docs/architecture.md, "How a notification is delivered").

Due rows are claimed in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
workers never wait for each other) by stamping a lease: ``claimed_by`` and ``claimed_until``.
The transaction commits before any network I/O. A row whose lease has expired is due again, so
a crashed worker's rows are picked up by the next pass — nothing is ever left invisible. On
SQLite there is no ``SKIP LOCKED``; the IMMEDIATE transaction serialises claims instead, which
is correct but meant for one worker.

A channel whose endpoint is open (circuit breaker) or rate-limited is claimed through its
health row (notifications.health): an open endpoint gives no rows, or one probe; a
rate-limited one no more rows than its bucket has tokens. Rows left behind wait, uncharged.

Every claim reads the due index (``notif_due_idx``: non-terminal rows by ``next_attempt_at``,
rows without one first) in its order and stops after ``limit`` rows, so a claim costs about
what it takes whatever the backlog; its transaction turns sorts off
(:func:`~notifications.db.read_in_index_order`, measured need written there).
"""

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Field, Q, QuerySet, TextField, Value, When

from notifications import db
from notifications.clock import database_now
from notifications.health import (
    Channel,
    Gate,
    channel_gate_open,
    channel_gate_settle,
    channel_gate_wait,
    channels_refresh,
    dispatch_channels,
)
from notifications.models import ChannelHealth, Notification
from notifications.policies import delivery_expired_message

# The columns delivery reads from a claimed row. (Channels with per-target outcomes send a retry
# only to the targets still owed it, from ``resolved_targets``; webhooks carry the site id; a
# row the site delivered itself is settled without a delivery, notifications.local_delivery.)
CLAIM_FIELDS = (
    "notification_id",
    "source_site_id",
    "type",
    "list_name",
    "subject",
    "body",
    "type_data",
    "resolved_targets",
    "status",
    "retry_count",
    "channel_failures",
    "created_at",
    "requeued_at",
    "claimed_by",
    "claimed_until",
    "delivered_locally_at",
)
# Oldest due first, as the due index (notif_due_idx) holds the rows: no due time, then by it.
DUE_INDEX_ORDER = F("next_attempt_at").asc(nulls_first=True)


def worker_id_new(prefix: str = "dispatch") -> str:
    """A worker id unique across hosts, processes and passes (fits ``claimed_by``)."""
    return f"{prefix}:{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _unleased_q(now: datetime) -> Q:
    """Not terminal and under no live lease: due once its next attempt time has come."""
    return Q(status__in=Notification.NON_TERMINAL) & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))


def notifications_due_q(now: datetime) -> Q:
    """The rule for "due": not terminal, its next attempt time has come, and no live lease.

    A Pending row with no next attempt time (created by hand) counts as due, never as lost.
    """
    return _unleased_q(now) & (Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True))


def _oldest_due_lock(waiting: QuerySet[Notification], *, now: datetime, limit: int) -> list[Notification]:
    """Lock up to ``limit`` of the ``waiting`` rows that are due at ``now``, oldest due first,
    skipping rows others hold: first those without a next attempt time, then the rest by it.

    Each is one range of the due index read in its order and left as soon as it has given
    enough rows, so a claim reads about as many rows as it takes, whatever the backlog. (One
    query for both, ``next_attempt_at <= now OR next_attempt_at IS NULL``, cannot be an index
    range: PostgreSQL then either filters every waiting row in index order or collects every
    due row and sorts them.) Called in a transaction that reads in index order
    (:func:`~notifications.db.read_in_index_order`): with statistics taken before a backlog
    arrived, PostgreSQL would otherwise read the backlog through another index and sort it.
    """
    undated = waiting.filter(next_attempt_at__isnull=True).order_by(DUE_INDEX_ORDER)
    rows = list(db.lock_skipping_locked(undated).only(*CLAIM_FIELDS)[:limit])
    if len(rows) < limit:
        dated = waiting.filter(next_attempt_at__lte=now).order_by(DUE_INDEX_ORDER)
        rows += db.lock_skipping_locked(dated).only(*CLAIM_FIELDS)[: limit - len(rows)]
    return rows


@dataclass
class Claim:
    """Rows claimed by one claim, oldest due first; ``probes``: the ids of those claimed as
    their channel's probe."""

    rows: list[Notification]
    probes: set[Any] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.rows)


def notifications_claim_due(
    *,
    worker_id: str,
    limit: int,
    now: datetime | None = None,
    lease_seconds: int | None = None,
    channels: dict[str, Channel] | None = None,
) -> Claim:
    """Claim up to ``limit`` due notifications for ``worker_id``, oldest due first, taking no
    more of a gated channel than its gate allows (open: none, or one probe; rate-limited: its
    tokens). Returns the :class:`Claim`, committed when this returns.

    The lease lasts ``lease_seconds`` (default OUTBOX_LEASE_SECONDS) from ``now`` (default: the
    database clock). ``channels`` (default: read now) are the channels as the pass knows them.
    """
    now = now or database_now()
    until = now + timedelta(seconds=lease_seconds or settings.OUTBOX_LEASE_SECONDS)
    if channels is None:
        channels = dispatch_channels()
    else:
        channels_refresh(channels)
    claim = Claim(rows=[])
    with transaction.atomic():
        db.read_in_index_order()
        gates = [
            channel_gate_open(channel=channel, worker_id=worker_id, now=now, lease_until=until)
            for channel in channels.values()
            if channel.gated
        ]
        if not gates and connection.vendor == "postgresql":
            # No channel gated (the usual case): locking and leasing in one statement.
            claim.rows = _claim_and_lease(worker_id=worker_id, limit=limit, now=now, until=until)
        else:
            _claim_gated(claim, gates=gates, worker_id=worker_id, limit=limit, now=now, until=until)
    for row in claim.rows:
        row.claimed_by, row.claimed_until = worker_id, until
    return claim


def _claim_gated(
    claim: Claim, *, gates: list[Gate], worker_id: str, limit: int, now: datetime, until: datetime
) -> None:
    """Lock the due rows of the channels that are not gated, then of each gated one no more than
    its gate allows, into ``claim``, and stamp their lease (also the way on SQLite)."""
    waiting = Notification.objects.filter(_unleased_q(now))
    free = waiting.exclude(type__in=[gate.channel.name for gate in gates]) if gates else waiting
    claim.rows = _oldest_due_lock(free, now=now, limit=limit)
    for gate in gates:
        room = min(gate.limit, limit - len(claim.rows))
        taken: list[Notification] = []
        if room > 0:
            taken = _oldest_due_lock(waiting.filter(type=gate.channel.name), now=now, limit=room)
        channel_gate_settle(gate, taken=len(taken))
        if gate.probe:
            claim.probes.update(row.pk for row in taken)
        claim.rows += taken
    if claim.rows:
        Notification.objects.filter(db.pk_in([row.pk for row in claim.rows])).update(
            claimed_by=worker_id, claimed_until=until
        )


def _claim_and_lease(*, worker_id: str, limit: int, now: datetime, until: datetime) -> list[Notification]:
    """PostgreSQL, with no channel gated: lock up to ``limit`` due rows as
    :func:`_oldest_due_lock` does (the rows without a due time, then those whose due time has
    passed, each range read off the due index in its order, skipping rows others hold) and
    stamp their lease, in one statement that returns them, oldest due first. One statement
    instead of three: no list of ids sent back for the lease, and no query built by the ORM
    for each claim. (Returning the rows through a ``SELECT … ORDER BY`` over the UPDATE in a
    WITH clause instead lost the race in tests/dispatch/test_operator_races.py: rows an
    operator retried again and again were never claimed.)"""
    params = {"now": now, "limit": limit, "worker": worker_id, "until": until}
    rows = list(Notification.objects.raw(_claim_and_lease_sql(), params))
    # UPDATE … RETURNING gives no order: the due index's, rows without a due time first.
    rows.sort(key=lambda row: (row.next_attempt_at is not None, row.next_attempt_at or now))
    return rows


@cache
def _claim_and_lease_sql() -> str:
    meta = Notification._meta
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        return quote(str(cast(Field, meta.get_field(name)).column))

    table = quote(meta.db_table)
    pk = column("notification_id")

    statuses = ", ".join(f"'{status}'" for status in Notification.NON_TERMINAL)
    unleased = (
        f"{column('status')} IN ({statuses}) "
        f"AND ({column('claimed_until')} IS NULL OR {column('claimed_until')} < %(now)s)"
    )
    due = column("next_attempt_at")
    # The lease's columns are known (the caller sets them): not read back. Time stamps are the
    # costliest columns to read.
    returned = [column(name) for name in CLAIM_FIELDS if name not in ("claimed_by", "claimed_until")]
    return (
        f"WITH undated AS (SELECT {pk} FROM {table} WHERE {unleased} AND {due} IS NULL "
        f"ORDER BY {due} ASC NULLS FIRST LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
        f"dated AS (SELECT {pk} FROM {table} WHERE {unleased} AND {due} <= %(now)s "
        f"ORDER BY {due} ASC NULLS FIRST LIMIT GREATEST(%(limit)s - (SELECT count(*) FROM undated), 0) "
        "FOR UPDATE SKIP LOCKED) "
        f"UPDATE {table} AS n SET {column('claimed_by')} = %(worker)s, "
        f"{column('claimed_until')} = %(until)s "
        f"FROM (SELECT {pk} FROM undated UNION ALL SELECT {pk} FROM dated) AS picked "
        f"WHERE n.{pk} = picked.{pk} RETURNING {', '.join(f'n.{name}' for name in [*returned, due])}"
    )


def notifications_expire(*, channels: dict[str, Channel], now: datetime | None = None) -> int:
    """Park as expired every waiting row (Pending or Retrying, not under a live claim) older
    than its channel's ``max_age_seconds`` — counted from the last operator Retry or Requeue
    if there was one. Rows wait without attempts while their channel is open, so age is the
    only thing that ends an outage's wait. Returns how many rows expired."""
    now = now or database_now()
    expired = 0
    for channel in channels.values():
        max_age = channel.policy.timing.max_age_seconds
        if not max_age:
            continue
        cutoff = now - timedelta(seconds=max_age)
        message = delivery_expired_message(policy=channel.policy)
        expired += Notification.objects.filter(
            Q(status__in=Notification.NON_TERMINAL)
            & Q(type=channel.name)
            & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            & ((Q(requeued_at__isnull=True) & Q(created_at__lt=cutoff)) | Q(requeued_at__lt=cutoff))
        ).update(
            status=Notification.Status.PARKED,
            next_attempt_at=None,
            expired_at=now,
            claimed_by="",
            claimed_until=None,
            last_error=Case(
                When(last_error="", then=Value(message, output_field=TextField())),
                default=db.TextConcat(Value(f"{message}; last error: ", output_field=TextField()), F("last_error")),
                output_field=TextField(),
            ),
        )
    return expired


def dispatch_wake_at(*, channels: dict[str, Channel] | None = None, now: datetime | None = None) -> datetime | None:
    """When a claim could next take a row: the earliest due time of a waiting row, put back to
    when its channel lets it through (the next probe of an open endpoint, the next token of a
    rate-limited one). None when nothing waits. Leases of crashed workers are left to the
    sweep."""
    now = now or database_now()
    channels = dispatch_channels() if channels is None else channels
    health = {(row.channel, row.endpoint): row for row in ChannelHealth.objects.all()}
    unleased = _unleased_q(now)
    wake: datetime | None = None
    with transaction.atomic():
        db.read_in_index_order()  # the due index in its order: one row, not a sorted backlog
        for channel in channels.values():
            first = list(
                Notification.objects.filter(unleased, type=channel.name)
                .order_by(DUE_INDEX_ORDER)
                .values_list("next_attempt_at", flat=True)[:1]
            )
            if not first:
                continue
            when = max(first[0] or now, now)
            if channel.endpoint is not None:
                health_row = health.get((channel.name, channel.endpoint))
                when = max(when, channel_gate_wait(channel=channel, health=health_row, now=now))
            wake = when if wake is None else min(wake, when)
    return wake
