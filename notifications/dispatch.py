"""Dispatch (docs/architecture.md): claim due notifications, deliver them, finish them.

* **Claim.** Due rows are claimed in one short transaction (``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL, so workers never wait for each other) by stamping a lease: ``claimed_by`` and
  ``claimed_until``. The transaction commits before any network I/O. A row whose lease has
  expired is due again, so a crashed worker's rows are picked up by the next pass — nothing is
  ever left invisible. On SQLite there is no ``SKIP LOCKED``; the IMMEDIATE transaction
  serialises claims instead, which is correct but meant for one worker.
* **Deliver.** Lists are resolved now, at delivery time; every attempt is recorded before the
  network call; delivery runs on a bounded thread pool through the adapter's session, which
  reuses connections across the batch. The next batch is claimed while the pool still has
  about one delivery per thread to do, so the threads never wait for a claim or for the
  slowest deliveries of a batch.
* **Gate.** A channel whose endpoint is open (circuit breaker) or rate-limited is claimed
  through its health row (notifications.health): an open endpoint gives no rows, or one
  probe; a rate-limited one no more rows than its bucket has tokens. Rows left behind wait,
  uncharged.
* **Finish.** :func:`notifications_finish` is the one way a claimed row is finished. Each row
  changes only if this worker still holds it and its status is the one it claimed, so an
  operator's action or another worker's re-claim after a lease expiry is never overwritten.
  What a failure leads to is the channel's delivery policy's rule (notifications.policies);
  the outcomes also feed the channel's breaker.

One time stands for an attempt: the moment it was recorded, just before its batch's deliveries
start, on the database clock. It is the attempt's ``started_at`` and, once the attempt is
finished, the row's ``last_attempt_at``; ``duration_ms`` is the adapter call's own duration.
"""

import contextlib
import gc
import logging
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Case, F, Field, Q, QuerySet, TextField, Value, When

from notifications import db
from notifications.adapters import adapter_for
from notifications.adapters.base import (
    CHANNEL_FAILURES,
    HEALTHY_FAILURES,
    Adapter,
    DeliveryError,
    DeliveryResult,
    FailureClass,
    Session,
    TargetOutcome,
    delivery_deadline,
    target_outcome,
)
from notifications.adapters.smtp_steps import StepLoop, Steps, steps_run
from notifications.clock import DatabaseClock, database_clock, database_now
from notifications.counts import counts_fold
from notifications.health import (
    Channel,
    Gate,
    channel_gate_open,
    channel_gate_settle,
    channel_gate_wait,
    channel_health_record,
    channels_refresh,
    dispatch_channels,
)
from notifications.metrics import deliveries_observe
from notifications.models import ChannelHealth, DeliveryAttempt, DispatchTimer, Notification, ProviderMessage
from notifications.policies import delivery_expired_message, delivery_failure_decide, delivery_policy_default
from notifications.providers import provider_statuses_reapply

logger = logging.getLogger(__name__)
Status = Notification.Status

# The columns delivery reads from a claimed row.
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
    # Channels with per-target outcomes send a retry only to the targets still owed it, and
    # webhooks carry the site id.
    "resolved_targets",
    "source_site_id",
)
# Oldest due first, as the due index (notif_due_idx) holds the rows: no due time, then by it.
DUE_INDEX_ORDER = F("next_attempt_at").asc(nulls_first=True)
# The columns finishing an attempt writes.
ATTEMPT_RESULT_FIELDS = ("duration_ms", "outcome", "failure_class", "error", "detail")
MAX_ERROR_LENGTH = 4000


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
    due row and sorts them.) Called in a transaction that reads through indexes
    (:func:`~notifications.db.read_through_indexes`): with statistics taken before a backlog
    arrived, PostgreSQL would otherwise collect and sort the whole backlog for every claim.
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
        gates = [
            channel_gate_open(channel=channel, worker_id=worker_id, now=now, lease_until=until)
            for channel in channels.values()
            if channel.gated
        ]
        db.read_through_indexes()
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
    returned = [column(name) for name in dict.fromkeys(CLAIM_FIELDS) if name not in ("claimed_by", "claimed_until")]
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
        db.read_through_indexes()  # the due index in its order: one row, not a sorted backlog
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


def delivery_attempts_record(
    *, worker_id: str, notifications: Sequence[Notification], now: datetime
) -> dict[Any, DeliveryAttempt]:
    """Record one in-progress attempt per claimed notification, started at ``now``, before any
    network call: an attempt cut short by a crash stays in the audit as in progress. Returns
    the attempts by notification id."""
    attempts = db.insert_for_each(
        DeliveryAttempt,
        column="notification_id",
        values=[row.pk for row in notifications],
        common={"started_at": now, "worker": worker_id[:64]},
    )
    return {attempt.notification_id: attempt for attempt in attempts}


