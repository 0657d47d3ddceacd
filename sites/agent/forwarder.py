"""The forwarder: posts buffered notifications to central and applies central's verdict.

Classification of central's answers, in one place:

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
401 / 403                                  nothing changes; :class:`CredentialRejected` is raised
429                                        nothing changes and no retry is counted; the forwarder
                                           holds off for Retry-After seconds
no answer, timeout, 5xx, anything else     transient: retry_count + 1, next attempt after the
                                           retry interval, parked once max_retries is reached
=========================================  ==========================================================
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable, Iterator

from sites.agent.buffer import Buffer, BufferedRow, iso_utc
from sites.agent.central import CentralClient, CentralResponse, CentralUnreachable, describe_errors
from sites.agent.contract import MAX_BODY_BYTES, MAX_TYPE_DATA_DEPTH

if TYPE_CHECKING:
    from sites.agent.stopping import StopEvent

Progress = Callable[["ForwardResult"], None]

logger = logging.getLogger("sites.agent")

# A misconfigured central must not silence a site for days.
MAX_RETRY_AFTER_SECONDS = 3600.0

# Central refuses bodies over OUTBOX_MAX_BODY_BYTES (1 MiB by default) with 413; cutting batches
# below that up front saves uploading a megabyte only to fall back to single posts.
MAX_BATCH_BYTES = MAX_BODY_BYTES


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
    """What one sweep did. ``throttled_for`` is set when central answered 429."""

    forwarded: int = 0
    parked: int = 0
    retrying: int = 0
    dropped: int = 0
    requests: int = 0
    throttled_for: float | None = None
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
        }


class _Throttled(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


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


class Forwarder:
    """One sweep over the due rows of a buffer. Not meant to run twice at once on one buffer
    (a second forwarder is harmless — central answers replays with 200 — only wasteful)."""

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
    ) -> None:
        self.buffer = buffer
        self.client = client
        self.clock = clock
        self.retry_interval = float(retry_interval)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.max_batch_bytes = int(max_batch_bytes)
        self._hold_until: datetime | None = None  # set by a 429: no request before this moment
        self._lock = threading.Lock()

    def held_for(self) -> float | None:
        """Seconds left of a 429 hold, or None."""
        if self._hold_until is None:
            return None
        left = (self._hold_until - self.clock()).total_seconds()
        if left <= 0:
            self._hold_until = None
            return None
        return left

    def sweep(self, *, stop_event: StopEvent | None = None, progress: Progress | None = None) -> ForwardResult:
        """Forward every row due at the sweep's start once; see the module docstring for what
        each answer does. Raises :class:`CredentialRejected` on 401/403."""
        with self._lock:
            return self._sweep(stop_event=stop_event, progress=progress)

    def _sweep(self, *, stop_event: StopEvent | None, progress: Progress | None) -> ForwardResult:
        result = ForwardResult()
        held = self.held_for()
        if held is not None:
            result.throttled_for = held
            return result
        sweep_start = iso_utc(self.clock())
        attempted: set = set()
        while not (stop_event is not None and stop_event.is_set()):
            rows = [
                row
                for row in self.buffer.due(now=sweep_start, limit=self.batch_size)
                if row.notification_id not in attempted
            ]
            if not rows:
                break
            attempted.update(row.notification_id for row in rows)
            rows = self._drop_undecodable(rows, result)
            if not rows:
                continue
            try:
                for chunk in self._by_size(rows):
                    if stop_event is not None and stop_event.is_set():
                        break
                    if len(chunk) == 1:
                        self._send_single(chunk[0], result)
                    else:
                        self._send_batch(chunk, result, stop_event)
                    if progress is not None:
                        progress(result)
            except _Throttled as throttled:
                self._hold_until = self.clock() + timedelta(seconds=throttled.seconds)
                result.throttled_for = throttled.seconds
                logger.warning("Central is throttling (HTTP 429); holding off for %.1f s", throttled.seconds)
                break
            except CredentialRejected as rejected:
                rejected.result = result
                logger.error(
                    "FORWARDING STOPPED — %s — nothing was parked and buffered notifications stay in the "
                    "buffer. Fix the site key (OUTBOX_SITE_KEY) or reactivate the site at central.",
                    rejected,
                )
                raise
        return result

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

    def _send_single(self, row: BufferedRow, result: ForwardResult) -> None:
        result.requests += 1
        try:
            response = self.client.post_notification(row.payload)
        except CentralUnreachable as error:
            self._transient([row.notification_id], str(error), result)
            return
        status = response.status
        if status in (200, 201):
            result.forwarded += self.buffer.delete([row.notification_id])
        elif status in (400, 422):
            self._park({row.notification_id: f"Rejected by central: {response.describe()}"}, result)
        elif status == 413:
            self._park({row.notification_id: f"Too large for central: {response.describe()}"}, result)
        elif status in (401, 403):
            raise CredentialRejected(status, response.describe())
        elif status == 429:
            raise _Throttled(self._retry_after(response))
        else:
            self._transient([row.notification_id], response.describe(), result)

    def _send_batch(self, rows: list[BufferedRow], result: ForwardResult, stop_event: StopEvent | None) -> None:
        result.requests += 1
        ids = [row.notification_id for row in rows]
        try:
            response = self.client.post_batch([row.payload for row in rows])
        except CentralUnreachable as error:
            self._transient(ids, str(error), result)
            return
        status = response.status
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
                self._send_single(row, result)
        elif status == 500:
            # Central failed on something in this request, perhaps one row it cannot handle.
            # Halving isolates such a row in about 2·log2(n) requests; a central that fails on
            # every request costs at most 2n − 1 requests for this batch, once per retry interval.
            logger.warning("Central failed on a batch of %d (%s); sending it in halves", len(rows), response.describe())
            middle = len(rows) // 2
            for half in (rows[:middle], rows[middle:]):
                if stop_event is not None and stop_event.is_set():
                    break
                if len(half) == 1:
                    self._send_single(half[0], result)
                else:
                    self._send_batch(half, result, stop_event)
        elif status in (401, 403):
            raise CredentialRejected(status, response.describe())
        elif status == 429:
            raise _Throttled(self._retry_after(response))
        else:
            self._transient(ids, response.describe(), result)

    def _apply_batch_results(self, rows: list[BufferedRow], response: CentralResponse, result: ForwardResult) -> None:
        data = response.json()
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            self._transient(
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
                rejected[row.notification_id] = f"Rejected by central{f' ({code})' if code else ''}: {reason}"
            else:
                unanswered.append(row.notification_id)
        result.forwarded += self.buffer.delete(acknowledged)
        self._park(rejected, result)
        if unanswered:
            self._transient(unanswered, "central's batch answer had no usable result for this notification", result)

    # --- applying outcomes ------------------------------------------------------------------

    def _park(self, errors: dict[str, str], result: ForwardResult) -> None:
        if not errors:
            return
        parked = self.buffer.park(errors, now=iso_utc(self.clock()))
        result.parked += parked
        for notification_id, error in errors.items():
            logger.warning("Parked notification %s: %s", notification_id, error)

    def _transient(self, ids: list[str], error: str, result: ForwardResult) -> None:
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
            "Could not forward %d notification(s), will retry in %.0f s: %s", len(ids), self.retry_interval, error
        )
        if parked:
            logger.warning("Parked %d notification(s): retries exhausted (%d)", parked, self.max_retries)

    def _retry_after(self, response: CentralResponse) -> float:
        return retry_after_seconds(response.headers.get("retry-after"), default=self.retry_interval, now=self.clock())
