"""Channel health (docs/architecture.md): the circuit breaker and the rate bucket of each channel
endpoint, kept in the database (:class:`~notifications.models.ChannelHealth`) so that every
worker on every host agrees.

* **Breaker.** ``breaker_threshold`` consecutive channel failures (connection, timeout, auth,
  throttled) open the endpoint. While it is open its rows are not claimed, so they are neither
  attempted nor charged an attempt; they wait. Once ``probe_after`` has passed, exactly one
  worker takes one row as a *probe* (a lease on the health row says who). A probe that
  succeeds — or gets any answer proving the channel works, such as a refused recipient —
  closes the endpoint; a probe that fails opens it again with the cool-down doubled, up to
  ``breaker_max_cooldown_seconds``. Any success while open closes it too.
* **Rate.** With ``rate_per_minute`` set, claims take tokens from the endpoint's bucket, which
  refills at that rate and holds at most one second's worth (at least one token). Rows that
  find no token stay due and are taken by a later claim: they wait, they do not fail.

* **Shape.** An endpoint that answers every recipient or target alike with a "not now" of the
  provider (Postfix's ``451 4.3.5`` while a lookup table is down, a proxy's ``503``) fails as a
  channel although no attempt has a channel class (notifications.failure_shape):
  :func:`channel_shape_observe` recognises it, the breaker opens and the rows wait uncharged.
* **Configuration.** Health follows the configuration: the rows of endpoints no longer
  configured are dropped (:func:`channel_health_prune`), a saved configuration lets the
  endpoint be probed at once (:func:`channel_health_reset`), and an operator may close an
  endpoint with a reason (:func:`channel_health_close`).

Every change is a short transaction that locks the endpoint's row (``SELECT … FOR UPDATE``),
taken by claims before the notification rows they lock, so workers never deadlock.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Least, Now

from notifications.adapters import adapter_for
from notifications.clock import database_now
from notifications.counts import counts_kept, queued_by_channel
from notifications.failure_shape import SHAPE_WINDOW_SECONDS, Evidence, ShapeTracker
from notifications.models import ChannelHealth, Notification
from notifications.policies import ChannelPolicy, delivery_policies_all
from notifications.vocabulary import ADAPTER_PATHS, CHANNEL_FAILURES, HEALTHY_FAILURES, FailureClass

State = ChannelHealth.State


@dataclass
class Channel:
    """One channel as a dispatch pass sees it: its endpoint now (None: not configured), its
    policy, and what this pass last learned of its health (``clean``: closed with no failure
    counted, so a success has nothing to record)."""

    name: str
    endpoint: str | None
    policy: ChannelPolicy
    clean: bool = True
    halted: bool = False  # opened during this pass: start no more deliveries on it
    tracking: bool = False  # its answers are watched for a shape: a delivery has something to reset

    @property
    def gated(self) -> bool:
        """Whether claims must consult the health row (breaker or rate limit)."""
        return self.endpoint is not None and (not self.clean or bool(self.policy.rate_per_minute))


def dispatch_channels() -> dict[str, Channel]:
    """Every registered channel with its endpoint, policy and health as stored now. The health
    of endpoints no longer configured is dropped on the way (:func:`channel_health_prune`)."""
    policies = delivery_policies_all()
    channels = {
        name: Channel(name=name, endpoint=adapter_for(name).endpoint(), policy=policies[name]) for name in ADAPTER_PATHS
    }
    channel_health_prune(endpoints={name: channel.endpoint for name, channel in channels.items()})
    channels_refresh(channels)
    return channels


def channels_refresh(channels: dict[str, Channel]) -> None:
    """Read the health of ``channels``' endpoints again (one query on a table of one row per
    endpoint): whether each is clean, whether it is open (halted), and whether its answers are
    being watched for a shape. Claims do this first, so a worker learns at its next claim that
    another worker opened or closed a channel."""
    unhealthy = {
        (name, endpoint): (state, failures, bool(shape))
        for name, endpoint, state, failures, shape in ChannelHealth.objects.filter(
            Q(state__in=[State.OPEN, State.HALF_OPEN]) | Q(consecutive_failures__gt=0) | ~Q(shape={})
        ).values_list("channel", "endpoint", "state", "consecutive_failures", "shape")
    }
    for channel in channels.values():
        state, failures, tracking = unhealthy.get((channel.name, channel.endpoint or ""), (State.CLOSED, 0, False))
        channel.clean = state == State.CLOSED and failures == 0
        channel.halted = state != State.CLOSED
        channel.tracking = tracking


def _health_row_locked(*, channel: str, endpoint: str) -> ChannelHealth:
    """The endpoint's health row, created if missing, locked until the transaction ends."""
    try:
        with transaction.atomic():
            ChannelHealth.objects.get_or_create(channel=channel, endpoint=endpoint)
    except IntegrityError:
        pass  # created by another worker at the same moment
    return ChannelHealth.objects.select_for_update().get(channel=channel, endpoint=endpoint)


