"""Claiming due notifications (docs/architecture.md, "How a notification is delivered").

Due rows are claimed in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
workers never wait for each other) by stamping a lease: ``claimed_by`` and ``claimed_until``.
The transaction commits before any network I/O. A row whose lease has expired is due again, so
a crashed worker's rows are picked up by the next pass — nothing is ever left invisible. On
SQLite there is no ``SKIP LOCKED``; the IMMEDIATE transaction serialises claims instead, which
is correct but meant for one worker.

The rows are taken in the claim's order (notifications.dispatch.fair): priority first, the
sites taking turns within a priority, the oldest due first within a site. A channel whose
endpoint is open (circuit breaker) or rate-limited is claimed through its health row
(notifications.health): an open endpoint gives no rows, or one probe; a rate-limited one no
more rows than its bucket has tokens. Rows left behind wait, uncharged.

Every claim reads the claim index (``notif_claim_idx``) key by key and each key's due rows as
one range, so a claim costs about what it takes whatever the backlog; its transaction turns
sorts off (:func:`~notifications.db.read_in_index_order`, measured need written there).
"""

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, TextField, Value, When

from notifications import db
from notifications.clock import database_now
from notifications.dispatch.fair import (
    CLAIM_FIELDS,
    ClaimLimits,
    due_q,
    first_due_by_channel,
    notifications_claim_in_order,
    notifications_due_exist,
)
from notifications.escalation import escalations_next_due
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
from notifications.suppression import digests_next_due

__all__ = [
    "CLAIM_FIELDS",
    "DUE_TIME_SOURCES",
    "Claim",
    "deliveries_wake_at",
    "dispatch_wake_at",
    "notifications_claim_due",
    "notifications_due_exist",
    "notifications_due_q",
    "notifications_expire",
    "worker_id_new",
]


def worker_id_new(prefix: str = "dispatch") -> str:
    """A worker id unique across hosts, processes and passes (fits ``claimed_by``)."""
    return f"{prefix}:{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def notifications_due_q(now: datetime) -> Q:
    """The rule for "due": not terminal, its next attempt time has come, and no live lease.

    A Pending row with no next attempt time (created by hand) counts as due, never as lost.
    """
    return due_q(now)


@dataclass
class Claim:
    """Rows claimed by one claim, in the claim's order; ``probes``: the ids of those claimed as
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
    """Claim up to ``limit`` due notifications for ``worker_id`` in the claim's order (priority,
    then the sites in turn, then the oldest due), taking no more of a gated channel than its
    gate allows (open: none, or one probe; rate-limited: its tokens). Returns the
    :class:`Claim`, committed when this returns.

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
        limits = _limits(gates, limit=limit)
        claim.rows = notifications_claim_in_order(limits=limits, worker_id=worker_id, now=now, until=until)
        _gates_settle(claim, gates)
    for row in claim.rows:
        row.claimed_by, row.claimed_until = worker_id, until
    return claim


def _limits(gates: list[Gate], *, limit: int) -> ClaimLimits:
    """What the claim may take: ``limit`` rows, none of a channel whose gate gives none, no more
    of one whose gate gives fewer than ``limit`` than it gives."""
    limits = ClaimLimits(limit=limit)
    for gate in gates:
        if gate.limit <= 0:
            limits.closed.add(gate.channel.name)
        elif gate.limit < limit:
            limits.capped[gate.channel.name] = gate.limit
    return limits


def _gates_settle(claim: Claim, gates: list[Gate]) -> None:
    """Spend each gated channel's tokens for the rows taken, and mark its probe."""
    for gate in gates:
        taken = [row.pk for row in claim.rows if row.type == gate.channel.name]
        channel_gate_settle(gate, taken=len(taken))
        if gate.probe:
            claim.probes.update(taken)


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
            & Q(held_for_digest__isnull=True)  # its digest carries it (notifications.suppression)
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


# The due times a dispatch pass acts on besides deliveries, each a function giving its earliest
# due time (None: nothing waits) at ``now``; the pass (notifications.dispatch.runner) does the
# work that is due: escalation steps (notifications.escalation) and the ends of flood-digest
# windows (notifications.suppression.digests_flush, at the start of every pass).
DUE_TIME_SOURCES: tuple[Callable[..., datetime | None], ...] = (escalations_next_due, digests_next_due)


def dispatch_wake_at(*, channels: dict[str, Channel] | None = None, now: datetime | None = None) -> datetime | None:
    """When a dispatch pass next has something to do: the earliest of the deliveries' wake
    time (:func:`deliveries_wake_at`) and the due times of :data:`DUE_TIME_SOURCES`
    (escalation steps, digest windows). None when nothing waits."""
    now = now or database_now()
    times = [deliveries_wake_at(channels=channels, now=now), *(source(now=now) for source in DUE_TIME_SOURCES)]
    return min((when for when in times if when is not None), default=None)


def deliveries_wake_at(*, channels: dict[str, Channel] | None = None, now: datetime | None = None) -> datetime | None:
    """When a claim could next take a row: the earliest due time of a waiting row, put back to
    when its channel lets it through (the next probe of an open endpoint, the next token of a
    rate-limited one). None when nothing waits. Leases of crashed workers are left to the
    sweep."""
    now = now or database_now()
    channels = dispatch_channels() if channels is None else channels
    health = {(row.channel, row.endpoint): row for row in ChannelHealth.objects.all()}
    with transaction.atomic():
        db.read_in_index_order()  # the claim index in its order: one row per key, not a sorted backlog
        firsts = first_due_by_channel(now=now)
    wake: datetime | None = None
    for channel in channels.values():
        when = firsts.get(channel.name)
        if when is None:
            continue
        if channel.endpoint is not None:
            health_row = health.get((channel.name, channel.endpoint))
            when = max(when, channel_gate_wait(channel=channel, health=health_row, now=now))
        wake = when if wake is None else min(wake, when)
    return wake
