"""Dispatch (DESIGN §4): claim due notifications, deliver them, apply the results.

* **Claim.** Due rows are claimed in one short transaction (``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL, so workers never wait for each other) by stamping a lease: ``claimed_by`` and
  ``claimed_until``. The transaction commits before any network I/O. A row whose lease has
  expired is due again, so a crashed worker's rows are picked up by the next pass — nothing is
  ever left invisible. On SQLite there is no ``SKIP LOCKED``; the IMMEDIATE transaction
  serialises claims instead, which is correct but meant for one worker.
* **Deliver.** Lists are resolved now, at delivery time; every attempt is recorded before the
  network call; delivery runs on a bounded thread pool through the adapter's session, which
  reuses connections across the batch.
* **Apply.** Each row is finished with a conditional update — only if this worker still holds
  it and its status is the one it claimed — so an operator's action or another worker's
  re-claim after a lease expiry is never overwritten.
"""

import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from notifications.adapters import adapter_for
from notifications.adapters.base import DeliveryError, DeliveryResult
from notifications.clock import database_now
from notifications.models import DeliveryAttempt, Notification

logger = logging.getLogger(__name__)
Status = Notification.Status

CLAIM_FIELDS = ("notification_id", "type", "list_name", "subject", "body", "type_data", "status",
                "retry_count", "claimed_by", "claimed_until")  # fmt: skip


def worker_id_new(prefix="dispatch"):
    """A worker id unique across hosts, processes and passes (fits ``claimed_by``)."""
    return f"{prefix}:{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def notifications_due_q(now):
    """The rule for "due": not terminal, its next attempt time has come, and no live lease.

    A Pending row with no next attempt time (created by hand) counts as due, never as lost.
    """
    return (
        Q(status__in=Notification.NON_TERMINAL)
        & (Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True))
        & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    )


def notifications_claim_due(*, worker_id, limit, now=None, lease_seconds=None):
    """Claim up to ``limit`` due notifications for ``worker_id``, oldest due first.

    Returns the claimed rows (with the fields delivery needs). The claim is committed when
    this returns; the lease lasts ``lease_seconds`` (default OUTBOX_LEASE_SECONDS).
    """
    now = now or database_now()
    until = now + timedelta(seconds=lease_seconds or settings.OUTBOX_LEASE_SECONDS)
    with transaction.atomic():
        candidates = Notification.objects.filter(notifications_due_q(now)).order_by(
            F("next_attempt_at").asc(nulls_first=True)
        )
        if connection.features.has_select_for_update_skip_locked:
            candidates = candidates.select_for_update(skip_locked=True)
        rows = list(candidates.only(*CLAIM_FIELDS)[:limit])
        if rows:
            Notification.objects.filter(pk__in=[row.pk for row in rows]).update(
                claimed_by=worker_id, claimed_until=until
            )
    for row in rows:
        row.claimed_by, row.claimed_until = worker_id, until
    return rows


@dataclass
class DeliveryOutcome:
    """What happened to one claimed notification. Exactly one of ``result`` / ``error`` is set,
    unless the delivery was never started (``started`` False: the pass ran out of time)."""

    result: DeliveryResult | None = None
    error: DeliveryError | None = None
    started_at: object = None
    duration_ms: int = 0
    started: bool = True

    @property
    def delivered(self):
        return self.result is not None


def notification_deliver(*, notification, targets, session):
    """Deliver one notification through an open adapter session; never raises for delivery
    failures (they are returned as ``DeliveryOutcome.error``)."""
    started_at = timezone.now()
    clock = time.monotonic()
    try:
        result, error = session.deliver(notification, targets), None
    except DeliveryError as exc:
        result, error = None, exc
    except Exception as exc:  # a bug in an adapter must not kill the pass or lose the row
        logger.exception("adapter crashed delivering %s", notification.pk)
        result, error = None, DeliveryError(f"Adapter error: {type(exc).__name__}: {exc}", permanent=False)
    return DeliveryOutcome(result=result, error=error, started_at=started_at,
                           duration_ms=int((time.monotonic() - clock) * 1000))  # fmt: skip