def _bucket_capacity(rate_per_minute: int) -> float:
    return float(max(1, math.ceil(rate_per_minute / 60)))


def _refill(health: ChannelHealth, *, rate_per_minute: int, now: datetime) -> None:
    capacity = _bucket_capacity(rate_per_minute)
    if health.rate_refilled_at is None:
        health.rate_tokens = capacity
    else:
        elapsed = max(0.0, (now - health.rate_refilled_at).total_seconds())
        health.rate_tokens = min(capacity, health.rate_tokens + elapsed * rate_per_minute / 60)
    health.rate_refilled_at = now


@dataclass
class Gate:
    """What one claim may take of a gated channel: at most ``limit`` rows; ``probe``: the one
    row taken is the open endpoint's probe. Applied with :func:`channel_gate_settle`."""

    channel: Channel
    health: ChannelHealth
    limit: int
    probe: bool = False
    changed: list[str] = field(default_factory=list)


def channel_gate_open(*, channel: Channel, worker_id: str, now: datetime, lease_until: datetime) -> Gate:
    """Inside the claim's transaction: lock ``channel``'s health row and say how many rows the
    claim may take — none while the endpoint is open (unless this worker may probe: then one),
    and no more than the rate bucket's whole tokens."""
    assert channel.endpoint is not None, "only configured channels are gated"
    health = _health_row_locked(channel=channel.name, endpoint=channel.endpoint)
    gate = Gate(channel=channel, health=health, limit=1_000_000)
    if health.state != State.CLOSED:
        probe_free = health.probe_claimed_until is None or health.probe_claimed_until < now
        if health.probe_after is not None and health.probe_after <= now and probe_free:
            gate.limit, gate.probe = 1, True
            health.state = State.HALF_OPEN
            health.probe_claimed_by = worker_id[:64]
            health.probe_claimed_until = lease_until
            health.probes += 1
            gate.changed += ["state", "probe_claimed_by", "probe_claimed_until", "probes"]
        else:
            gate.limit = 0
    rate = channel.policy.rate_per_minute
    if rate:
        _refill(health, rate_per_minute=rate, now=now)
        gate.limit = min(gate.limit, math.floor(health.rate_tokens))
        gate.changed += ["rate_tokens", "rate_refilled_at"]
    return gate


def channel_gate_settle(gate: Gate, *, taken: int) -> None:
    """Inside the claim's transaction, after the claim: spend ``taken`` tokens, and give the
    probe back if no row was there to probe with."""
    health = gate.health
    if gate.channel.policy.rate_per_minute:
        health.rate_tokens = max(0.0, health.rate_tokens - taken)
    if gate.probe and taken == 0:
        health.state = State.OPEN
        health.probe_claimed_by, health.probe_claimed_until = "", None
        health.probes -= 1
    if gate.changed:
        health.save(update_fields=[*dict.fromkeys(gate.changed), "updated_at"])


