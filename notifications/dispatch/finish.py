"""Finishing claimed notifications (docs/architecture.md, "How a notification is delivered").

:func:`notifications_finish` is the one way a claimed row is finished. Each row changes only if
this worker still holds it and its status is the one it claimed, so an operator's action or
another worker's re-claim after a lease expiry is never overwritten. What a failure leads to is
the channel's delivery policy's rule (notifications.policies); the outcomes also feed the
channel's breaker (notifications.health) and the delivery metrics.

One time stands for an attempt: the moment it was recorded (:func:`delivery_attempts_record`,
just before its batch's deliveries start, on the database clock). It is the attempt's
``started_at`` and, once the attempt is finished, the row's ``last_attempt_at``;
``duration_ms`` is the adapter call's own duration.
"""

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from notifications import db
from notifications.adapters.base import DeliveryError, DeliveryResult
from notifications.clock import database_now
from notifications.failure_shape import Evidence, attempt_delivered, attempt_evidence
from notifications.health import Channel, channel_health_record, channel_shape_observe
from notifications.metrics import deliveries_observe
from notifications.models import DeliveryAttempt, Notification, ProviderMessage
from notifications.policies import delivery_failure_decide
from notifications.providers import provider_statuses_reapply
from notifications.vocabulary import CHANNEL_FAILURES, TargetOutcome, target_outcome

# The dispatcher logs under one name, whichever of its modules writes.
logger = logging.getLogger(__package__)
Status = Notification.Status

# The columns finishing an attempt writes.
ATTEMPT_RESULT_FIELDS = ("duration_ms", "outcome", "failure_class", "error", "detail", "targets_delivered")
MAX_ERROR_LENGTH = 4000


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
    finishes = list(outcomes)
    grouped = _Grouped(shapes=_shapes_judge(finishes, now=now))
    for item in finishes:
        grouped.add(item, now=now)
    report = FinishReport()
    with transaction.atomic():
        applied = _groups_apply(grouped.groups, worker_id=worker_id, report=report)
        if grouped.unstarted:
            DeliveryAttempt.objects.filter(
                pk__in=grouped.unstarted, outcome=DeliveryAttempt.Outcome.IN_PROGRESS
            ).delete()
        db.update_by_pk(grouped.attempts, ATTEMPT_RESULT_FIELDS)
        provider_messages_record(outcomes=finishes)
    _channels_health_record(grouped.channels.values(), worker_id=worker_id, now=now)
    _finished_log(worker_id=worker_id, finished=applied.logged, outcomes=grouped.outcomes)
    try:
        deliveries_observe(
            finished=applied.counted, durations=grouped.durations, delivered_created=applied.delivered_created, now=now
        )
    except Exception:  # the results are recorded; metrics must never cost a pass
        logger.exception("could not record delivery metrics")
    return report


# A group of rows that one conditional UPDATE finishes: (channel, claimed status, kind, the
# changes as JSON text).
GroupKey = tuple[str, str, str, str]


@dataclass
class _Shapes:
    """The finish's rows whose failure was their endpoint's relay-wide answer (the answer, by
    row id), and their attempts of it charged before it was recognised (given back)."""

    relay_wide: dict[str, str] = field(default_factory=dict)
    earlier: dict[str, int] = field(default_factory=dict)


def _shapes_judge(finishes: list[Finish], *, now: datetime) -> _Shapes:
    """What the finish's failed attempts say about their endpoints' answers, judged per
    channel under its health row's lock (:func:`~notifications.health.channel_shape_observe`),
    before the rows are finished: a failure that is the endpoint's is a channel failure."""
    evidence: dict[str, list[Evidence]] = {}
    channels: dict[str, Channel] = {}
    delivered: set[str] = set()
    for item in finishes:
        outcome, channel = item.outcome, item.channel
        if not outcome.started or channel.endpoint is None:
            continue
        if outcome.result is not None or (outcome.error is not None and attempt_delivered(outcome.error.detail)):
            delivered.add(channel.name)
        found = (
            None
            if outcome.error is None
            else attempt_evidence(notification_id=item.notification.pk, error=outcome.error)
        )
        if found is not None:
            evidence.setdefault(channel.name, []).append(found)
            channels[channel.name] = channel
    shapes = _Shapes()
    for name, found_here in evidence.items():
        verdict = channel_shape_observe(
            channel=channels[name], evidence=found_here, delivered=name in delivered, now=now
        )
        if verdict.signature:
            shapes.relay_wide.update(
                {item.notification_id: verdict.signature for item in found_here if verdict.signature in item.answers}
            )
            shapes.earlier.update(verdict.earlier)
    return shapes


