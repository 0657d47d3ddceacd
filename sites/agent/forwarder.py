"""The forwarder: posts buffered notifications to central and applies central's verdict.

It takes the buffer most urgent first, then oldest: ``critical`` rows in requests of their own
(central gives them a rate budget of their own), then ``high``, ``normal`` and ``low``. The rule
behind the table below: **a site never parks a notification because central could not be
reached**, however long the outage; only central's refusal of the notification itself parks it.

=========================================  ==========================================================
answer                                     what happens to the rows in that request
=========================================  ==========================================================
201 / 200, batch ``created``/``replayed``  deleted (central has committed them)
400 / 422, batch ``rejected``              parked with central's error (retrying cannot fix them)
413 to a single post                       parked (the notification is larger than central accepts)
413 / 400 / 404 / 405 to a batch           the same rows are sent again one by one
500 to a batch                             the batch is split in halves, each sent on its own (and
                                           split again on another 500): a row that makes central
                                           fail is isolated, the innocent rows get through
500 to a single post                       central failed on this row: retried with a growing
                                           interval (doubling from retry_interval, capped), never
                                           parked; rows answered 500 more than once are reported
                                           in the heartbeat (``server_errors``)
401 / 403                                  nothing changes: the buffer is held (nothing parked,
                                           nothing deleted), the state recorded for ``status`` and
                                           ``doctor``, and :class:`CredentialRejected` is raised
429                                        nothing changes and nothing is counted; that lane
                                           (critical, or the other priorities) holds off for
                                           Retry-After seconds while the other lane goes on
no answer, timeout, 502/503/504, other     central unreachable: the sweep stops, the rows tried
5xx, 407, 408                              record the error, no retry is counted, and the
                                           forwarder tries again after retry_interval
anything else (a redirect, 404 to a        an answer outside central's contract (a wrong URL
single post, a batch answer without a      prefix, a misbehaving proxy): retry_count + 1, next
result for the row, …)                     attempt after retry_interval, parked once max_retries
                                           such answers have been counted (0: never)
=========================================  ==========================================================

A row the local fallback relay delivered (sites/agent/fallback.py) is sent with
``delivered_locally_at`` added to its stored body.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

from sites.agent.buffer import LOCAL_DELIVERED, Buffer, BufferedRow, iso_utc
from sites.agent.central import CentralClient, CentralResponse, CentralUnreachable, describe_errors, one_line
from sites.agent.contract import MAX_BODY_BYTES, MAX_TYPE_DATA_DEPTH
from sites.agent.state import LANE_CRITICAL, LANE_OTHER, LANES, LinkState

if TYPE_CHECKING:
    from sites.agent.stopping import StopEvent

Progress = Callable[["ForwardResult"], None]

logger = logging.getLogger("sites.agent")

# A misconfigured central must not silence a site for days.
MAX_RETRY_AFTER_SECONDS = 3600.0

# Central refuses bodies over OUTBOX_MAX_BODY_BYTES (1 MiB by default) with 413; cutting batches
# below that up front saves uploading a megabyte only to fall back to single posts.
MAX_BATCH_BYTES = MAX_BODY_BYTES

# A row central keeps answering 500 waits retry_interval, then twice that, … up to this.
SERVER_ERROR_MAX_BACKOFF = 1800.0

# Answers that mean "central is not reachable right now", not "central judged this row": a
# proxy's or load balancer's 502/503/504 (and central's own 503), a proxy refusing us (407), a
# request timeout (408). Any other 5xx but 500 is taken the same way.
_LINK_STATUSES = frozenset({407, 408, 502, 503, 504})


def _is_link_failure(status: int) -> bool:
    return status in _LINK_STATUSES or (500 < status < 600)


class CredentialRejected(Exception):
    """Central refused the site's key (401) or the site (403). Nothing was parked.

    ``result`` holds what the interrupted sweep had done before the refusal.
    """

    def __init__(self, status: int, detail: str, result: ForwardResult | None = None) -> None:
        super().__init__(f"central rejected the site credential (HTTP {status}): {detail}")
        self.status = status
        self.detail = detail
        self.result = result


@dataclass
class ForwardResult:
    """What one sweep did. ``throttled_for``: seconds the non-critical rows wait for a 429
    (``critical_throttled_for`` the same for critical rows). ``unreachable``: the sweep stopped
    because central could not be reached. ``server_errors``: rows central answered 500 to."""

    forwarded: int = 0
    parked: int = 0
    retrying: int = 0
    dropped: int = 0
    requests: int = 0
    throttled_for: float | None = None
    critical_throttled_for: float | None = None
    unreachable: bool = False
    server_errors: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict (``errors`` left out)."""
        return {
            "forwarded": self.forwarded,
            "parked": self.parked,
            "retrying": self.retrying,
            "dropped": self.dropped,
            "requests": self.requests,
            "throttled_for": self.throttled_for,
            "critical_throttled_for": self.critical_throttled_for,
            "unreachable": self.unreachable,
            "server_errors": self.server_errors,
        }