@dataclass(frozen=True)
class DeliveryOutcome:
    """What happened to one claimed notification. Exactly one of ``result`` / ``error`` is set,
    unless the delivery was never started (``started`` False: the pass ran out of time or was
    asked to stop)."""

    result: DeliveryResult | None = None
    error: DeliveryError | None = None
    duration_ms: int = 0
    started: bool = True
    adapter_called: bool = False  # False for a failure found before delivery (an unknown list, …)


def notification_deliver_steps(
    *, notification: Notification, targets: list[str], session: Session
) -> Steps[DeliveryOutcome]:
    """Deliver one notification through an open adapter session, as steps
    (notifications.adapters.smtp_steps: the session's own when it has them, ``runs_steps``,
    else its blocking ``deliver``); never raises for delivery failures (they are returned as
    ``DeliveryOutcome.error``)."""
    clock = time.monotonic()
    result: DeliveryResult | None = None
    error: DeliveryError | None = None
    try:
        if getattr(session, "runs_steps", False):
            result = yield from session.deliver_steps(notification, targets)  # type: ignore[attr-defined]
        else:
            result = session.deliver(notification, targets)
    except DeliveryError as exc:
        error = exc
    except Exception as exc:  # a bug in an adapter must not kill the pass or lose the row
        logger.exception(
            "adapter crashed delivering %s",
            notification.pk,
            extra={"notification_id": str(notification.pk), "channel": notification.type, "outcome": "crashed"},
        )
        error = DeliveryError(f"Adapter error: {type(exc).__name__}: {exc}", failure_class=FailureClass.UNKNOWN)
    seconds = time.monotonic() - clock
    return DeliveryOutcome(result=result, error=error, duration_ms=int(seconds * 1000), adapter_called=True)


@dataclass(frozen=True)
class Finish:
    """One claimed notification to finish: the row as claimed, the attempt recorded for it,
    what happened, its channel (policy and health) and whether it was the channel's probe."""

    notification: Notification
    attempt: DeliveryAttempt
    outcome: DeliveryOutcome
    channel: Channel
    probe: bool = False


@dataclass
class FinishReport:
    """How many rows one :func:`notifications_finish` moved where. ``lost`` rows were no longer
    held by the worker in the status it claimed (an operator or another worker got there
    first; their state stands)."""

    delivered: int = 0
    retrying: int = 0
    parked: int = 0
    released: int = 0
    lost: int = 0


def notifications_finish(*, worker_id: str, outcomes: Iterable[Finish], now: datetime | None = None) -> FinishReport:
    """Finish claimed notifications and their attempts with what happened, in one transaction,
    then record the outcomes on their channels' health.

    success → Delivered; failure → what the channel's policy decides
    (:func:`~notifications.policies.delivery_failure_decide`: Retrying at a due time, or
    Parked with the reason); never started → released (due again, its attempt deleted:
    nothing was tried). ``now`` (default: the database clock) is when the results are
    applied: ``delivered_at`` and the base of ``next_attempt_at``.

    A row changes only while ``worker_id`` still holds it in the status it was claimed with;
    otherwise it counts as lost and keeps the state someone else gave it. The attempts are
    finished either way: they record what happened. Rows whose changes are identical share
    one conditional UPDATE (in a healthy batch: every row delivered to the same list).
    """
    now = now or database_now()
    report = FinishReport()
    groups: dict[tuple[str, str, str, str], tuple[dict[str, Any], list[Notification]]] = {}
    finished, unstarted = [], []
    finishes = list(outcomes)
    durations: list[tuple[str, float]] = []
    by_channel: dict[str, tuple[Channel, list[str | None], list[str]]] = {}
    outcomes_by_pk: dict[Any, DeliveryOutcome] = {}
    # A delivered row's changes follow from its channel, claimed status, targets' outcomes,
    # warning and attempt time: rows equal in those to the row before (a healthy batch: all of
    # them) join its group without their changes being built and written out again.
    previous: tuple[Any, ...] | None = None
    previous_key: tuple[str, str, str, str] | None = None
    for item in finishes:
        row, attempt = item.notification, item.attempt
        outcomes_by_pk[row.pk] = item.outcome
        seen = by_channel.setdefault(item.channel.name, (item.channel, [], []))
        key: tuple[str, str, str, str] | None = None
        inputs: tuple[Any, ...] | None = None
        if not item.outcome.started:
            changes: dict[str, Any] = {"claimed_by": "", "claimed_until": None}
            kind = "released"
            unstarted.append(attempt.pk)
        else:
            result = item.outcome.result
            if result is not None:
                inputs = (item.channel.name, row.status, result.targets, result.warning, attempt.started_at)
            if inputs is not None and inputs == previous:
                kind, key = "delivered", previous_key
            else:
                changes, kind = _finish_changes(notification=row, outcome=item.outcome, channel=item.channel, now=now)
                changes["last_attempt_at"] = attempt.started_at
            _attempt_finish(attempt, item.outcome, kind=kind, probe=item.probe)
            finished.append(attempt)
            if item.outcome.adapter_called:
                durations.append((item.channel.name, item.outcome.duration_ms / 1000))
            error = item.outcome.error
            seen[1].append(None if error is None else error.failure_class)
            if error is not None and error.failure_class in CHANNEL_FAILURES:
                seen[2].append(error.message)
        if key is None:
            # Text from remote servers (replies, refusals) must not make the transaction fail.
            changes, text = db.storable_with_text(changes)
            key = (item.channel.name, row.status, kind, text)
            groups.setdefault(key, (changes, []))
            previous, previous_key = inputs, key
        groups[key][1].append(row)
    counted: list[tuple[str, str, int]] = []
    delivered_created: list[datetime] = []
    logged: list[tuple[Notification, str, str]] = []  # (row, channel, outcome) of rows this finish changed
    with transaction.atomic():
        db.read_through_indexes()  # every row by its primary key
        for (channel_name, claimed_status, kind, _), (changes, rows) in groups.items():
            updated = Notification.objects.filter(
                db.pk_in([row.pk for row in rows]), status__equals_unindexed=claimed_status, claimed_by=worker_id
            ).update(**changes)
            setattr(report, kind, getattr(report, kind) + updated)
            report.lost += len(rows) - updated
            if kind != "released":
                counted.append((channel_name, kind, updated))
            if kind == "delivered":
                # Which rows of a partly lost group were delivered is not known; as many are timed.
                delivered_created += [row.created_at for row in rows[:updated]]
            if updated == len(rows):
                logged += [(row, channel_name, kind) for row in rows]
            else:
                logged += [(row, channel_name, f"{kind} or lost") for row in rows]
        if unstarted:
            DeliveryAttempt.objects.filter(pk__in=unstarted, outcome=DeliveryAttempt.Outcome.IN_PROGRESS).delete()
        db.update_by_pk(finished, ATTEMPT_RESULT_FIELDS)
        provider_messages_record(outcomes=finishes)
    for channel, classes, messages in by_channel.values():
        # A healthy channel without channel failures has nothing to record: no write, no lock.
        if channel.endpoint is None or (channel.clean and not any(c in CHANNEL_FAILURES for c in classes)):
            continue
        channel_health_record(
            channel=channel,
            failure_classes=classes,
            worker_id=worker_id,
            now=now,
            last_error=db.storable(messages[-1]) if messages else "",
        )
    _finished_log(worker_id=worker_id, finished=logged, outcomes=outcomes_by_pk)
    try:
        deliveries_observe(finished=counted, durations=durations, delivered_created=delivered_created, now=now)
    except Exception:  # the results are recorded; metrics must never cost a pass
        logger.exception("could not record delivery metrics")
    return report