def channel_health_record(
    *,
    channel: Channel,
    failure_classes: Iterable[str | None],
    worker_id: str,
    now: datetime,
    last_error: str = "",
    shaped: int = 0,
    delivered: bool = False,
) -> str:
    """Record the outcomes of started deliveries on ``channel`` (None: success) and return the
    endpoint's state afterwards. ``last_error``: the latest channel failure's message;
    ``shaped``: failures (not in ``failure_classes``) that were the endpoint's relay-wide
    answer (:func:`channel_shape_observe`); ``delivered``: a target accepted a message, which
    ends any shape being watched. No outcomes at all: this worker's probe was never started and
    is given back.

    A success, or a healthy failure when none was relay-wide, closes the endpoint; channel
    failures count towards opening it (or re-open it after this worker's failed probe, with a
    doubled cool-down), and a relay-wide answer opens it at once; failures that say nothing
    about the channel (configuration, unknown) change nothing but give a probe back as failed.
    """
    assert channel.endpoint is not None, "only configured channels have health"
    classes = list(failure_classes)
    failures = [c for c in classes if c in CHANNEL_FAILURES]
    healthy = any(c is None for c in classes) or (not shaped and any(c in HEALTHY_FAILURES for c in classes))
    with transaction.atomic():
        health = _health_row_locked(channel=channel.name, endpoint=channel.endpoint)
        probed = health.probe_claimed_by == worker_id[:64] and health.state != State.CLOSED
        if probed:
            health.probe_claimed_by, health.probe_claimed_until = "", None
        if delivered:
            health.shape = {}
        if healthy:
            _closed(health)
        elif failures or shaped:
            _failures_counted(health, policy=channel.policy, now=now, failures=failures, shaped=shaped, probed=probed)
            health.last_error = last_error[:2000]
        elif probed and not classes:
            health.state = State.OPEN  # the probe was never started: another may start at once
        elif probed:
            _probe_failed(health, policy=channel.policy, now=now)
        health.save()
    _learned(channel, health)
    return health.state


def _learned(channel: Channel, health: ChannelHealth) -> None:
    """What a pass knows of ``channel`` after reading or writing its ``health``."""
    channel.clean = health.state == State.CLOSED and health.consecutive_failures == 0
    channel.halted = health.state != State.CLOSED
    channel.tracking = bool(health.shape)


def _closed(health: ChannelHealth) -> None:
    """The endpoint works: closed, counters and the probe reset, no relay-wide answer active."""
    health.state = State.CLOSED
    health.consecutive_failures = 0
    health.cooldown_seconds = 0
    health.opened_at = health.probe_after = None
    health.probes = 0
    health.probe_claimed_by, health.probe_claimed_until = "", None
    if health.shape.get("active"):
        health.shape = ShapeTracker(seen=ShapeTracker.load(health.shape).seen).dump()


def _failures_counted(
    health: ChannelHealth, *, policy: ChannelPolicy, now: datetime, failures: list[str], shaped: int, probed: bool
) -> None:
    """Channel failures (and relay-wide answers) recorded: the endpoint opens once they reach
    the threshold — at once for a relay-wide answer —, or opens again after a failed probe."""
    health.consecutive_failures += len(failures) + shaped
    health.last_failure_class = failures[-1] if failures else FailureClass.PROVIDER_ERROR
    health.last_failure_at = now
    if health.state == State.CLOSED and (shaped or health.consecutive_failures >= policy.breaker_threshold):
        health.state = State.OPEN
        health.opened_at = now
        health.cooldown_seconds = policy.breaker_cooldown_seconds
        health.probe_after = now + timedelta(seconds=health.cooldown_seconds)
        health.probes = 0
    elif probed:
        _probe_failed(health, policy=policy, now=now)


def _probe_failed(health: ChannelHealth, *, policy: ChannelPolicy, now: datetime) -> None:
    health.state = State.OPEN
    health.cooldown_seconds = min(
        max(health.cooldown_seconds, policy.breaker_cooldown_seconds) * 2, policy.breaker_max_cooldown_seconds
    )
    health.probe_after = now + timedelta(seconds=health.cooldown_seconds)


# --- the shape of failures (notifications.failure_shape) -----------------------------------


