"""Channel failure by shape (docs/architecture.md, "Channel failure by shape"): a relay or
receiver that refuses *everything* for now, with an answer that is not one of the channel
failure classes.

Postfix answers ``451 4.3.5`` to every recipient while a lookup table, LDAP or a policy
service is down, and ``452 4.3.1`` while its disk is full; a receiver behind a proxy answers
``502``/``503``/``504`` to every request while the service behind it is down. Each answer,
taken alone, is the provider's "not now" about one message (``provider_error``, retried and
charged to the row); greylisting of one address looks exactly the same. What tells the two
apart is the shape: when, within :data:`SHAPE_WINDOW_SECONDS`, every attempt on an endpoint
fails with the same answer for at least :data:`SHAPE_MIN_NOTIFICATIONS` notifications and
:data:`SHAPE_MIN_TARGETS` recipients (an HTTP answer: the notifications alone), with nothing
delivered meanwhile, the endpoint is failing, not the rows (:func:`relay_wide`).

This module holds the rule and its bookkeeping (:class:`ShapeTracker`, stored on the endpoint's
health row); notifications.health applies it under the row's lock and the finish step treats the
rows' failures accordingly. It imports no model.
"""

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from notifications.adapters.base import DeliveryError
from notifications.vocabulary import FailureClass, TargetOutcome, target_outcome

# The rule: the same answer within this window …
SHAPE_WINDOW_SECONDS = 900
# … for at least this many distinct notifications …
SHAPE_MIN_NOTIFICATIONS = 3
# … and this many distinct recipients (email) or targets (the HTTP channels), with nothing
# delivered on the endpoint meanwhile.
SHAPE_MIN_TARGETS = 3
# An HTTP receiver's 5xx needs only the notifications: one address can be greylisted while the
# relay works, but a receiver has no per-target "not now" — a 502/503/504 to three different
# notifications, with nothing delivered meanwhile, is the receiver's (or its proxy's) state,
# even when the list has a single hook.
SHAPE_MIN_TARGETS_HTTP = 1
# Failure classes whose answers can make such a shape: the provider's "not now". (The channel
# classes — connection, timeout, auth, throttled — open the breaker on their own.)
SHAPE_CLASSES = frozenset({FailureClass.PROVIDER_ERROR})
# Notifications and targets remembered per answer: enough for the thresholds, and for giving
# back the attempts of the notifications that failed before the shape was recognised.
MAX_TRACKED = 50

# An enhanced status code (RFC 3463) in a reply's text, e.g. "4.3.5".
_ENHANCED_STATUS = re.compile(r"\b([245]\.\d{1,3}\.\d{1,3})\b")


def relay_wide(*, notifications: int, targets: int, signature: str = "") -> bool:
    """The rule: an answer given, within the window and with nothing delivered meanwhile, for
    this many distinct notifications and recipients is the endpoint's failure, not theirs. An
    HTTP answer (``signature`` "HTTP 503" …) needs the notifications only."""
    min_targets = SHAPE_MIN_TARGETS_HTTP if signature.startswith("HTTP ") else SHAPE_MIN_TARGETS
    return notifications >= SHAPE_MIN_NOTIFICATIONS and targets >= min_targets


def entry_signature(entry: dict[str, Any]) -> str | None:
    """The answer a deferred ``resolved_targets`` entry got, as one comparable word: an SMTP
    reply code with its enhanced status ("451 4.3.5", or "451" without one), an HTTP status
    ("HTTP 503"); None for an entry without an answer (not reached, a lost connection)."""
    code = entry.get("smtp_code")
    if isinstance(code, int) and 400 <= code < 500:
        enhanced = _ENHANCED_STATUS.search(str(entry.get("error", "")))
        return f"{code} {enhanced.group(1)}" if enhanced else str(code)
    status = entry.get("http_status")
    if isinstance(status, int) and status >= 500 and entry.get("failure_class", "") in SHAPE_CLASSES:
        return f"HTTP {status}"
    return None