def notification_apply_result(*, notification, outcome, worker_id, policy, now=None):
    """Finish one claimed notification with its delivery outcome (DESIGN §4).

    success → Delivered; transient → Retrying after the fixed interval, or Parked once
    ``retry_count`` reaches the maximum ("retries exhausted"); permanent → Parked with the
    reason. ``policy`` is the type's RetryPolicy (None: not configured, so never retried).
    Returns True if the row was changed, False if this worker no longer holds it (an operator
    or another worker got there first; their state stands).
    """
    changes, _ = _finish_changes(notification=notification, outcome=outcome, policy=policy, now=now or database_now())
    updated = Notification.objects.filter(
        pk=notification.pk, status=notification.status, claimed_by=worker_id
    ).update(**changes)
    return updated == 1


def _finish_changes(*, notification, outcome, policy, now):
    """The column changes that finish ``notification``, and what they amount to: "delivered",
    "retrying" or "parked"."""
    changes = {"claimed_by": "", "claimed_until": None, "last_attempt_at": outcome.started_at or now}
    if outcome.delivered:
        changes.update(status=Status.DELIVERED, delivered_at=now, next_attempt_at=None,
                       resolved_targets=outcome.result.targets, last_error=outcome.result.warning)  # fmt: skip
        return changes, "delivered"
    error = outcome.error
    failed = notification.retry_count + 1
    changes["retry_count"] = failed
    if error.targets:
        changes["resolved_targets"] = error.targets
    if error.permanent:
        message = f"Permanent failure: {error.message}"
    elif policy is None:
        message = f"Permanent failure: type {notification.type!r} has no retry configuration: {error.message}"
    elif failed >= policy.max_retries:
        message = f"Retries exhausted ({failed} failed attempts): {error.message}"
    else:
        changes.update(status=Status.RETRYING, next_attempt_at=now + timedelta(seconds=policy.interval_seconds),
                       last_error=f"Transient failure (attempt {failed} of {policy.max_retries}): "
                                  f"{error.message}"[:4000])  # fmt: skip
        return changes, "retrying"
    changes.update(status=Status.PARKED, next_attempt_at=None, last_error=message[:4000])
    return changes, "parked"


@dataclass
class PassReport:
    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    parked: int = 0
    released: int = 0
    lost: int = 0  # finished by someone else meanwhile (lease expired and re-claimed, …)
    batches: int = 0
    seconds: float = 0.0
    more_due: bool = False  # stopped by the time budget or a stop request with rows still due
    errors: dict = field(default_factory=dict)

    def __str__(self):
        return (f"claimed {self.claimed}, delivered {self.delivered}, retrying {self.retrying}, "
                f"parked {self.parked}, released {self.released} in {self.seconds:.2f} s")  # fmt: skip


class _TypeContext:
    """Per pass and type: the adapter, its retry policy and an open session (or why not)."""

    def __init__(self, type_name):
        self.policy, self.session, self.error = None, None, None
        try:
            self.adapter = adapter_for(type_name)
        except KeyError:
            self.adapter = None
            # No adapter: nothing can deliver this type, now or later.
            self.error = DeliveryError(f"No adapter is registered for type {type_name!r}.", permanent=True)
            return
        self.policy = self.adapter.retry_policy()
        try:
            self.session = self.adapter.open_session()
        except DeliveryError as exc:
            self.error = exc

    def close(self):
        if self.session is not None:
            self.session.close()