def provider_messages_record(*, outcomes: Iterable[Finish]) -> None:
    """Index the messages providers accepted (targets with a ``provider_id``) so that the
    providers' status callbacks find their notification; recorded whether or not the row was
    still held: the message was sent either way."""
    rows = []
    for item in outcomes:
        delivery = item.outcome.result or item.outcome.error
        for entry in delivery.targets if delivery is not None else []:
            if isinstance(entry, dict) and entry.get("provider") and entry.get("provider_id"):
                rows.append(
                    ProviderMessage(
                        provider=str(entry["provider"])[:16],
                        provider_id=str(entry["provider_id"])[:64],
                        notification_id=item.notification.pk,
                        target_ref=str(entry.get("ref", ""))[:32],
                    )
                )
    if rows:
        ProviderMessage.objects.bulk_create(rows, ignore_conflicts=True)
        provider_statuses_reapply(notification_ids={row.notification_id for row in rows})


def _finished_log(
    *, worker_id: str, finished: list[tuple[Notification, str, str]], outcomes: dict[Any, DeliveryOutcome]
) -> None:
    """One record per finished row: a failure (retrying, parked) at INFO with its failure class
    and error, a delivery or a release at DEBUG. The row's id, site, channel, the worker and the
    outcome go with it as context (``extra``), for LOG_FORMAT=json."""
    debug = logger.isEnabledFor(logging.DEBUG)
    for row, channel, kind in finished:
        outcome = outcomes[row.pk]
        error = outcome.error
        if error is None and not debug:
            continue
        context = {
            "notification_id": str(row.pk),
            "site": row.source_site_id,
            "channel": channel,
            "worker": worker_id,
            "outcome": kind,
        }
        if error is not None and outcome.started:
            context["failure_class"] = str(error.failure_class)
            logger.info("%s %s (%s): %s", kind, row.pk, error.failure_class, error.message, extra=context)
        else:
            logger.debug("%s %s", kind, row.pk, extra=context)