def _target_key(entry: dict[str, Any]) -> str:
    """A short digest of whom an entry is for (the tracker stores no address)."""
    who = str(entry.get("ref") or entry.get("target", "")).strip().lower()
    return hashlib.sha256(who.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Evidence:
    """What one failed attempt says about its endpoint: per answer, the targets that got it."""

    notification_id: str
    answers: dict[str, frozenset[str]]

    @property
    def signatures(self) -> set[str]:
        return set(self.answers)


def attempt_evidence(*, notification_id: Any, error: DeliveryError) -> Evidence | None:
    """The evidence of a failed attempt: its deferred targets grouped by the answer they got,
    when the attempt's class can make a shape and nothing was delivered in it; else None."""
    if error.failure_class not in SHAPE_CLASSES or error.ambiguous or attempt_delivered(error.detail):
        return None
    answers: dict[str, set[str]] = {}
    for entry in error.targets:
        if not isinstance(entry, dict) or target_outcome(entry) != TargetOutcome.DEFERRED:
            continue
        signature = entry_signature(entry)
        if signature is not None:
            answers.setdefault(signature, set()).add(_target_key(entry))
    if not answers:
        return None
    return Evidence(str(notification_id), {sig: frozenset(keys) for sig, keys in answers.items()})


def attempt_delivered(detail: dict[str, Any]) -> bool:
    """Whether an attempt's detail says some target accepted the message in that attempt."""
    accepted = detail.get("accepted") if isinstance(detail, dict) else None
    return isinstance(accepted, int) and accepted > 0


@dataclass
class ShapeTracker:
    """The answers an endpoint has given lately, per answer: the notifications that got it (how
    many times, last when) and the targets (last when), times in seconds since the epoch.
    ``active``: the answer currently taken as the endpoint's failure ("" when none). Stored as
    JSON on the endpoint's health row (:meth:`dump`, :meth:`load`)."""

    active: str = ""
    seen: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def load(cls, data: Any) -> "ShapeTracker":
        if not isinstance(data, dict):
            return cls()
        seen = data.get("seen")
        return cls(active=str(data.get("active") or ""), seen=seen if isinstance(seen, dict) else {})

    def dump(self) -> dict[str, Any]:
        if not self.active and not self.seen:
            return {}
        return {"active": self.active, "seen": self.seen}

    def forget_before(self, cutoff: float) -> None:
        """Drop what was seen before ``cutoff`` (the window's start)."""
        for signature in list(self.seen):
            record = self.seen[signature]
            record["n"] = {nid: seen for nid, seen in record.get("n", {}).items() if seen[1] >= cutoff}
            record["t"] = {key: when for key, when in record.get("t", {}).items() if when >= cutoff}
            if not record["n"]:
                del self.seen[signature]

    def observe(self, evidence: Evidence, *, now: float) -> None:
        """Count ``evidence`` under each answer it holds, except the active one (those failures
        are already the endpoint's)."""
        for signature, targets in evidence.answers.items():
            if signature == self.active:
                continue
            record = self.seen.setdefault(signature, {"n": {}, "t": {}})
            count = record["n"].get(evidence.notification_id, [0, now])[0]
            record["n"][evidence.notification_id] = [count + 1, now]
            for key in targets:
                record["t"][key] = now
            _keep_latest(record["n"], key=lambda seen: seen[1])
            _keep_latest(record["t"], key=lambda when: when)

    def newly_wide(self) -> str | None:
        """An answer that now meets the rule (:func:`relay_wide`), if one does."""
        for signature, record in self.seen.items():
            if relay_wide(notifications=len(record["n"]), targets=len(record["t"]), signature=signature):
                return signature
        return None

    def take(self, signature: str) -> dict[str, int]:
        """Make ``signature`` the active answer; returns how many failed attempts of it each
        notification had (charged to the rows until now) and forgets them."""
        self.active = signature
        record = self.seen.pop(signature, {"n": {}})
        return {nid: int(seen[0]) for nid, seen in record["n"].items()}


def _keep_latest(items: dict[str, Any], *, key: Any) -> None:
    """Keep the MAX_TRACKED most recent of ``items`` (by ``key`` of each value)."""
    if len(items) > MAX_TRACKED:
        for name, _ in sorted(items.items(), key=lambda item: key(item[1]))[: len(items) - MAX_TRACKED]:
            del items[name]