@dataclass(frozen=True)
class ShapeVerdict:
    """What :func:`channel_shape_observe` decided for one channel: ``signature``, the answer
    that is now the endpoint's failure ("" when none), and per notification of the finish its
    failed attempts of that answer before it was recognised (``earlier``: given back)."""

    signature: str = ""
    earlier: dict[str, int] = field(default_factory=dict)


def channel_shape_observe(
    *, channel: Channel, evidence: list[Evidence], delivered: bool, now: datetime
) -> ShapeVerdict:
    """Add what a finish's failed attempts say (``evidence``) to the answers ``channel``'s
    endpoint is watched for, under its health row's lock, and say which answer is now the
    endpoint's failure. ``delivered``: the finish also delivered on the endpoint, so nothing
    of it is relay-wide: what was watched is forgotten and this evidence is not counted.

    When an answer meets the rule (:func:`~notifications.failure_shape.relay_wide`), the
    attempts of it charged to rows not in this finish are given back: they become channel
    failures (``channel_failures`` + n, never above ``retry_count``), and a row that parked for
    exhausted attempts within the window is waiting again (Retrying), since those attempts were
    the relay's fault; the rows of this finish get theirs back through ``earlier``. A row that
    another worker holds right now keeps its count (its finish writes the row as it claimed it).
    """
    assert channel.endpoint is not None, "only configured channels have health"
    moment = now.timestamp()
    with transaction.atomic():
        health = _health_row_locked(channel=channel.name, endpoint=channel.endpoint)
        # Something got through: nothing watched so far holds, nor does this finish's evidence.
        tracker = ShapeTracker() if delivered else ShapeTracker.load(health.shape)
        tracker.forget_before(moment - SHAPE_WINDOW_SECONDS)
        for item in [] if delivered else evidence:
            tracker.observe(item, now=moment)
        verdict = ShapeVerdict(signature=tracker.active)
        newly = tracker.newly_wide()
        if newly is not None:
            charged = tracker.take(newly)
            here = {item.notification_id for item in evidence if newly in item.answers}
            verdict = ShapeVerdict(
                signature=newly, earlier={nid: count - 1 for nid, count in charged.items() if nid in here and count > 1}
            )
            _shape_refund(
                channel=channel.name,
                charged={nid: count for nid, count in charged.items() if nid not in here},
                signature=newly,
                now=now,
            )
        health.shape = tracker.dump()
        health.save(update_fields=["shape", "updated_at"])
    _learned(channel, health)
    return verdict


def _shape_refund(*, channel: str, charged: dict[str, int], signature: str, now: datetime) -> None:
    """Give back attempts of a relay-wide answer charged to rows before it was recognised (see
    :func:`channel_shape_observe`)."""
    by_count: dict[int, list[str]] = {}
    for notification_id, count in charged.items():
        by_count.setdefault(count, []).append(notification_id)
    for count, ids in by_count.items():
        rows = Notification.objects.filter(pk__in=ids, type=channel).exclude(claimed_until__gt=now)
        given_back = Least(F("channel_failures") + count, F("retry_count"))
        rows.filter(status__in=Notification.NON_TERMINAL).update(channel_failures=given_back)
        rows.filter(
            status=Notification.Status.PARKED,
            expired_at__isnull=True,
            last_error__startswith="Retries exhausted",
            last_attempt_at__gte=now - timedelta(seconds=SHAPE_WINDOW_SECONDS),
        ).update(
            status=Notification.Status.RETRYING,
            channel_failures=given_back,
            next_attempt_at=now,
            last_error=(
                f"Channel failure (provider_error; relay-wide {signature}; retried until the channel recovers): "
                "it had parked for attempts the relay refused alike for every recipient"
            ),
        )


# --- health that follows the configuration ---------------------------------------------------


def channel_endpoints() -> dict[str, str | None]:
    """Each registered channel's endpoint as configured now (None: not configured)."""
    return {name: adapter_for(name).endpoint() for name in ADAPTER_PATHS}


def _not_configured_q(endpoints: dict[str, str | None]) -> Q:
    """Health rows of endpoints that are not their channel's configured endpoint now."""
    current = Q(pk__in=[])
    for name, endpoint in endpoints.items():
        if endpoint is not None:
            current |= Q(channel=name, endpoint=endpoint)
    return ~current