class _Throttled(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class _Unreachable(Exception):
    """Central could not be reached: the sweep stops."""


@dataclass
class _Sweep:
    """What a sweep learnt about the link: whether central answered, and the last failure."""

    reached: bool = False
    failure: str = ""


def retry_after_seconds(value: str | None, *, default: float, now: datetime | None = None) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    if value is None:
        return default
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return default
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def wire_payload(row: BufferedRow) -> str:
    """The body to post for ``row``: its stored text, plus ``delivered_locally_at`` for a row the
    local relay delivered (spliced into the JSON text, so the rest stays byte for byte as
    stored)."""
    if row.local_state != LOCAL_DELIVERED or not row.delivered_locally_at:
        return row.payload
    text = row.payload.rstrip()
    return text[:-1] + ',"delivered_locally_at":' + json.dumps(row.delivered_locally_at) + "}"


class Forwarder:
    """One sweep over the due rows of a buffer. Sweeps of one forwarder never overlap; several
    forwarders (processes) on one buffer are harmless — central answers replays with 200 —
    only wasteful."""

    def __init__(
        self,
        *,
        buffer: Buffer,
        client: CentralClient,
        clock: Callable[[], datetime],
        retry_interval: float,
        max_retries: int,
        batch_size: int,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        state: LinkState | None = None,
        server_error_max_backoff: float = SERVER_ERROR_MAX_BACKOFF,
    ) -> None:
        self.buffer = buffer
        self.client = client
        self.clock = clock
        self.retry_interval = float(retry_interval)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.max_batch_bytes = int(max_batch_bytes)
        self.server_error_max_backoff = float(server_error_max_backoff)
        self.state = state if state is not None else LinkState(buffer=buffer, clock=clock)
        # 429 holds per lane; those stored by an earlier run are honoured after a restart.
        self._holds: dict[str, datetime] = dict(self.state.snapshot().rate_limited)
        self._unreachable_until: datetime | None = None  # after a link failure: no request before
        self._lock = threading.Lock()

    def held_for(self, lane: str = LANE_OTHER) -> float | None:
        """Seconds left of the 429 hold of ``lane`` (``"critical"`` or ``"other"``), or None."""
        until = self._holds.get(lane)
        if until is None:
            return None
        left = (until - self.clock()).total_seconds()
        if left <= 0:
            del self._holds[lane]
            self.state.rate_limit_over(lane)
            return None
        return left

    def next_hold_end(self) -> float | None:
        """Seconds until the earliest hold ends — a lane's 429, or the wait after central was
        unreachable — or None when nothing is held (so the forwarder can wake just then)."""
        now = self.clock()
        ends = list(self._holds.values())
        if self._unreachable_until is not None:
            ends.append(self._unreachable_until)
        future = [seconds for seconds in ((end - now).total_seconds() for end in ends) if seconds > 0]
        return min(future) if future else None

    def sweep(self, *, stop_event: StopEvent | None = None, progress: Progress | None = None) -> ForwardResult:
        """Forward every row due at the sweep's start once, critical rows first; see the module
        docstring for what each answer does. Raises :class:`CredentialRejected` on 401/403."""
        with self._lock:
            return self._sweep(stop_event=stop_event, progress=progress)

    def _sweep(self, *, stop_event: StopEvent | None, progress: Progress | None) -> ForwardResult:
        result = ForwardResult()
        now = self.clock()
        if self._unreachable_until is not None and now < self._unreachable_until:
            result.unreachable = True
            return result
        self._unreachable_until = None
        sweep_start = iso_utc(now)
        link = _Sweep()
        try:
            for lane in LANES:
                if stop_event is not None and stop_event.is_set():
                    break
                if self.held_for(lane) is not None:
                    continue
                try:
                    self._forward_lane(lane, sweep_start, result, link, stop_event, progress)
                except _Throttled as throttled:
                    link.reached = True  # a 429 is an answer
                    self._holds[lane] = self.clock() + timedelta(seconds=throttled.seconds)
                    self.state.rate_limited(lane, self._holds[lane])
                    logger.warning(
                        "Central is rate-limiting this site (HTTP 429); %s notifications wait %.1f s",
                        "critical" if lane == LANE_CRITICAL else "non-critical",
                        throttled.seconds,
                    )
        except _Unreachable:
            result.unreachable = True
            self._unreachable_until = self.clock() + timedelta(seconds=self.retry_interval)
        except CredentialRejected as rejected:
            rejected.result = result
            self.state.key_refused(rejected.status, rejected.detail)
            logger.error(
                "FORWARDING STOPPED — %s — nothing was parked and buffered notifications stay in the "
                "buffer. Fix the site key (OUTBOX_SITE_KEY) or reactivate the site at central.",
                rejected,
            )
            raise
        if link.reached:
            self.state.reached()
        elif link.failure:
            self.state.failed(link.failure)
        result.throttled_for = self.held_for(LANE_OTHER)
        result.critical_throttled_for = self.held_for(LANE_CRITICAL)
        return result

    def _forward_lane(
        self,
        lane: str,
        sweep_start: str,
        result: ForwardResult,
        link: _Sweep,
        stop_event: StopEvent | None,
        progress: Progress | None,
    ) -> None:
        attempted: set = set()
        while not (stop_event is not None and stop_event.is_set()):
            rows = [
                row
                for row in self.buffer.due(now=sweep_start, limit=self.batch_size, lane=lane)
                if row.notification_id not in attempted
            ]
            if not rows:
                return
            attempted.update(row.notification_id for row in rows)
            rows = self._drop_undecodable(rows, result)
            for chunk in self._by_size(rows):
                if stop_event is not None and stop_event.is_set():
                    return
                try:
                    if len(chunk) == 1:
                        self._send_single(chunk[0], result, link)
                    else:
                        self._send_batch(chunk, result, link, stop_event)
                finally:
                    if progress is not None:
                        progress(result)

    def _by_size(self, rows: list[BufferedRow]) -> Iterator[list[BufferedRow]]:
        """Rows cut into runs whose batch body stays under ``max_batch_bytes``."""
        chunk: list[BufferedRow] = []
        size = 32  # the {"notifications": [...]} envelope
        for row in rows:
            row_size = len(row.payload.encode("utf-8")) + 2
            if chunk and size + row_size > self.max_batch_bytes:
                yield chunk
                chunk, size = [], 32
            chunk.append(row)
            size += row_size
        if chunk:
            yield chunk

    # --- one request ------------------------------------------------------------------------

    def _drop_undecodable(self, rows: list[BufferedRow], result: ForwardResult) -> list[BufferedRow]:
        """Delete rows whose payload is not a notification object: retrying cannot fix them.
        Rows whose JSON is nested too deeply to decode are parked instead (the notification is
        there, but central would refuse it)."""
        good: list[BufferedRow] = []
        bad: list[str] = []
        too_deep: dict[str, str] = {}
        for row in rows:
            try:
                payload = json.loads(row.payload)
                if not isinstance(payload, dict) or payload.get("notification_id") != row.notification_id:
                    raise ValueError("payload is not this notification's JSON object")
            except RecursionError:
                # Valid JSON nested deeper than any decoder here (or central's) takes: stored by an
                # agent that did not check the depth. Kept for an operator, never sent.
                too_deep[row.notification_id] = (
                    "Refused by the site agent: the payload is nested too deeply to decode (central refuses "
                    f"type_data deeper than {MAX_TYPE_DATA_DEPTH} levels)"
                )
            except ValueError as error:
                logger.warning(
                    "Dropping buffered notification %s: its payload cannot be decoded (%s)", row.notification_id, error
                )
                bad.append(row.notification_id)
            else:
                good.append(row)
        if bad:
            result.dropped += self.buffer.delete(bad)
        self._park(too_deep, result)
        return good

    def _send_single(self, row: BufferedRow, result: ForwardResult, link: _Sweep) -> None:
        result.requests += 1
        try:
            response = self.client.post_notification(wire_payload(row))
        except CentralUnreachable as error:
            self._unreachable([row.notification_id], str(error), result, link)
        status = response.status
        if status in (401, 403):
            raise CredentialRejected(status, response.describe())
        if status == 500:
            self._server_error(row.notification_id, response.describe(), result, link)
            return
        if _is_link_failure(status):
            self._unreachable([row.notification_id], response.describe(), result, link)
        link.reached = True
        if status in (200, 201):
            result.forwarded += self.buffer.delete([row.notification_id])
        elif status in (400, 422):
            self._park({row.notification_id: f"Rejected by central: {response.describe()}"}, result)
        elif status == 413:
            self._park({row.notification_id: f"Too large for central: {response.describe()}"}, result)
        elif status == 429:
            raise _Throttled(self._retry_after(response))
        else:
            self._unexpected([row.notification_id], response.describe(), result)

    def _send_batch(
        self, rows: list[BufferedRow], result: ForwardResult, link: _Sweep, stop_event: StopEvent | None
    ) -> None:
        result.requests += 1
        ids = [row.notification_id for row in rows]
        try:
            response = self.client.post_batch([wire_payload(row) for row in rows])
        except CentralUnreachable as error:
            self._unreachable(ids, str(error), result, link)
        status = response.status
        if status in (401, 403):
            raise CredentialRejected(status, response.describe())
        if status == 500:
            # Central failed on something in this request, perhaps one row it cannot handle.
            # Halving isolates such a row in about 2·log2(n) requests; a central that fails on
            # every request costs at most 2n − 1 requests for this batch, and each row then
            # waits a growing interval.
            link.failure = response.describe()
            logger.warning("Central failed on a batch of %d (%s); sending it in halves", len(rows), response.describe())
            middle = len(rows) // 2
            for half in (rows[:middle], rows[middle:]):
                if stop_event is not None and stop_event.is_set():
                    break
                if len(half) == 1:
                    self._send_single(half[0], result, link)
                else:
                    self._send_batch(half, result, link, stop_event)
            return
        if _is_link_failure(status):
            self._unreachable(ids, response.describe(), result, link)
        link.reached = True
        if status == 200:
            self._apply_batch_results(rows, response, result)
        elif status in (400, 404, 405, 413):
            # The envelope, not an item, was refused (too many items or bytes, or no batch
            # endpoint): one post per row gets each its own verdict.
            logger.warning(
                "Central refused a batch of %d (%s); sending them one by one", len(rows), response.describe()
            )
            for row in rows:
                if stop_event is not None and stop_event.is_set():
                    break
                self._send_single(row, result, link)
        elif status == 429:
            raise _Throttled(self._retry_after(response))
        else:
            self._unexpected(ids, response.describe(), result)

    def _apply_batch_results(self, rows: list[BufferedRow], response: CentralResponse, result: ForwardResult) -> None:
        data = response.json()
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            self._unexpected(
                [row.notification_id for row in rows], "HTTP 200 from the batch endpoint without a results list", result
            )
            return
        acknowledged: list[str] = []
        rejected: dict[str, str] = {}
        unanswered: list[str] = []
        for index, row in enumerate(rows):
            item = items[index] if index < len(items) else None
            if not isinstance(item, dict) or item.get("notification_id") not in (row.notification_id, None):
                unanswered.append(row.notification_id)
                continue
            outcome = item.get("result")
            if outcome in ("created", "replayed") and item.get("notification_id") == row.notification_id:
                acknowledged.append(row.notification_id)
            elif outcome == "rejected":
                reason = describe_errors(item.get("errors") or {})
                code = item.get("error")
                rejected[row.notification_id] = one_line(f"Rejected by central{f' ({code})' if code else ''}: {reason}")
            else:
                unanswered.append(row.notification_id)
        result.forwarded += self.buffer.delete(acknowledged)
        self._park(rejected, result)
        if unanswered:
            self._unexpected(unanswered, "central's batch answer had no usable result for this notification", result)

    # --- applying outcomes ------------------------------------------------------------------

    def _park(self, errors: dict[str, str], result: ForwardResult) -> None:
        if not errors:
            return
        parked = self.buffer.park(errors, now=iso_utc(self.clock()))
        result.parked += parked
        for notification_id, error in errors.items():
            logger.warning("Parked notification %s: %s", notification_id, error)

    def _unreachable(self, ids: list[str], error: str, result: ForwardResult, link: _Sweep) -> NoReturn:
        """Record a link failure on the rows tried (nothing counted) and stop the sweep."""
        now = self.clock()
        result.retrying += self.buffer.record_link_failure(
            ids, error=error, now=iso_utc(now), next_attempt_at=iso_utc(now + timedelta(seconds=self.retry_interval))
        )
        result.errors.append(error)
        link.failure = error
        logger.warning(
            "Central unreachable; %d notification(s) stay buffered (nothing is counted or parked for an outage), "
            "next try in %.0f s: %s",
            len(ids),
            self.retry_interval,
            error,
        )
        raise _Unreachable()

    def _server_error(self, notification_id: str, error: str, result: ForwardResult, link: _Sweep) -> None:
        """Central answered 500 to one row: back off that row, never park it."""
        count = self.buffer.record_server_error(
            notification_id,
            error=error,
            now=self.clock(),
            first_interval=self.retry_interval,
            max_interval=self.server_error_max_backoff,
        )
        if count is None:
            return
        result.retrying += 1
        result.server_errors += 1
        result.errors.append(error)
        link.failure = error
        logger.warning(
            "Central failed on notification %s (%d time(s)); retrying it with back-off, never parked: %s",
            notification_id,
            count,
            error,
        )

    def _unexpected(self, ids: list[str], error: str, result: ForwardResult) -> None:
        """An answer outside central's contract: counted toward max_retries."""
        now = self.clock()
        retrying, parked = self.buffer.record_transient_failure(
            ids,
            error=error,
            now=iso_utc(now),
            next_attempt_at=iso_utc(now + timedelta(seconds=self.retry_interval)),
            max_retries=self.max_retries,
        )
        result.retrying += retrying
        result.parked += parked
        result.errors.append(error)
        logger.warning(
            "Unexpected answer from central for %d notification(s), will retry in %.0f s: %s",
            len(ids),
            self.retry_interval,
            error,
        )
        if parked:
            logger.warning("Parked %d notification(s): retries exhausted (%d)", parked, self.max_retries)

    def _retry_after(self, response: CentralResponse) -> float:
        return retry_after_seconds(response.headers.get("retry-after"), default=self.retry_interval, now=self.clock())
