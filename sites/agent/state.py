"""What the agent knows about its link to central, kept in the buffer.

Every process that opens the buffer sees the same state: the forwarder records it, and a
script's ``status()``, the CLI's ``status`` and ``doctor`` (other processes, perhaps started
while the forwarder waits) read it. It lives in ``outbox_agent_state`` as JSON values and is
written only when it changes, so a healthy link costs no writes.

- ``link``: since when central has not been reached — every attempt since then failed to
  connect, timed out, got a 5xx or had the key refused — and the last such error. A ``429``,
  a refusal of a notification (``400``/``413``/``422``) or any success is an answer: it ends
  that state. The local fallback starts from ``unreachable_since``.
- ``key_refused``: central refused the site key (``401``) or the site (``403``) at the last
  attempt; the buffer is held (nothing parked, nothing deleted) until a request is accepted.
  When that happens the refusal is summarised in ``key_refused_episode`` until a heartbeat has
  carried it to central.
- ``rate_limited``: until when central asked (``429`` + ``Retry-After``) for no more requests of
  each lane: ``critical`` rows and the ``other`` priorities have budgets of their own.
- ``fallback``: how many notifications the local relay delivered, and its last failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from sites.agent.buffer import Buffer, iso_utc, parse_utc
from sites.agent.central import one_line

LANE_CRITICAL = "critical"
LANE_OTHER = "other"
LANES = (LANE_CRITICAL, LANE_OTHER)

_LINK = "link"
_KEY_REFUSED = "key_refused"
_KEY_EPISODE = "key_refused_episode"
_RATE_LIMITED = "rate_limited"
_FALLBACK = "fallback"


def lane_of(priority: str) -> str:
    """The rate-limit lane of a priority: critical rows have a budget of their own."""
    return LANE_CRITICAL if priority == "critical" else LANE_OTHER


@dataclass(frozen=True)
class LinkSnapshot:
    """The link's state as read from the buffer at one moment."""

    now: datetime
    unreachable_since: datetime | None = None
    last_error: str = ""
    last_error_at: str | None = None
    key_refused: dict[str, Any] | None = None
    key_refused_episode: str = ""
    rate_limited: dict[str, datetime] = field(default_factory=dict)  # lane -> until (future only)
    fallback: dict[str, Any] = field(default_factory=dict)

    def unreachable_for(self) -> float:
        """Seconds central has been unreachable (0 when it was reached last)."""
        if self.unreachable_since is None:
            return 0.0
        return max((self.now - self.unreachable_since).total_seconds(), 0.0)

    def held_reason(self, priority: str) -> str | None:
        """Why a forwarding row of ``priority`` is not reaching central now, in one line; None
        when nothing holds it."""
        if self.key_refused is not None:
            return (
                f"central refused the site key ({self.key_refused.get('detail', '')}) since "
                f"{self.key_refused.get('since')}; the buffer is held — "
                "nothing is parked or lost — until the key works (check OUTBOX_SITE_KEY and the site at central)"
            )
        until = self.rate_limited.get(lane_of(priority))
        if until is not None:
            return f"central is rate-limiting this site (HTTP 429) until {iso_utc(until)}; it is sent then"
        if self.unreachable_since is not None:
            return f"central unreachable since {iso_utc(self.unreachable_since)}: {self.last_error}"
        return None

    def rate_limit_line(self) -> str:
        """One line about the current 429 holds, or an empty string."""
        other = self.rate_limited.get(LANE_OTHER)
        critical = self.rate_limited.get(LANE_CRITICAL)
        if other is not None and critical is not None:
            return f"rate-limited by central (HTTP 429): every notification waits until {iso_utc(max(other, critical))}"
        if other is not None:
            return (
                f"rate-limited by central (HTTP 429): non-critical notifications wait until {iso_utc(other)}; "
                "critical ones go on"
            )
        if critical is not None:
            return f"rate-limited by central (HTTP 429): critical notifications wait until {iso_utc(critical)}"
        return ""


