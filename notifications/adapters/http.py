"""What the HTTP channels (Teams, webhooks, SMS) share: one httpx client per session, the
classification of HTTP answers into failure classes, and the per-target bookkeeping.

**Per-target outcomes.** A notification goes to every target its list holds for the channel;
each target gets its own outcome in ``resolved_targets``: ``delivered`` (accepted),
``refused`` (a permanent answer for that target: not retried) or ``failed`` (transient: retried
with the next attempt). The notification is Delivered when at least one target accepted and
none is still retryable. A retry sends only to the targets still owed the message: targets
that accepted are never sent it twice, and targets that refused it are skipped while the row
is retried automatically (an operator's Retry, which makes the row Pending, tries them again).

**Classification of an HTTP answer** (one place, :func:`http_failure`): 2xx delivered;
408 timeout, 429 throttled, 5xx provider error — all transient, ``Retry-After`` honoured;
401/403 configuration (credentials refused), 404/410 and the other 4xx refused for that target.
"""

import email.utils
import time
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import httpx
from django.conf import settings

from notifications.adapters.base import Adapter, DeliveryError, DeliveryResult, FailureClass, Session
from notifications.adapters.targets import targets_resolve
from notifications.backoff import RetryTiming
from notifications.channel_targets import Target
from notifications.models import ChannelConfiguration, Notification

# Longest Retry-After honoured: a receiver asking for more is retried at this delay (its
# channel's policy and breaker still apply).
MAX_RETRY_AFTER_SECONDS = 3600
USER_AGENT = "Outbox-notifications/1"


@dataclass
class TargetOutcome:
    """One target's outcome in one attempt. ``failure_class`` is set unless delivered;
    ``retry_after`` (seconds) when the receiver asked for a delay."""

    outcome: str  # "delivered" | "refused" | "deferred" (retryable)
    detail: str = ""
    failure_class: str = ""
    retry_after: float | None = None
    http_status: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # provider_id, provider_status, …
    # The start of a non-2xx answer's body: for operators (the attempt's detail), never in
    # ``detail``, which becomes the row's last_error that sites read; a receiver's body may
    # echo anything (our request, its own internals).
    response_excerpt: str = ""

    @property
    def retryable(self) -> bool:
        return self.outcome == "deferred"


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP date), capped;
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value), MAX_RETRY_AFTER_SECONDS))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delay = when.timestamp() - (now if now is not None else time.time())
    return float(min(max(delay, 0.0), MAX_RETRY_AFTER_SECONDS))


def http_failure(response: httpx.Response) -> TargetOutcome:
    """The outcome of a non-2xx answer: the one place HTTP statuses become failure classes."""
    status = response.status_code
    retry_after = retry_after_seconds(response.headers.get("retry-after"))
    detail = f"HTTP {status} {response.reason_phrase}".strip()
    excerpt = response.text[:200].strip() if response.content else ""
    if status == 408:
        outcome = TargetOutcome("deferred", detail, FailureClass.TIMEOUT, retry_after, status)
    elif status == 429:
        outcome = TargetOutcome("deferred", detail, FailureClass.THROTTLED, retry_after, status)
    elif status >= 500:
        outcome = TargetOutcome("deferred", detail, FailureClass.PROVIDER_ERROR, retry_after, status)
    elif status in (401, 403):
        # Permanent for the target: the receiver refuses our credentials or signature; sending
        # the same request again cannot succeed until someone changes the configuration.
        outcome = TargetOutcome("refused", detail, FailureClass.CONFIGURATION, None, status)
    elif status in (404, 410):
        # Permanent: the endpoint does not exist (any more); 410 says so explicitly.
        outcome = TargetOutcome("refused", detail, FailureClass.RECIPIENT_REJECTED, None, status)
    else:
        # Permanent: any other 4xx says this request is wrong for this receiver (400, 413, 422 …).
        outcome = TargetOutcome("refused", detail, FailureClass.CONTENT_REJECTED, None, status)
    outcome.response_excerpt = excerpt
    return outcome


def http_exception(exc: httpx.HTTPError) -> TargetOutcome:
    """The outcome of a request that got no answer: timeouts and connection errors are
    transient; a malformed URL (which validation should have caught) is refused."""
    if isinstance(exc, httpx.TimeoutException):
        return TargetOutcome("deferred", f"Timed out: {type(exc).__name__}", FailureClass.TIMEOUT)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        # Permanent: no retry makes a URL valid.
        return TargetOutcome("refused", f"Invalid URL: {exc}", FailureClass.CONFIGURATION)
    reason = str(exc) or type(exc).__name__
    return TargetOutcome("deferred", f"Connection failed: {reason}", FailureClass.CONNECTION)


class HttpClient:
    """The one wrapper outbound HTTP of the channels goes through: a connection-pooling
    httpx client whose every call has the channel's timeout; thread-safe."""

    def __init__(self, *, timeout: float, max_connections: int = 32) -> None:
        self.timeout = timeout
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
        )

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._client.post(url, **kwargs)

    def close(self) -> None:
        self._client.close()


def channel_timeout(channel: str) -> int:
    """The channel's configured request timeout in seconds, or the default."""
    config = ChannelConfiguration.objects.filter(channel=channel).first()
    return config.timeout_seconds if config is not None else ChannelConfiguration.DEFAULT_TIMEOUT_SECONDS