@dataclass
class _ChannelSeen:
    """What one finish learned of a channel: every started attempt's failure class (None for
    a success) but those that were the endpoint's relay-wide answer (counted as ``shaped``),
    the messages of its channel failures, and whether a target accepted a message."""

    channel: Channel
    classes: list[str | None] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    shaped: int = 0
    delivered: bool = False


@dataclass
class _Grouped:
    """The rows of one finish grouped by identical changes, and what else the finish writes:
    the attempts finished, those of rows never started, durations, what each channel saw."""

    shapes: _Shapes = field(default_factory=_Shapes)
    groups: dict[GroupKey, tuple[dict[str, Any], list[Notification]]] = field(default_factory=dict)
    attempts: list[DeliveryAttempt] = field(default_factory=list)
    unstarted: list[Any] = field(default_factory=list)
    durations: list[tuple[str, float]] = field(default_factory=list)
    channels: dict[str, _ChannelSeen] = field(default_factory=dict)
    outcomes: dict[Any, DeliveryOutcome] = field(default_factory=dict)
    # A delivered row's changes follow from its channel, claimed status, targets' outcomes,
    # warning and attempt time: rows equal in those to the row before (a healthy batch: all of
    # them) join its group without their changes being built and written out again.
    _previous: tuple[Any, ...] | None = None
    _previous_key: GroupKey | None = None

    def add(self, item: Finish, *, now: datetime) -> None:
        row, attempt, outcome = item.notification, item.attempt, item.outcome
        self.outcomes[row.pk] = outcome
        seen = self.channels.get(item.channel.name)
        if seen is None:
            seen = self.channels[item.channel.name] = _ChannelSeen(item.channel)
        if not outcome.started:
            self.unstarted.append(attempt.pk)
            self._group(item, {"claimed_by": "", "claimed_until": None}, "released", inputs=None)
            return
        inputs = None
        if outcome.result is not None:
            inputs = (item.channel.name, row.status, outcome.result.targets, outcome.result.warning, attempt.started_at)
        if inputs is not None and inputs == self._previous and self._previous_key is not None:
            kind = "delivered"
            self.groups[self._previous_key][1].append(row)
        else:
            changes, kind = _finish_changes(
                notification=row,
                outcome=outcome,
                channel=item.channel,
                now=now,
                relay_wide=self.shapes.relay_wide.get(str(row.pk), ""),
                given_back=self.shapes.earlier.get(str(row.pk), 0),
            )
            changes["last_attempt_at"] = attempt.started_at
            self._group(item, changes, kind, inputs=inputs)
        _attempt_finish(attempt, outcome, kind=kind, probe=item.probe)
        self.attempts.append(attempt)
        if outcome.adapter_called:
            self.durations.append((item.channel.name, outcome.duration_ms / 1000))
        self._seen(seen, row, outcome)

    def _seen(self, seen: "_ChannelSeen", row: Notification, outcome: DeliveryOutcome) -> None:
        """Add a started attempt's outcome to what the finish saw of its channel."""
        error = outcome.error
        seen.delivered = seen.delivered or error is None or attempt_delivered(error.detail)
        relay_wide = self.shapes.relay_wide.get(str(row.pk))
        if error is not None and relay_wide:
            seen.shaped += 1
            seen.messages.append(f"relay-wide {relay_wide}: {error.message}")
            return
        seen.classes.append(None if error is None else error.failure_class)
        if error is not None and error.failure_class in CHANNEL_FAILURES:
            seen.messages.append(error.message)

    def _group(self, item: Finish, changes: dict[str, Any], kind: str, *, inputs: tuple[Any, ...] | None) -> None:
        # Text from remote servers (replies, refusals) must not make the transaction fail.
        changes, text = db.storable_with_text(changes)
        key = (item.channel.name, item.notification.status, kind, text)
        self.groups.setdefault(key, (changes, []))[1].append(item.notification)
        self._previous, self._previous_key = inputs, key


@dataclass
class _Applied:
    """What the conditional updates of one finish changed: rows per channel and kind (for the
    metrics), the ingest times of the rows delivered, and each row with what it came to (for
    the log)."""

    counted: list[tuple[str, str, int]] = field(default_factory=list)
    delivered_created: list[datetime] = field(default_factory=list)
    logged: list[tuple[Notification, str, str]] = field(default_factory=list)