def dispatch_pass(*, worker_id, time_budget, stop=None, batch_size=None, concurrency=None, progress=None):
    """Claim and deliver batches until nothing is due, ``time_budget`` seconds have passed, or
    ``stop`` (a threading.Event) is set. Returns a :class:`PassReport`.

    No delivery starts after the budget (or after a batch's lease is close to expiry);
    deliveries already started finish, and rows not started are released to be due again.
    """
    batch_size = batch_size or settings.OUTBOX_BATCH_SIZE
    concurrency = concurrency or settings.OUTBOX_CONCURRENCY
    stop = stop or threading.Event()
    started = time.monotonic()
    deadline = started + time_budget
    report = PassReport()
    contexts = {}
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="deliver") as pool:
            while not stop.is_set() and time.monotonic() < deadline:
                rows = notifications_claim_due(worker_id=worker_id, limit=batch_size)
                if not rows:
                    break
                report.batches += 1
                report.claimed += len(rows)
                _dispatch_batch(rows, worker_id=worker_id, pool=pool, contexts=contexts, stop=stop,
                                deadline=deadline, report=report)  # fmt: skip
                if progress:
                    progress(report)
                if len(rows) < batch_size:
                    break  # drained; the next trigger or sweep picks up what arrives later
            else:
                report.more_due = Notification.objects.filter(notifications_due_q(database_now())).exists()
    finally:
        for context in contexts.values():
            context.close()
    report.seconds = time.monotonic() - started
    return report


def _dispatch_batch(rows, *, worker_id, pool, contexts, stop, deadline, report):
    lease_deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS
    for row in rows:
        if row.type not in contexts:
            contexts[row.type] = _TypeContext(row.type)

    # Resolve targets now (delivery time), one query per type.
    plans = []  # (row, targets or None, early DeliveryError or None)
    by_type = {}
    for row in rows:
        by_type.setdefault(row.type, []).append(row)
    for type_name, typed_rows in by_type.items():
        context = contexts[type_name]
        resolved = {}
        if context.error is None:
            resolved = context.adapter.resolve_targets(list_names={row.list_name for row in typed_rows})
        for row in typed_rows:
            if context.error is not None:
                plans.append((row, None, context.error))
            elif row.list_name not in resolved:
                # An unknown list cannot be guessed: fail closed.
                plans.append((row, None, DeliveryError(f"Unknown notification list {row.list_name!r}.",
                                                       permanent=True)))  # fmt: skip
            elif not resolved[row.list_name]:
                plans.append((row, None, DeliveryError(
                    f"Notification list {row.list_name!r} has no {type_name} recipients.", permanent=True)))
            else:
                plans.append((row, resolved[row.list_name], None))

    # Record every attempt before any network call.
    now = timezone.now()
    attempts = DeliveryAttempt.objects.bulk_create(
        [DeliveryAttempt(notification_id=row.pk, started_at=now, worker=worker_id[:64]) for row, _, _ in plans]
    )
    attempt_for = {row.pk: attempt for (row, _, _), attempt in zip(plans, attempts)}
    row_for = {row.pk: row for row, _, _ in plans}

    # Stop starting deliveries well before the lease runs out, so a slow batch never overlaps
    # a re-claim by another worker; the margin covers one delivery's network calls.
    lease = settings.OUTBOX_LEASE_SECONDS
    timeout_margin = max((getattr(c.session, "timeout", 10) for c in contexts.values()), default=10) * 4
    start_by = min(deadline, lease_deadline - min(timeout_margin, lease / 2))

    def deliver(row, targets):
        if stop.is_set() or time.monotonic() >= start_by:
            return row.pk, DeliveryOutcome(started=False)
        return row.pk, notification_deliver(notification=row, targets=targets, session=contexts[row.type].session)

    early, futures = [], set()
    for row, targets, error in plans:
        if error is not None:
            early.append((row.pk, DeliveryOutcome(error=error, started_at=now)))
        else:
            futures.add(pool.submit(deliver, row, targets))
    # The database clock, read once per batch: one query per batch instead of one per result.
    clock_offset = database_now() - timezone.now()
    finish = dict(worker_id=worker_id, rows=row_for, attempts=attempt_for, contexts=contexts, report=report,
                  clock_offset=clock_offset)  # fmt: skip
    if early:
        _apply_outcomes_durably(early, **finish)
    # Apply results as deliveries complete, all that completed meanwhile in one transaction:
    # a crash then re-delivers little more than what was in flight, and the batch stays cheap.
    while futures:
        done, futures = wait(futures, return_when=FIRST_COMPLETED)
        if futures:
            # Gather what completes within a few milliseconds more: one transaction (and one
            # fsync) for many results, while the crash window stays this short.
            more, futures = wait(futures, timeout=APPLY_WINDOW_SECONDS)
            done |= more
        _apply_outcomes_durably([future.result() for future in done], **finish)