class TargetsAdapter(Adapter):
    """An adapter whose lists hold targets of its own channel (every channel beyond email):
    exponential retries by default, the list's targets resolved by notifications.channel_targets,
    and a ``session_class`` session with the channel's timeout. One breaker serves the whole
    channel (``endpoint``; see docs/channels.md)."""

    channel = ""
    session_class: type["TargetsSession"]

    def default_timing(self) -> RetryTiming:
        return RetryTiming(strategy="exponential", interval_seconds=30, max_interval_seconds=3600, max_attempts=10)

    def endpoint(self) -> str | None:
        return self.channel

    def resolve_targets(self, *, list_names: set[str]) -> dict[str, list[str]]:
        return targets_resolve(channel=self.channel, list_names=list_names)

    def open_session(self) -> "TargetsSession":
        return self.session_class(timeout=channel_timeout(self.channel))


class TargetsSession(Session):
    """A session delivering each notification to each of its targets with ``send_one``, and
    turning the per-target outcomes into the notification's result (module docstring)."""

    channel = ""

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self.http = HttpClient(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def send_one(self, notification: Notification, target: Target) -> TargetOutcome:
        raise NotImplementedError

    def deliver(self, notification: Notification, targets: list[str]) -> DeliveryResult:
        # Targets are sent one after another; a list of many slow receivers must not outlast
        # the row's claim (another worker could then take it and send again), so targets not
        # reached within a quarter of the lease wait for the next attempt.
        deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS / 4
        previous = _previous_outcomes(notification)
        retry_refused = notification.status == Notification.Status.PENDING
        snapshot: list[dict[str, Any]] = []
        fresh: list[TargetOutcome] = []
        seen: set[str] = set()
        for target in targets:
            assert isinstance(target, Target), "targets come from notifications.channel_targets"
            if target.ref in seen:
                continue
            seen.add(target.ref)
            before = previous.pop(target.ref, None)
            if before is not None and (
                before.get("outcome") == "delivered" or (before.get("outcome") == "refused" and not retry_refused)
            ):
                snapshot.append(before)  # already done: never sent twice
                continue
            if target.refusal:
                # Permanent until an administrator restores the old key or re-enters the secret
                # (one that does not decrypt, or that was entered for another URL).
                outcome = TargetOutcome("refused", target.refusal, FailureClass.CONFIGURATION)
            elif time.monotonic() > deadline:
                outcome = TargetOutcome(
                    "deferred", "Not attempted: this attempt ran out of time on earlier targets.", FailureClass.TIMEOUT
                )
            else:
                outcome = self.send_one(notification, target)
            fresh.append(outcome)
            snapshot.append(_entry(self.channel, target, outcome))
        # Targets delivered earlier but no longer in the list stay in the audit snapshot.
        snapshot += [entry for entry in previous.values() if entry.get("outcome") == "delivered"]
        return _result(snapshot, fresh)


def _previous_outcomes(notification: Notification) -> dict[str, dict[str, Any]]:
    previous = notification.resolved_targets if isinstance(notification.resolved_targets, list) else []
    return {entry["ref"]: entry for entry in previous if isinstance(entry, dict) and entry.get("ref")}


def _entry(channel: str, target: Target, outcome: TargetOutcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "channel": channel,
        "target": str(target),
        "ref": target.ref,
        "outcome": outcome.outcome,
        "detail": outcome.detail[:500],
    }
    if outcome.failure_class:
        entry["failure_class"] = outcome.failure_class
    if outcome.http_status is not None:
        entry["http_status"] = outcome.http_status
    if outcome.response_excerpt:
        entry["response_excerpt"] = outcome.response_excerpt
    entry.update(outcome.extra)
    return entry


def _result(snapshot: list[dict[str, Any]], fresh: list[TargetOutcome]) -> DeliveryResult:
    """Delivered when at least one target accepted and none is retryable; else the failure of
    the first retryable target (transient), or of the first refusal (every target refused)."""
    detail: dict[str, Any] = {
        "targets": [{"target": e["target"], "outcome": e["outcome"], **_status(e)} for e in snapshot],
        # Accepted in this attempt (a receiver that took something works; notifications.failure_shape).
        "accepted": sum(1 for outcome in fresh if outcome.outcome == "delivered"),
    }
    retryable = [outcome for outcome in fresh if outcome.retryable]
    delivered = [entry for entry in snapshot if entry.get("outcome") == "delivered"]
    refused = [entry for entry in snapshot if entry.get("outcome") == "refused"]
    if retryable:
        first = retryable[0]
        waits = [outcome.retry_after for outcome in retryable if outcome.retry_after is not None]
        raise DeliveryError(
            _summary(snapshot, lead=first.detail),
            failure_class=first.failure_class,
            detail=detail,
            targets=snapshot,
            retry_after=max(waits) if waits else None,
        )
    if not delivered:
        first_class = next((e.get("failure_class") for e in refused if e.get("failure_class")), None)
        raise DeliveryError(
            _summary(snapshot, lead="every target refused the notification"),
            failure_class=first_class or FailureClass.UNKNOWN,
            detail=detail,
            targets=snapshot,
        )
    warning = _summary(snapshot, lead="some targets refused the notification") if refused else ""
    return DeliveryResult(targets=snapshot, detail=detail, warning=warning)


def _status(entry: dict[str, Any]) -> dict[str, Any]:
    """What the attempt's detail shows of a target's answer: its HTTP status and body excerpt."""
    return {name: entry[name] for name in ("http_status", "response_excerpt") if name in entry}


def _summary(snapshot: list[dict[str, Any]], *, lead: str) -> str:
    counts: dict[str, int] = {}
    for entry in snapshot:
        counts[entry.get("outcome", "?")] = counts.get(entry.get("outcome", "?"), 0) + 1
    tally = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
    problems = "; ".join(
        f"{entry['target']}: {entry.get('detail', '')}" for entry in snapshot if entry.get("outcome") != "delivered"
    )
    return f"{lead} ({tally} of {len(snapshot)} targets). {problems}".strip()[:4000]