def _finish_changes(
    *, notification: Notification, outcome: DeliveryOutcome, channel: Channel, now: datetime
) -> tuple[dict[str, Any], str]:
    """The column changes that finish ``notification`` after a started delivery, and what they
    amount to: "delivered", "retrying" or "parked"."""
    changes: dict[str, Any] = {"claimed_by": "", "claimed_until": None}
    if outcome.result is not None:
        changes.update(
            status=Status.DELIVERED,
            delivered_at=now,
            next_attempt_at=None,
            resolved_targets=outcome.result.targets,
            targets_refused=_refused(outcome.result.targets),
            last_error=outcome.result.warning,
        )
        return changes, "delivered"
    error = outcome.error
    assert error is not None, "a started delivery has a result or an error"
    channel_failure = error.failure_class in CHANNEL_FAILURES
    channel_failures = notification.channel_failures + (1 if channel_failure else 0)
    failed = notification.retry_count + 1
    decision = delivery_failure_decide(
        policy=channel.policy,
        failure_class=error.failure_class,
        message=error.message,
        row_failures=failed - channel_failures,
        queued_at=notification.requeued_at or notification.created_at,
        now=now,
        rand=random.random(),
        outcome_unknown=error.outcome_unknown,
    )
    changes.update(
        retry_count=failed,
        channel_failures=channel_failures,
        status=decision.status,
        next_attempt_at=decision.next_attempt_at,
        last_error=decision.last_error,
    )
    if decision.expired:
        changes["expired_at"] = now
    if error.retry_after and decision.next_attempt_at is not None:
        # The receiver said when to come back (Retry-After): not before then.
        changes["next_attempt_at"] = max(decision.next_attempt_at, now + timedelta(seconds=error.retry_after))
    if error.targets:
        changes["resolved_targets"] = error.targets
        changes["targets_refused"] = _refused(error.targets)
    return changes, "retrying" if decision.status == Status.RETRYING else "parked"


def _refused(targets: list[dict[str, Any]]) -> int:
    """How many targets refused the notification for good."""
    return sum(1 for entry in targets if isinstance(entry, dict) and target_outcome(entry) == TargetOutcome.REFUSED)


def _attempt_finish(attempt: DeliveryAttempt, outcome: DeliveryOutcome, *, kind: str, probe: bool) -> None:
    attempt.duration_ms = outcome.duration_ms
    if outcome.result is not None:
        attempt.outcome = DeliveryAttempt.Outcome.SUCCESS
        attempt.error = outcome.result.warning
        attempt.detail = outcome.result.detail
    elif outcome.error is not None:
        error = outcome.error
        if error.ambiguous:
            # The server may hold the message: neither a failure to retry blindly nor a refusal.
            attempt.outcome = DeliveryAttempt.Outcome.AMBIGUOUS
        else:
            attempt.outcome = (
                DeliveryAttempt.Outcome.PERMANENT if kind == "parked" else DeliveryAttempt.Outcome.TRANSIENT
            )
        attempt.failure_class = error.failure_class
        attempt.error = error.message[:MAX_ERROR_LENGTH]
        attempt.detail = error.detail
    if probe:
        attempt.detail = {**attempt.detail, "probe": True}


# --- the dispatch pass ------------------------------------------------------------------------


@dataclass
class PassReport:
    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    parked: int = 0
    released: int = 0
    lost: int = 0  # finished by someone else meanwhile (lease expired and re-claimed, …)
    expired: int = 0  # parked for their age before the pass claimed anything
    batches: int = 0
    seconds: float = 0.0
    more_due: bool = False  # stopped by the time budget or a stop request with rows still due

    def add(self, finished: FinishReport) -> None:
        for name in ("delivered", "retrying", "parked", "released", "lost"):
            setattr(self, name, getattr(self, name) + getattr(finished, name))

    def __str__(self) -> str:
        return (
            f"claimed {self.claimed}, delivered {self.delivered}, retrying {self.retrying}, "
            f"parked {self.parked}, released {self.released}"
            + (f", expired {self.expired}" if self.expired else "")
            + f" in {self.seconds:.2f} s"
        )


class _TypeContext:
    """Per pass and type: the adapter, its channel (policy and health) and an open session (or
    why not)."""

    def __init__(self, type_name: str, channel: Channel | None) -> None:
        self.adapter: Adapter | None = None
        self.session: Session | None = None
        self.error: DeliveryError | None = None
        self.channel = channel or Channel(
            name=type_name, endpoint=None, policy=delivery_policy_default(channel=type_name)
        )
        try:
            self.adapter = adapter_for(type_name)
        except KeyError:
            # No adapter: nothing can deliver this type, now or later.
            self.error = DeliveryError(
                f"No adapter is registered for type {type_name!r}.", failure_class=FailureClass.CONFIGURATION
            )
            return
        try:
            self.session = self.adapter.open_session()
        except DeliveryError as exc:
            self.error = exc

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


_settled = threading.Lock()
_settled_done = False


def dispatcher_process_settle() -> bool:
    """Once per process that dispatches for a long time (``manage.py dispatch``, a django-q2
    worker): hand every object alive now — modules, classes, Django's set-up — to the
    garbage collector's permanent generation (``gc.freeze()``), so that its
    collections no longer walk them. A pass allocates and frees thousands of objects per
    batch, and each full collection walked every object of the start-up again: measured, the
    dispatcher processes' CPU per message fell by about a fifth (from 320–375 µs to 250–275
    µs). Objects still die by reference counting as before; only cycles that exist at this
    moment are never collected. Returns True the first time, False after."""
    global _settled_done
    with _settled:
        if _settled_done:
            return False
        gc.freeze()
        _settled_done = True
        return True