def channel_health_prune(*, endpoints: dict[str, str | None] | None = None) -> int:
    """Drop the health of every endpoint that is no longer configured (another relay was
    saved, a channel's configuration removed): no row goes there any more, so its breaker
    would stay open — in the console and in ``outbox_channel_open`` — for good. ``endpoints``:
    the configured ones, if the caller has them. Returns how many rows were dropped. (A pass
    that started before the change may still record one failure on the old endpoint; the
    next pass drops it again.)"""
    endpoints = channel_endpoints() if endpoints is None else endpoints
    deleted, _ = ChannelHealth.objects.filter(_not_configured_q(endpoints)).delete()
    return deleted


def channel_health_reset(*, channels: Iterable[str] | None = None) -> int:
    """After a configuration of ``channels`` (default: every channel) was saved — a fixed
    password, another relay, a policy, a list's targets —: their endpoints start afresh, with
    the consecutive failures and the answers watched for a shape forgotten, and an open one is
    probed at once, whatever its cool-down (a probe under way started with the old
    configuration: its lease is cancelled, so its failure does not postpone the next probe).
    One statement, on the database clock; returns how many endpoints it reset. The caller
    drops endpoints no longer configured (:func:`channel_health_prune`) when the change may
    have moved one, and asks for a dispatch."""
    rows = ChannelHealth.objects.filter(~Q(state=State.CLOSED) | Q(consecutive_failures__gt=0) | ~Q(shape={}))
    if channels is not None:
        rows = rows.filter(channel__in=list(channels))
    closed = Q(state=State.CLOSED)
    return rows.update(
        consecutive_failures=0,
        shape={},
        state=Case(When(closed, then=Value(State.CLOSED)), default=Value(State.OPEN)),
        probe_after=Case(When(closed, then=F("probe_after")), default=Now()),
        probe_claimed_by="",
        probe_claimed_until=None,
    )


@dataclass(frozen=True)
class ProbeNowResult:
    """What "Probe now" did: ``probing`` endpoints will be probed by the next dispatch;
    ``closed`` were closed instead (nothing to probe with), each with why."""

    probing: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)


def channel_health_probe_now(*, health_ids: Iterable[int], user: Any = None) -> ProbeNowResult:
    """The console's "Probe now" for the given health rows that are open. A probe needs a
    notification waiting for the endpoint: an endpoint that is no longer configured gets none
    (it is closed and dropped), and a configured endpoint without waiting rows is closed (the
    next delivery tests it; failing again, it opens again). The others are probed by the next
    dispatch (the caller asks for one). Each change is in the admin history of ``user``."""
    endpoints = channel_endpoints()
    probing: list[str] = []
    closed: list[str] = []
    for row in ChannelHealth.objects.filter(pk__in=list(health_ids)).exclude(state=State.CLOSED):
        label = f"{row.channel} {row.endpoint}"
        if endpoints.get(row.channel) != row.endpoint:
            reason = "no longer configured: nothing will be sent there"
        elif not _waiting(channel=row.channel):
            reason = "no notification waits for it: the next delivery tests it"
        else:
            ChannelHealth.objects.filter(pk=row.pk).update(
                state=State.OPEN, probe_after=database_now(), probe_claimed_by="", probe_claimed_until=None
            )
            _history(user, row, CHANGE, "Probe now: probed by the next dispatch.")
            probing.append(label)
            continue
        _close(row, endpoints=endpoints, user=user, why=f"Probe now: closed, {reason}.")
        closed.append(f"{label} ({reason})")
    return ProbeNowResult(probing=probing, closed=closed)


def channel_health_close(*, health_ids: Iterable[int], reason: str, user: Any = None) -> int:
    """Close the given endpoints by an operator's decision, with ``reason`` (required; a
    ValueError without one), recorded in the admin history of ``user``: an endpoint no longer
    configured is dropped; a configured one is closed with its counters reset, so its waiting
    rows are due again (failing again, it opens again). Returns how many were closed."""
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("A reason is required to close a channel endpoint.")
    endpoints = channel_endpoints()
    rows = list(ChannelHealth.objects.filter(pk__in=list(health_ids)))
    for row in rows:
        _close(row, endpoints=endpoints, user=user, why=f"Closed by operator. Reason: {reason[:2000]}")
    return len(rows)


