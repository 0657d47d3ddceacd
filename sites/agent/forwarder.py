"""The forwarder: posts buffered notifications to central and applies central's verdict.

Classification of central's answers, in one place:

=========================================  ==========================================================
answer                                     what happens to the rows in that request
=========================================  ==========================================================
201 / 200, batch ``created``/``replayed``  deleted (central has committed them)
400 / 422, batch ``rejected``              parked with central's error (retrying cannot fix them)
413 to a single post                       parked (the notification is larger than central accepts)
413 / 400 / 404 / 405 to a batch           the same rows are sent again one by one
401 / 403                                  nothing changes; :class:`CredentialRejected` is raised
429                                        nothing changes and no retry is counted; the forwarder
                                           holds off for Retry-After seconds
no answer, timeout, 5xx, anything else     transient: retry_count + 1, next attempt after the
                                           retry interval, parked once max_retries is reached
=========================================  ==========================================================
"""

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

from sites.agent.buffer import iso_utc
from sites.agent.central import CentralUnreachable, describe_errors

logger = logging.getLogger("sites.agent")

# A misconfigured central must not silence a site for days.
MAX_RETRY_AFTER_SECONDS = 3600.0

# Central refuses bodies over OUTBOX_MAX_BODY_BYTES (1 MiB by default) with 413; cutting batches
# below that up front saves uploading a megabyte only to fall back to single posts.
MAX_BATCH_BYTES = 1_000_000


class CredentialRejected(Exception):
    """Central refused the site's key (401) or the site (403). Nothing was parked.

    ``result`` holds what the interrupted sweep had done before the refusal.
    """

    def __init__(self, status, detail, result=None):
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
    errors: list = field(default_factory=list)

    def as_dict(self):
        return {
            "forwarded": self.forwarded,
            "parked": self.parked,
            "retrying": self.retrying,
            "dropped": self.dropped,
            "requests": self.requests,
            "throttled_for": self.throttled_for,
        }


class _Throttled(Exception):
    def __init__(self, seconds):
        self.seconds = seconds


def retry_after_seconds(value, *, default, now=None):
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

    def __init__(self, *, buffer, client, clock, retry_interval, max_retries, batch_size,
                 max_batch_bytes=MAX_BATCH_BYTES):  # fmt: skip
        self.buffer = buffer
        self.client = client
        self.clock = clock
        self.retry_interval = float(retry_interval)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.max_batch_bytes = int(max_batch_bytes)
        self._hold_until = None  # set by a 429: no request before this moment
        self._lock = threading.Lock()

    def held_for(self):
        """Seconds left of a 429 hold, or None."""
        if self._hold_until is None:
            return None
        left = (self._hold_until - self.clock()).total_seconds()
        if left <= 0:
            self._hold_until = None
            return None
        return left

    def sweep(self, *, stop_event=None, progress=None):
        with self._lock:
            return self._sweep(stop_event=stop_event, progress=progress)

    def _sweep(self, *, stop_event, progress):
        result = ForwardResult()
        held = self.held_for()
        if held is not None:
            result.throttled_for = held
            return result
        sweep_start = iso_utc(self.clock())
        attempted = set()
        while not (stop_event is not None and stop_event.is_set()):
            rows = [row for row in self.buffer.due(now=sweep_start, limit=self.batch_size)
                    if row.notification_id not in attempted]  # fmt: skip
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

    def _by_size(self, rows):
        """Rows cut into runs whose batch body stays under ``max_batch_bytes``."""
        chunk, size = [], 32  # the {"notifications": [...]} envelope
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

    def _drop_undecodable(self, rows, result):
        """Delete rows whose payload is not a notification object: retrying cannot fix them."""
        good, bad = [], []
        for row in rows:
            try:
                payload = json.loads(row.payload)
                if not isinstance(payload, dict) or payload.get("notification_id") != row.notification_id:
                    raise ValueError("payload is not this notification's JSON object")
            except ValueError as error:
                logger.warning("Dropping buffered notification %s: its payload cannot be decoded (%s)",
                               row.notification_id, error)  # fmt: skip
                bad.append(row.notification_id)
            else:
                good.append(row)
        if bad:
            result.dropped += self.buffer.delete(bad)
        return good

    def _send_single(self, row, result):
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

    def _send_batch(self, rows, result, stop_event):
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
            logger.warning("Central refused a batch of %d (%s); sending them one by one",
                           len(rows), response.describe())  # fmt: skip
            for row in rows:
                if stop_event is not None and stop_event.is_set():
                    break
                self._send_single(row, result)
        elif status in (401, 403):
            raise CredentialRejected(status, response.describe())
        elif status == 429:
            raise _Throttled(self._retry_after(response))
        else:
            self._transient(ids, response.describe(), result)

    def _apply_batch_results(self, rows, response, result):
        data = response.json()
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            self._transient([row.notification_id for row in rows],
                            "HTTP 200 from the batch endpoint without a results list", result)  # fmt: skip
            return
        acknowledged, rejected, unanswered = [], {}, []
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

    def _park(self, errors, result):
        if not errors:
            return
        parked = self.buffer.park(errors, now=iso_utc(self.clock()))
        result.parked += parked
        for notification_id, error in errors.items():
            logger.warning("Parked notification %s: %s", notification_id, error)

    def _transient(self, ids, error, result):
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
        logger.warning("Could not forward %d notification(s), will retry in %.0f s: %s",
                       len(ids), self.retry_interval, error)  # fmt: skip
        if parked:
            logger.warning("Parked %d notification(s): retries exhausted (%d)", parked, self.max_retries)

    def _retry_after(self, response):
        return retry_after_seconds(response.headers.get("retry-after"), default=self.retry_interval, now=self.clock())