def dispatch_pass(
    *,
    worker_id: str,
    time_budget: float,
    stop: threading.Event | None = None,
    batch_size: int | None = None,
    concurrency: int | None = None,
    progress: Callable[[PassReport], None] | None = None,
) -> PassReport:
    """Expire rows past their channel's maximum age, then claim and deliver batches until
    nothing is due (or claimable), ``time_budget`` seconds have passed, or ``stop`` is set.
    Returns a :class:`PassReport`.

    No delivery starts after the budget (or after a batch's lease is close to expiry, or after
    its channel opened); deliveries already started finish, and rows not started are released
    to be due again.
    """
    batch_size = batch_size or settings.OUTBOX_BATCH_SIZE
    concurrency = concurrency or settings.OUTBOX_CONCURRENCY
    stop = stop or threading.Event()
    started = time.monotonic()
    deadline = started + time_budget
    report = PassReport()
    channels = dispatch_channels()
    report.expired = notifications_expire(channels=channels)
    contexts: dict[str, _TypeContext] = {}
    # Shared by the pass's batches: per type, channel failures in a row as deliveries complete.
    streaks = _Streaks()
    pace = _Pace()
    active: list[_Batch] = []  # batches with deliveries queued or running
    drained = False  # a claim found fewer rows than asked: nothing more is due (or claimable)
    try:
        with _Deliveries(threads=concurrency) as pool:
            while True:
                in_flight = sum(batch.pending for batch in active)  # results not yet finished too
                claiming = not drained and not stop.is_set() and time.monotonic() < deadline
                # The next batch is claimed while the threads still have about one delivery
                # each to do, so they never wait for a claim (or for a batch's last, slowest
                # deliveries): a relay's latency, not the batch rhythm, bounds the pace.
                if claiming and in_flight <= concurrency:
                    # The database clock, read once per batch: one query, not one per result.
                    clock = database_clock()
                    limit = pace.claim_size(batch_size=batch_size, concurrency=concurrency)
                    claim = notifications_claim_due(
                        worker_id=worker_id, limit=limit, now=clock.now(), channels=channels
                    )
                    if len(claim.rows) < limit:
                        drained = True  # the next trigger, wake-up or sweep takes what comes later
                    if not claim.rows:
                        continue
                    report.batches += 1
                    report.claimed += len(claim.rows)
                    batch = _Batch(
                        worker_id=worker_id,
                        clock=clock,
                        contexts=contexts,
                        channels=channels,
                        report=report,
                        streaks=streaks,
                        pace=pace,
                    )
                    batch.start(claim, pool=pool, stop=stop, deadline=deadline)
                    active.append(batch)
                    continue
                if not in_flight:
                    break
                _batches_collect(pool)
                finished = [batch for batch in active if not batch.pending]
                active = [batch for batch in active if batch.pending]
                if progress and finished:
                    progress(report)
            if not drained:  # stopped by the budget or a stop request
                report.more_due = Notification.objects.filter(notifications_due_q(database_now())).exists()
    finally:
        for context in contexts.values():
            context.close()
    counts_fold()  # the pass's status changes, summed per key (notifications.counts)
    report.seconds = time.monotonic() - started
    return report


# --- waiting for the next due time ----------------------------------------------------------

# How often a waiting worker looks again for an earlier due time (an operator's Retry now, a
# probe that became possible); a due time it knows of is slept to exactly.
WAKE_POLL_SECONDS = 1.0
# After a pass that found nothing to claim at a wake time (rows another worker took first).
IDLE_PAUSE_SECONDS = 0.1


def dispatch_timer_take(*, holder: str, seconds: float) -> bool:
    """Become (or stay) the one worker that waits for due times, for ``seconds``; False while
    another holds it. A lease: a waiter that dies frees it when its time is up."""
    now = database_now()
    until = now + timedelta(seconds=seconds)
    free = Q(until__isnull=True) | Q(until__lt=now) | Q(holder=holder)
    if DispatchTimer.objects.filter(free, pk=DispatchTimer.SINGLETON_PK).update(holder=holder[:64], until=until):
        return True
    try:
        with transaction.atomic():
            DispatchTimer.objects.create(pk=DispatchTimer.SINGLETON_PK, holder=holder[:64], until=until)
    except IntegrityError:
        return False  # it exists and someone else holds it
    return True


def dispatch_timer_release(*, holder: str) -> None:
    """Give the waiting role back, if ``holder`` has it."""
    DispatchTimer.objects.filter(pk=DispatchTimer.SINGLETON_PK, holder=holder[:64]).update(holder="", until=None)


