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

Every change is a short transaction that locks the endpoint's row (``SELECT … FOR UPDATE``),
taken by claims before the notification rows they lock, so workers never deadlock.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from notifications.adapters import adapter_for
from notifications.clock import database_now
from notifications.counts import counts_kept, queued_by_channel
from notifications.models import ChannelHealth, Notification
from notifications.policies import ChannelPolicy, delivery_policies_all
from notifications.vocabulary import ADAPTER_PATHS, CHANNEL_FAILURES, HEALTHY_FAILURES

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

    @property
    def gated(self) -> bool:
        """Whether claims must consult the health row (breaker or rate limit)."""
        return self.endpoint is not None and (not self.clean or bool(self.policy.rate_per_minute))


def dispatch_channels() -> dict[str, Channel]:
    """Every registered channel with its endpoint, policy and health as stored now."""
    policies = delivery_policies_all()
    channels = {
        name: Channel(name=name, endpoint=adapter_for(name).endpoint(), policy=policies[name]) for name in ADAPTER_PATHS
    }
    channels_refresh(channels)
    return channels


def channels_refresh(channels: dict[str, Channel]) -> None:
    """Read the health of ``channels``' endpoints again (one query on a table of one row per
    endpoint): whether each is clean, and whether it is open (halted). Claims do this first,
    so a worker learns at its next claim that another worker opened or closed a channel."""
    unhealthy = {
        (name, endpoint): state
        for name, endpoint, state in ChannelHealth.objects.filter(
            Q(state__in=[State.OPEN, State.HALF_OPEN]) | Q(consecutive_failures__gt=0)
        ).values_list("channel", "endpoint", "state")
    }
    for channel in channels.values():
        state = unhealthy.get((channel.name, channel.endpoint or ""))
        channel.clean = state is None
        channel.halted = state is not None and state != State.CLOSED


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
) -> str:
    """Record the outcomes of started deliveries on ``channel`` (None: success) and return the
    endpoint's state afterwards. ``last_error``: the latest channel failure's message. No
    outcomes at all: this worker's probe was never started and is given back.

    A success or a healthy failure closes the endpoint; channel failures count towards
    opening it (or re-open it after this worker's failed probe, with a doubled cool-down);
    failures that say nothing about the channel (configuration, unknown) change nothing but
    give a probe back as failed.
    """
    assert channel.endpoint is not None, "only configured channels have health"
    classes = list(failure_classes)
    failures = [c for c in classes if c in CHANNEL_FAILURES]
    healthy = any(c is None or c in HEALTHY_FAILURES for c in classes)
    policy = channel.policy
    with transaction.atomic():
        health = _health_row_locked(channel=channel.name, endpoint=channel.endpoint)
        probed = health.probe_claimed_by == worker_id[:64] and health.state != State.CLOSED
        if probed:
            health.probe_claimed_by, health.probe_claimed_until = "", None
        if healthy:
            health.state = State.CLOSED
            health.consecutive_failures = 0
            health.cooldown_seconds = 0
            health.opened_at = health.probe_after = None
            health.probes = 0
            health.probe_claimed_by, health.probe_claimed_until = "", None
        elif failures:
            health.consecutive_failures += len(failures)
            health.last_failure_class = failures[-1]
            health.last_failure_at = now
            health.last_error = last_error[:2000]
            if health.state == State.CLOSED and health.consecutive_failures >= policy.breaker_threshold:
                health.state = State.OPEN
                health.opened_at = now
                health.cooldown_seconds = policy.breaker_cooldown_seconds
                health.probe_after = now + timedelta(seconds=health.cooldown_seconds)
                health.probes = 0
            elif probed:
                _probe_failed(health, policy=policy, now=now)
        elif probed and not classes:
            health.state = State.OPEN  # the probe was never started: another may start at once
        elif probed:
            _probe_failed(health, policy=policy, now=now)
        health.save()
    channel.clean = health.state == State.CLOSED and health.consecutive_failures == 0
    channel.halted = health.state != State.CLOSED
    return health.state


def _probe_failed(health: ChannelHealth, *, policy: ChannelPolicy, now: datetime) -> None:
    health.state = State.OPEN
    health.cooldown_seconds = min(
        max(health.cooldown_seconds, policy.breaker_cooldown_seconds) * 2, policy.breaker_max_cooldown_seconds
    )
    health.probe_after = now + timedelta(seconds=health.cooldown_seconds)


def channel_health_probe_soon(*, channel: str) -> int:
    """Let the open endpoints of ``channel`` be probed at once (after its configuration was
    changed: the fix should not wait out a long cool-down). A probe under way started with
    the old configuration: its lease is cancelled, so its failure does not postpone the next
    probe. Returns how many endpoints were open."""
    return (
        ChannelHealth.objects.filter(channel=channel)
        .exclude(state=State.CLOSED)
        .update(state=State.OPEN, probe_after=database_now(), probe_claimed_by="", probe_claimed_until=None)
    )


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
    """Every endpoint that is open or half open, for the console and the KPIs: channel,
    endpoint, state, since, last failure class and error, the next probe, probes so far, and
    how many rows of the channel wait (Pending or Retrying). ``queue_depth``: all Pending and
    Retrying rows, already counted by the caller; while one channel is registered they are
    that channel's, and no query is needed to count them."""
    rows = list(ChannelHealth.objects.exclude(state=State.CLOSED).order_by("opened_at"))
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