# While the database is briefly unavailable (a failover, a restart), results of deliveries that
# already happened are held and re-applied: dropping them would let the lease expire and the
# message be sent a second time. Bounded well inside the lease.
APPLY_RETRY_SECONDS = 0.5
APPLY_WINDOW_SECONDS = 0.02


def _apply_outcomes_durably(outcomes, **finish):
    deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS / 2
    while True:
        try:
            return _apply_outcomes(outcomes, **finish)
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            logger.warning("database unavailable while recording %d results; retrying", len(outcomes))
            connection.close()
            time.sleep(APPLY_RETRY_SECONDS)


def _apply_outcomes(outcomes, *, worker_id, rows, attempts, contexts, report, clock_offset=timedelta(0)):
    """Finish rows and their attempts in one transaction. Rows with identical changes share one
    conditional UPDATE (in a healthy batch: every row delivered to the same list)."""
    now = timezone.now() + clock_offset
    groups = {}
    finished_attempts, unstarted = [], []
    for pk, outcome in outcomes:
        row = rows[pk]
        if not outcome.started:
            changes, kind = {"claimed_by": "", "claimed_until": None}, "released"
            unstarted.append(attempts[pk].pk)
        else:
            changes, kind = _finish_changes(notification=row, outcome=outcome, policy=contexts[row.type].policy,
                                            now=now)  # fmt: skip
            changes["last_attempt_at"] = attempts[pk].started_at  # when the attempt was recorded
            _attempt_finish(attempts[pk], outcome)
            finished_attempts.append(attempts[pk])
        key = (row.status, kind, json.dumps(changes, sort_keys=True, default=str))
        groups.setdefault(key, (changes, []))[1].append(pk)
    with transaction.atomic():
        for (claimed_status, kind, _), (changes, pks) in groups.items():
            updated = Notification.objects.filter(pk__in=pks, status=claimed_status, claimed_by=worker_id).update(
                **changes
            )
            setattr(report, kind, getattr(report, kind) + updated)
            report.lost += len(pks) - updated
        if unstarted:
            DeliveryAttempt.objects.filter(pk__in=unstarted).delete()
        if finished_attempts:
            _attempts_save(finished_attempts)


ATTEMPT_FIELDS = ("started_at", "duration_ms", "outcome", "error", "detail")


def _attempts_save(attempts):
    """Write the finished attempts. On PostgreSQL one UPDATE … FROM jsonb_to_recordset: Django's
    bulk_update builds a CASE per row and field, which cost more than the deliveries."""
    if connection.vendor != "postgresql":
        DeliveryAttempt.objects.bulk_update(attempts, list(ATTEMPT_FIELDS), batch_size=200)
        return
    document = json.dumps([
        {"id": a.pk, "started_at": a.started_at.isoformat(), "duration_ms": a.duration_ms, "outcome": a.outcome,
         "error": a.error, "detail": a.detail} for a in attempts
    ])  # fmt: skip
    table = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS a SET started_at = r.started_at, duration_ms = r.duration_ms, outcome = r.outcome, "
            "error = r.error, detail = r.detail "
            "FROM jsonb_to_recordset(%s::jsonb) AS r(id bigint, started_at timestamptz, duration_ms integer, "
            "outcome text, error text, detail jsonb) WHERE a.id = r.id",
            [document],
        )


def _attempt_finish(attempt, outcome):
    attempt.started_at = outcome.started_at or attempt.started_at
    attempt.duration_ms = outcome.duration_ms
    if outcome.delivered:
        attempt.outcome = DeliveryAttempt.Outcome.SUCCESS
        attempt.error = outcome.result.warning
        attempt.detail = outcome.result.detail
    else:
        error = outcome.error
        attempt.outcome = DeliveryAttempt.Outcome.PERMANENT if error.permanent else DeliveryAttempt.Outcome.TRANSIENT
        attempt.error = error.message[:4000]
        attempt.detail = error.detail