@dataclass
class WaitReport:
    """What :func:`dispatch_wait` did: ``held`` the waiting role (else another worker waits),
    the passes it ran at wake times, and ``next_wake`` (when a claim could next take a row,
    as known when it stopped; None when nothing waits)."""

    held: bool = False
    passes: list[PassReport] = field(default_factory=list)
    next_wake: datetime | None = None
    more_due: bool = False


def dispatch_wait(
    *, worker_id: str, time_budget: float, stop: threading.Event | None = None, **pass_options: Any
) -> WaitReport:
    """Wait for due times for at most ``time_budget`` seconds and run a pass at each, so that a
    retry is attempted when it is due rather than at the next sweep. Only one worker waits at
    a time (:func:`dispatch_timer_take`); the others return at once (``held`` False).

    Returns when nothing waits any more, when the next wake time is beyond the budget, when
    the budget is spent or ``stop`` is set. ``pass_options`` go to :func:`dispatch_pass`.
    """
    stop = stop or threading.Event()
    report = WaitReport()
    deadline = time.monotonic() + time_budget
    if time_budget <= 0 or not dispatch_timer_take(holder=worker_id, seconds=time_budget + 5):
        report.next_wake = dispatch_wake_at() if time_budget <= 0 else None
        return report
    report.held = True
    try:
        while not stop.is_set():
            now = database_now()
            report.next_wake = dispatch_wake_at(now=now)
            left = deadline - time.monotonic()
            if report.next_wake is None or left <= 0:
                break
            until_wake = (report.next_wake - now).total_seconds()
            if until_wake > left:
                break
            if until_wake > 0:
                stop.wait(min(until_wake, WAKE_POLL_SECONDS))
                continue
            passed = dispatch_pass(worker_id=worker_id, time_budget=left, stop=stop, **pass_options)
            report.passes.append(passed)
            if passed.more_due:
                report.more_due = True
                break
            if passed.claimed == 0:
                stop.wait(IDLE_PAUSE_SECONDS)
    finally:
        dispatch_timer_release(holder=worker_id)
    return report


# While the database is briefly unavailable (a failover, a restart), results of deliveries that
# already happened are held and re-applied: dropping them would let the lease expire and the
# message be sent a second time. Bounded well inside the lease.
APPLY_RETRY_SECONDS = 0.5
# Results that complete within this window of each other are applied together: one
# transaction (and one fsync) for many results, while the crash window stays short.
APPLY_WINDOW_SECONDS = 0.02


@dataclass
class _Streaks:
    """Per type: channel failures in a row, as the deliveries of a pass complete."""

    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


# A claim takes no more rows than the pass's threads can start within about this long at the
# pace deliveries have been taking (and never more than the batch size): rows a worker has
# claimed but cannot start soon are rows the other workers cannot take. Against a slow relay
# (50 ms a message, 16 threads) a claim is about 80 rows, so that when a backlog runs out no
# worker is left with hundreds of rows while the others idle; against a fast one it is the
# whole batch, whose fixed cost (claim, attempts, clock) is then shared by the most rows.
CLAIM_HORIZON_SECONDS = 0.25


@dataclass
class _Pace:
    """How long this pass's deliveries take (a moving average), for the size of its claims."""

    seconds: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, duration_ms: int) -> None:
        seconds = max(duration_ms, 1) / 1000
        with self.lock:
            self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    def claim_size(self, *, batch_size: int, concurrency: int) -> int:
        """The rows to claim next: the batch size until a delivery has been timed, then what
        ``concurrency`` threads start within CLAIM_HORIZON_SECONDS, between ``concurrency``
        and ``batch_size``."""
        if self.seconds is None:
            return batch_size
        rounds = max(1, int(CLAIM_HORIZON_SECONDS / self.seconds))
        return max(1, min(batch_size, max(concurrency, concurrency * rounds)))