def _close(row: ChannelHealth, *, endpoints: dict[str, str | None], user: Any, why: str) -> None:
    """Close ``row``'s endpoint (drop it when it is not configured), in the history."""
    with transaction.atomic():
        health = ChannelHealth.objects.select_for_update().filter(pk=row.pk).first()
        if health is None:
            return
        if endpoints.get(health.channel) != health.endpoint:
            _history(user, health, DELETION, f"{why} (no longer configured: removed)")
            health.delete()
            return
        _closed(health)
        health.shape = {}
        health.save()
        _history(user, health, CHANGE, why)


def _history(user: Any, health: ChannelHealth, flag: int, message: str) -> None:
    if user is None or not getattr(user, "is_authenticated", False):
        return
    LogEntry.objects.log_actions(
        user_id=user.pk, queryset=[health], action_flag=flag, change_message=message, single_object=True
    )


def _waiting(*, channel: str) -> bool:
    return Notification.objects.filter(status__in=Notification.NON_TERMINAL, type=channel).exists()


def channel_gate_wait(*, channel: Channel, health: ChannelHealth | None, now: datetime) -> datetime:
    """The earliest time a claim could take a due row of ``channel`` given its health: now for
    a closed endpoint with tokens, else when its probe or its next token is possible."""
    if health is None:
        return now
    when = now
    if health.state != State.CLOSED:
        when = max(when, health.probe_after or now)
        if health.probe_claimed_until is not None and health.probe_claimed_until > now:
            when = max(when, health.probe_claimed_until)
    rate = channel.policy.rate_per_minute
    if rate and health.rate_refilled_at is not None:
        tokens = min(
            _bucket_capacity(rate),
            health.rate_tokens + max(0.0, (now - health.rate_refilled_at).total_seconds()) * rate / 60,
        )
        if tokens < 1:
            when = max(when, now + timedelta(seconds=(1 - tokens) * 60 / rate))
    return when


def channels_unhealthy(*, queue_depth: int | None = None) -> list[dict[str, Any]]:
    """Every configured endpoint that is open or half open, for the console and the KPIs:
    channel, endpoint, state, since, last failure class and error, the next probe, probes so
    far, and how many rows wait for that endpoint (Pending or Retrying rows of its channel: a
    channel delivers through one configured endpoint, so they are all that endpoint's).
    Endpoints no longer configured are not listed (nothing goes there; dispatch drops them).
    ``queue_depth``: all Pending and Retrying rows, already counted by the caller; while one
    channel is registered they are that channel's, and no query is needed to count them."""
    rows = list(ChannelHealth.objects.exclude(state=State.CLOSED).order_by("opened_at"))
    if rows:  # (while every channel is healthy, no configuration is read)
        endpoints = channel_endpoints()
        rows = [row for row in rows if endpoints.get(row.channel) == row.endpoint]
    waiting: dict[str, int] = {}
    kept = None
    for name in {row.channel for row in rows}:
        if queue_depth is not None and set(ADAPTER_PATHS) == {name}:
            waiting[name] = queue_depth
        elif counts_kept():  # PostgreSQL: from the counts the database keeps per channel
            kept = queued_by_channel() if kept is None else kept
            waiting[name] = kept.get(name, 0)
        else:
            waiting[name] = Notification.objects.filter(status__in=Notification.NON_TERMINAL, type=name).count()
    return [
        {
            "channel": row.channel,
            "endpoint": row.endpoint,
            "state": row.state,
            "since": _iso(row.opened_at),
            "last_failure_class": row.last_failure_class,
            "last_error": row.last_error,
            "next_probe_at": _iso(row.probe_after),
            "probes": row.probes,
            "rows_waiting": waiting[row.channel],
        }
        for row in rows
    ]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")