def _groups_apply(
    groups: dict[GroupKey, tuple[dict[str, Any], list[Notification]]], *, worker_id: str, report: FinishReport
) -> _Applied:
    """One conditional UPDATE per group: only rows ``worker_id`` still holds in the status
    they were claimed with change; the others count as lost."""
    applied = _Applied()
    for (channel_name, claimed_status, kind, _), (changes, rows) in groups.items():
        updated = Notification.objects.filter(
            db.pk_in([row.pk for row in rows]), status__equals_unindexed=claimed_status, claimed_by=worker_id
        ).update(**changes)
        setattr(report, kind, getattr(report, kind) + updated)
        report.lost += len(rows) - updated
        if kind != "released":
            applied.counted.append((channel_name, kind, updated))
        if kind == "delivered":
            # Which rows of a partly lost group were delivered is not known; as many are timed.
            applied.delivered_created += [row.created_at for row in rows[:updated]]
        said = kind if updated == len(rows) else f"{kind} or lost"
        applied.logged += [(row, channel_name, said) for row in rows]
    return applied


def _channels_health_record(seen: Iterable[_ChannelSeen], *, worker_id: str, now: datetime) -> None:
    """Record what the finish saw of each channel on its health (its breaker)."""
    for channel_seen in seen:
        channel, classes = channel_seen.channel, channel_seen.classes
        # A healthy channel without channel failures (and without answers watched for a shape
        # that a delivery now ends) has nothing to record: no write, no lock.
        failing = channel_seen.shaped or any(c in CHANNEL_FAILURES for c in classes)
        if channel.endpoint is None or not (
            failing or not channel.clean or (channel.tracking and channel_seen.delivered)
        ):
            continue
        messages = channel_seen.messages
        channel_health_record(
            channel=channel,
            failure_classes=classes,
            worker_id=worker_id,
            now=now,
            last_error=db.storable(messages[-1]) if messages else "",
            shaped=channel_seen.shaped,
            delivered=channel_seen.delivered,
        )


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
    *,
    notification: Notification,
    outcome: DeliveryOutcome,
    channel: Channel,
    now: datetime,
    relay_wide: str = "",
    given_back: int = 0,
) -> tuple[dict[str, Any], str]:
    """The column changes that finish ``notification`` after a started delivery, and what they
    amount to: "delivered", "retrying" or "parked". ``relay_wide``: the failure was its
    endpoint's relay-wide answer (a channel failure); ``given_back``: earlier attempts of that
    answer, charged to the row before it was recognised, that become channel failures too."""
    changes: dict[str, Any] = {"claimed_by": "", "claimed_until": None}
    if outcome.result is not None:
        changes.update(
            status=Status.DELIVERED,
            delivered_at=now,
            next_attempt_at=None,
            resolved_targets=outcome.result.targets,
            targets_refused=_refused(outcome.result.targets),
            last_error=outcome.result.warning,
            failure_code="",
        )
        return changes, "delivered"
    error = outcome.error
    assert error is not None, "a started delivery has a result or an error"
    channel_failure = error.failure_class in CHANNEL_FAILURES or bool(relay_wide)
    failed = notification.retry_count + 1
    channel_failures = min(notification.channel_failures + (1 + given_back if channel_failure else 0), failed)
    decision = delivery_failure_decide(
        policy=channel.policy,
        failure_class=error.failure_class,
        message=error.message,
        row_failures=failed - channel_failures,
        queued_at=notification.requeued_at or notification.created_at,
        now=now,
        rand=random.random(),
        outcome_unknown=error.outcome_unknown,
        relay_wide=relay_wide,
    )
    changes.update(
        retry_count=failed,
        channel_failures=channel_failures,
        status=decision.status,
        next_attempt_at=decision.next_attempt_at,
        last_error=decision.last_error,
        failure_code=error.code,
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


def _delivered(targets: list[dict[str, Any]]) -> int:
    """How many targets have the notification (accepted it, in this attempt or an earlier one)."""
    return sum(1 for entry in targets if isinstance(entry, dict) and target_outcome(entry) == TargetOutcome.DELIVERED)


def _attempt_finish(attempt: DeliveryAttempt, outcome: DeliveryOutcome, *, kind: str, probe: bool) -> None:
    attempt.duration_ms = outcome.duration_ms
    if outcome.result is not None:
        attempt.outcome = DeliveryAttempt.Outcome.SUCCESS
        attempt.error = outcome.result.warning
        attempt.detail = outcome.result.detail
        attempt.targets_delivered = _delivered(outcome.result.targets)
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
        # Failed for the targets still owed it while others have it: part of a partial
        # delivery (the failed trend counts it apart from outages), not a failure of the channel.
        attempt.targets_delivered = _delivered(error.targets)
    if probe:
        attempt.detail = {**attempt.detail, "probe": True}