class LinkState:
    """Reads and records the link state of one buffer (see the module docstring)."""

    def __init__(self, *, buffer: Buffer, clock: Callable[[], datetime]) -> None:
        self.buffer = buffer
        self.clock = clock

    # --- storage ------------------------------------------------------------------------------

    def _get(self, name: str) -> Any:
        text = self.buffer.state_get(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None  # a hand-edited value: as if unset

    def _put(self, name: str, value: Any) -> None:
        """Store ``value`` (None deletes it) unless it is already what is stored."""
        if self._get(name) == value:
            return
        if value is None:
            self.buffer.state_delete(name)
        else:
            self.buffer.state_set(name, json.dumps(value, sort_keys=True, ensure_ascii=False))

    # --- what the forwarder and the site link record -----------------------------------------------

    def reached(self) -> None:
        """Central answered a request of this site's key with something other than a 5xx or a
        refused key: it is reachable and the key works."""
        self._put(_LINK, None)
        refused = self._get(_KEY_REFUSED)
        if refused is not None:
            now = iso_utc(self.clock())
            self._put(
                _KEY_EPISODE,
                one_line(
                    f"central refused the site key ({refused.get('detail', '')}) from {refused.get('since')} "
                    f"until {now}; the buffer was held, nothing was parked"
                ),
            )
            self._put(_KEY_REFUSED, None)

    def failed(self, error: str) -> None:
        """An attempt got no answer, timed out or got a 5xx."""
        self._unreachable(one_line(error))

    def key_refused(self, status: int, detail: str) -> None:
        """Central refused the site key (401) or the site (403)."""
        now = iso_utc(self.clock())
        refused = self._get(_KEY_REFUSED) or {"since": now}
        self._put(_KEY_REFUSED, {"status": status, "detail": one_line(detail), "since": refused["since"]})
        self._unreachable(one_line(f"central refused the site key: {detail}"))

    def _unreachable(self, error: str) -> None:
        now = iso_utc(self.clock())
        link = self._get(_LINK) or {"unreachable_since": now}
        self._put(_LINK, {"unreachable_since": link["unreachable_since"], "last_error": error, "last_error_at": now})

    def rate_limited(self, lane: str, until: datetime) -> None:
        """Central answered 429 for ``lane``: no request of that lane before ``until``. A 429
        is an answer: central is reachable."""
        holds = dict(self._get(_RATE_LIMITED) or {})
        holds[lane] = iso_utc(until)
        self._put(_RATE_LIMITED, holds)
        self._put(_LINK, None)

    def rate_limit_over(self, lane: str) -> None:
        """The hold of ``lane`` has passed (or a request of it was accepted)."""
        holds = dict(self._get(_RATE_LIMITED) or {})
        if holds.pop(lane, None) is not None:
            self._put(_RATE_LIMITED, holds or None)

    def key_episode_reported(self, episode: str) -> None:
        """A heartbeat carried ``episode`` to central: forget it (unless a newer one replaced it)."""
        if self._get(_KEY_EPISODE) == episode:
            self._put(_KEY_EPISODE, None)

    def fallback_delivered(self) -> None:
        """The local relay accepted one more notification; its last failure is over."""
        state = dict(self._get(_FALLBACK) or {})
        state["delivered"] = int(state.get("delivered", 0)) + 1
        state["last_error"], state["last_error_at"] = "", None
        self._put(_FALLBACK, state)

    def fallback_failed(self, error: str) -> None:
        """The local relay could not take a notification."""
        state = dict(self._get(_FALLBACK) or {})
        state.setdefault("delivered", 0)
        state["last_error"], state["last_error_at"] = one_line(error), iso_utc(self.clock())
        self._put(_FALLBACK, state)

    # --- reading ------------------------------------------------------------------------------------

    def rate_limited_until(self, lane: str) -> datetime | None:
        """Until when ``lane`` is held by a 429, or None (also when that time has passed)."""
        return self.snapshot().rate_limited.get(lane)

    def snapshot(self) -> LinkSnapshot:
        """The state now (a hold whose time has passed is left out)."""
        now = self.clock()
        link = self._get(_LINK) or {}
        holds = {}
        for lane, until_text in (self._get(_RATE_LIMITED) or {}).items():
            until = parse_utc(until_text)
            if until is not None and until > now:
                holds[lane] = until
        fallback = self._get(_FALLBACK) or {}
        return LinkSnapshot(
            now=now,
            unreachable_since=parse_utc(link.get("unreachable_since")),
            last_error=str(link.get("last_error") or ""),
            last_error_at=link.get("last_error_at"),
            key_refused=self._get(_KEY_REFUSED),
            key_refused_episode=str(self._get(_KEY_EPISODE) or ""),
            rate_limited=holds,
            fallback={
                "delivered": int(fallback.get("delivered", 0)),
                "last_error": str(fallback.get("last_error") or ""),
                "last_error_at": fallback.get("last_error_at"),
            },
        )