class _Deliveries:
    """The pass's deliveries. :meth:`submit_steps` queues a delivery written as steps (email)
    on a :class:`StepLoop` that the pass thread turns while it waits for results;
    :meth:`submit` queues one for the delivery threads (other channels, or email with
    ``OUTBOX_DELIVERY_LOOP`` off). Both keep their results until the pass thread collects them
    (:meth:`collect`).

    Leaner than ``concurrent.futures``, which for every delivery builds a future and, for every
    wait, adds a waiter to each delivery in flight: the pass thread wakes once per group of
    results, never once per result, and holds the interpreter lock less, which the delivery
    threads wait for."""

    def __init__(self, *, threads: int) -> None:
        self._loop: StepLoop | None = None  # made by the first delivery written as steps
        self._tasks: queue.SimpleQueue[tuple[_Batch, Callable[..., Finish], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._results: list[tuple[_Batch, Finish | None, BaseException | None]] = []
        self._some = threading.Event()  # results wait to be collected
        self._none_left = threading.Event()  # no delivery queued or running
        self._none_left.set()
        self.outstanding = 0  # deliveries queued or running
        self._size = threads
        self._threads: list[threading.Thread] = []  # started by the first delivery: a pass may claim nothing

    def __enter__(self) -> "_Deliveries":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        """Stop the threads once the deliveries they run are over. Normally nothing is queued
        then; when the pass failed, queued deliveries are dropped rather than made: their
        results could not be recorded, and their rows are due again when their lease ends."""
        if exc_type is not None:
            with contextlib.suppress(queue.Empty):
                while True:
                    self._tasks.get_nowait()
            if self._loop is not None:
                self._loop.drop()
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()
        loop = self._loop
        if loop is not None:
            try:
                while loop.busy:  # deliveries under way end as they would on a thread
                    loop.turn(None)
            finally:
                loop.close()

    def submit(self, batch: "_Batch", call: Callable[..., Finish], *args: Any) -> None:
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._work, name=f"deliver_{number}", daemon=True)
                for number in range(self._size)
            ]
            for thread in self._threads:
                thread.start()
        self._count(batch)
        self._tasks.put((batch, call, args))

    def submit_steps(self, batch: "_Batch", factory: Callable[..., Steps[Finish]], *args: Any) -> None:
        """Queue a delivery written as steps: ``factory(*args)`` runs on the pass's step loop,
        ``threads`` at a time, on the pass's own thread while it waits for results
        (:meth:`collect`)."""
        if self._loop is None:
            self._loop = StepLoop(size=self._size, done=self._done)
        self._count(batch)
        self._loop.submit(batch, factory, *args)

    def _count(self, batch: "_Batch") -> None:
        with self._lock:
            self.outstanding += 1
            self._none_left.clear()
        batch.pending += 1

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            batch, call, args = task
            result: Finish | None = None
            error: BaseException | None = None
            try:
                result = call(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the pass thread, which raises it
                error = exc
            self._done(batch, result, error)

    def _done(self, batch: "_Batch", result: Finish | None, error: BaseException | None) -> None:
        with self._lock:
            self._results.append((batch, result, error))
            self.outstanding -= 1
            if not self.outstanding:
                self._none_left.set()
            self._some.set()
        loop = self._loop
        if loop is not None and loop.sleeping:  # a thread's result: the pass thread may wait in the loop
            loop.wake()

    def collect(self, window: float) -> list[tuple["_Batch", Finish | None, BaseException | None]]:
        """Wait until a delivery completes, then up to ``window`` seconds more for others (less
        when none is left in flight); what completed, in order. Deliveries written as steps
        move meanwhile, on this thread."""
        loop = self._loop
        if loop is None:
            self._some.wait()
            self._none_left.wait(window)
        else:
            self._loop_collect(loop, window)
        with self._lock:
            done, self._results = self._results, []
            self._some.clear()
        return done

    def _loop_collect(self, loop: StepLoop, window: float) -> None:
        """:meth:`collect`'s waits, turning ``loop`` meanwhile (or, with nothing of its own to
        run, waiting for the threads' results)."""
        some, none_left = self._some, self._none_left
        while not some.is_set():
            if loop.busy:
                loop.turn(None, news=some.is_set)
            else:
                some.wait()
        until = time.monotonic() + window
        while not none_left.is_set() and (left := until - time.monotonic()) > 0:
            if loop.busy:
                loop.turn(left, news=none_left.is_set)
            else:
                none_left.wait(left)


def _batches_collect(pool: _Deliveries) -> None:
    """Wait until a delivery completes, then finish every delivery that completed meanwhile
    (within APPLY_WINDOW_SECONDS), each batch's in one transaction: a crash then re-delivers
    little more than what was in flight, and finishing stays cheap. A delivery that raised
    (a bug: adapters' failures are results) is raised once the others are recorded."""
    by_batch: dict[_Batch, list[Finish]] = {}
    errors: list[BaseException] = []
    for batch, result, error in pool.collect(APPLY_WINDOW_SECONDS):
        batch.pending -= 1
        if error is not None:
            errors.append(error)
        elif result is not None:
            by_batch.setdefault(batch, []).append(result)
    for batch, results in by_batch.items():
        batch._finish_durably(results)
    if errors:
        raise errors[0]


@dataclass(eq=False)  # a batch is itself, whatever its fields hold (a key of the finish)
class _Batch:
    """One claimed batch: resolve, record, deliver and finish its rows."""

    worker_id: str
    clock: DatabaseClock
    contexts: dict[str, _TypeContext]
    channels: dict[str, Channel]
    report: PassReport
    streaks: _Streaks = field(default_factory=_Streaks)
    pace: _Pace = field(default_factory=_Pace)
    pending: int = 0  # deliveries queued or running

    def start(self, claim: Claim, *, pool: _Deliveries, stop: threading.Event, deadline: float) -> None:
        """Resolve, record the attempts, finish the rows that cannot be delivered, and queue the
        deliveries of the rest on ``pool`` (``pending``; finished by :func:`_batches_collect`)."""
        rows = claim.rows
        lease_deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS
        for row in rows:
            if row.type not in self.contexts:
                self.contexts[row.type] = _TypeContext(row.type, self.channels.get(row.type))
        plans = self._plan(rows)
        attempts = delivery_attempts_record(
            worker_id=self.worker_id, notifications=[row for row, _, _ in plans], now=self.clock.now()
        )

        # Stop starting deliveries well before the lease runs out, so a slow batch never
        # overlaps a re-claim by another worker; the margin covers one delivery's network calls.
        lease = settings.OUTBOX_LEASE_SECONDS
        timeout_margin = max((getattr(c.session, "timeout", 10) for c in self.contexts.values()), default=10) * 4
        start_by = min(deadline, lease_deadline - min(timeout_margin, lease / 2))
        # Left of the lease when a delivery must be over: time to record its result.
        lease_margin = min(10.0, lease / 10)

        def finish(row: Notification, outcome: DeliveryOutcome) -> Finish:
            return Finish(
                notification=row,
                attempt=attempts[row.pk],
                outcome=outcome,
                channel=self.contexts[row.type].channel,
                probe=row.pk in claim.probes,
            )

        streaks = self.streaks

        def deliver(row: Notification, targets: list[str]) -> Finish:
            return steps_run(deliver_steps(row, targets))

        def deliver_steps(row: Notification, targets: list[str]) -> Steps[Finish]:
            context = self.contexts[row.type]
            assert context.session is not None, "rows without a session are finished before delivery"
            channel = context.channel
            # An open channel takes no attempts but its probe, and neither does one that has
            # just failed often enough to open (its results may not be recorded yet): rows wait.
            with streaks.lock:
                failing = streaks.counts.get(row.type, 0) >= channel.policy.breaker_threshold
            if row.pk not in claim.probes and (channel.halted or failing):
                return finish(row, DeliveryOutcome(started=False))
            if stop.is_set() or time.monotonic() >= start_by:
                return finish(row, DeliveryOutcome(started=False))
            # No wait of the adapter's may outlive the claim: another worker would send again.
            with delivery_deadline(lease_deadline - lease_margin):
                outcome = yield from notification_deliver_steps(
                    notification=row, targets=targets, session=context.session
                )
            if outcome.adapter_called:
                self.pace.observe(outcome.duration_ms)
            failure = outcome.error.failure_class if outcome.error is not None else None
            with streaks.lock:
                if failure in CHANNEL_FAILURES:
                    streaks.counts[row.type] = streaks.counts.get(row.type, 0) + 1
                elif failure is None or failure in HEALTHY_FAILURES:
                    streaks.counts[row.type] = 0
            return finish(row, outcome)

        early: list[Finish] = []
        for row, targets, error in plans:
            if error is not None:
                early.append(finish(row, DeliveryOutcome(error=error)))
            elif settings.OUTBOX_DELIVERY_LOOP and getattr(self.contexts[row.type].session, "runs_steps", False):
                pool.submit_steps(self, deliver_steps, row, targets)
            else:
                pool.submit(self, deliver, row, targets)
        if early:
            self._finish_durably(early)

    def _plan(self, rows: list[Notification]) -> list[tuple[Notification, list[str], DeliveryError | None]]:
        """Each row with its targets, resolved now (one query per type), or the error that
        stops it before delivery."""
        plans: list[tuple[Notification, list[str], DeliveryError | None]] = []
        by_type: dict[str, list[Notification]] = {}
        for row in rows:
            by_type.setdefault(row.type, []).append(row)
        for type_name, typed_rows in by_type.items():
            context = self.contexts[type_name]
            resolved: dict[str, list[str]] = {}
            if context.error is None and context.adapter is not None:
                resolved = context.adapter.resolve_targets(list_names={row.list_name for row in typed_rows})
            for row in typed_rows:
                if context.error is not None:
                    plans.append((row, [], context.error))
                elif row.list_name not in resolved:
                    # An unknown list cannot be guessed: fail closed.
                    error = DeliveryError(
                        f"Unknown notification list {row.list_name!r}.", failure_class=FailureClass.CONFIGURATION
                    )
                    plans.append((row, [], error))
                elif not resolved[row.list_name]:
                    error = DeliveryError(
                        f"Notification list {row.list_name!r} has no {type_name} recipients.",
                        failure_class=FailureClass.CONFIGURATION,
                    )
                    plans.append((row, [], error))
                else:
                    plans.append((row, resolved[row.list_name], None))
        return plans

    def _finish_durably(self, outcomes: list[Finish]) -> None:
        deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS / 2
        while True:
            try:
                finished = notifications_finish(worker_id=self.worker_id, outcomes=outcomes, now=self.clock.now())
            except (OperationalError, InterfaceError):
                if time.monotonic() > deadline:
                    raise
                logger.warning("database unavailable while recording %d results; retrying", len(outcomes))
                connection.close()
                time.sleep(APPLY_RETRY_SECONDS)
            else:
                self.report.add(finished)
                return
