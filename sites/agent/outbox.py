"""``SiteOutbox``: the API a site script uses (send, status) and the forwarder's entry points."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Dict

from sites.agent.buffer import FORWARDING, PARKED, Buffer, BufferedRow, iso_utc
from sites.agent.central import CentralClient, CentralUnreachable
from sites.agent.contract import MAX_BODY_BYTES, check_list_name, check_text, notification_payload
from sites.agent.forwarder import CredentialRejected, Forwarder, ForwardResult
from sites.agent.sitelink import SiteLink
from sites.agent.stopping import StopSignal
from sites.agent.wakeup import WakeListener, wake_forwarder

if TYPE_CHECKING:
    from sites.agent.stopping import StopEvent

# How often a forwarder that waits on a plain threading.Event (no socket to select on) looks at it.
_EVENT_POLL_SECONDS = 0.1

logger = logging.getLogger("sites.agent")

# Statuses the agent reports for rows it still holds (Forwarding exists only here, never at central).
STATUS_FORWARDING = "Forwarding"
STATUS_PARKED_AT_SITE = "Parked"

Record = Dict[str, Any]


class AgentNotConfigured(Exception):
    """The operation needs central's URL and the site key, and this agent was given none."""


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _canonical_id(notification_id: object) -> str:
    """The id as lower-case hyphenated text; ValueError if it is not a UUID."""
    return str(uuid.UUID(str(notification_id)))


class Notifier:
    """``outbox.notify("Operators")``: sends notifications to one notification list."""

    def __init__(self, outbox: SiteOutbox, list_name: str) -> None:
        self._outbox = outbox
        self.list_name = list_name

    def send(
        self,
        subject: str,
        body: str,
        *,
        source_instance_id: str | None = None,
        source_script: str | None = None,
        type: str = "email",
        type_data: dict[str, Any] | None = None,
    ) -> str:
        """Buffer one notification durably and return its id (a str UUID) at once.

        Returns only after the row is committed to the local SQLite buffer; never waits for
        central. Input central would certainly refuse raises before anything is buffered:
        TypeError for a value of the wrong type, :class:`~sites.agent.contract.InvalidNotification`
        (a ValueError naming the field) for NUL characters, a multi-line subject, a field over
        its length limit, type_data over 64 KiB, or a notification over ``max_body_bytes``.
        """
        return self._outbox._buffer_notification(
            list_name=self.list_name,
            subject=subject,
            body=body,
            source_instance_id=source_instance_id,
            source_script=source_script,
            type=type,
            type_data=type_data,
        )


class SiteOutbox:
    """The site half of the outbox: a durable local buffer plus a forwarder to central.

    ``central_url`` and ``api_key`` may be None in a process that only sends (the forwarder
    runs elsewhere); forwarding and asking central for a status then raise
    :class:`AgentNotConfigured`. ``max_retries`` 0 means never park for retry exhaustion.
    ``max_body_bytes`` is central's request body limit (``OUTBOX_MAX_BODY_BYTES``); a
    notification larger than that is refused at ``send()``. ``ca_file``, ``client_cert`` /
    ``client_key``, ``proxy`` and ``no_proxy`` configure the connection to central (see
    :class:`~sites.agent.central.CentralClient`). ``heartbeat_interval``: seconds between the
    forwarder's heartbeats to central (``OUTBOX_AGENT_HEARTBEAT``, 30; 0 sends none).
    ``use_returning`` False forces the buffer's path for SQLite older than 3.35. ``clock``
    (returning an aware UTC datetime) exists for tests.
    Raises ValueError for a setting out of range or a certificate file that cannot be loaded.
    """

    def __init__(
        self,
        db_path: str | os.PathLike,
        central_url: str | None,
        api_key: str | None,
        *,
        sweep_interval: float = 10,
        retry_interval: float = 30,
        max_retries: int = 50,
        batch_size: int = 500,
        timeout: float = 10,
        site_id: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        proxy: str | None = None,
        no_proxy: str | None = None,
        heartbeat_interval: float = 30,
        use_returning: bool | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if (
            heartbeat_interval < 0
            or sweep_interval <= 0
            or retry_interval < 0
            or max_retries < 0
            or batch_size < 1
            or timeout <= 0
            or max_body_bytes < 1024
        ):
            raise ValueError(
                "need sweep_interval > 0, retry_interval >= 0, max_retries >= 0, batch_size >= 1, timeout > 0, "
                "max_body_bytes >= 1024, heartbeat_interval >= 0"
            )
        if site_id:
            check_text("source_site_id", site_id)
        self.sweep_interval = float(sweep_interval)
        self.retry_interval = float(retry_interval)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.timeout = float(timeout)
        self.site_id = site_id
        self.max_body_bytes = int(max_body_bytes)
        self.heartbeat_interval = float(heartbeat_interval)
        self._clock = clock or _utc_now
        self._listener: WakeListener | None = None
        self.client: CentralClient | None = None
        if central_url and api_key:
            self.client = CentralClient(
                central_url,
                api_key,
                timeout=timeout,
                ca_file=ca_file,
                client_cert=client_cert,
                client_key=client_key,
                proxy=proxy,
                no_proxy=no_proxy,
            )
        self.buffer = Buffer(db_path, use_returning=use_returning)
        self._forwarder: Forwarder | None = None
        self.link: SiteLink | None = None
        if self.client is not None:
            from sites.agent import __version__

            self.link = SiteLink(buffer=self.buffer, client=self.client, clock=self._clock, agent_version=__version__)
            self._forwarder = Forwarder(
                buffer=self.buffer,
                client=self.client,
                clock=self._clock,
                retry_interval=self.retry_interval,
                max_retries=self.max_retries,
                batch_size=self.batch_size,
                max_batch_bytes=self.max_body_bytes,
            )

    def close(self) -> None:
        """Close the buffer's connections and central's; the object is unusable afterwards."""
        self.buffer.close()
        if self.client is not None:
            self.client.close()

    def __enter__(self) -> SiteOutbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- sending ----------------------------------------------------------------------------

    def notify(self, list_name: str) -> Notifier:
        """A sender for the notification list ``list_name`` (resolved by central at delivery).

        Raises TypeError/:class:`~sites.agent.contract.InvalidNotification` for a name central
        would refuse (blank, multi-line, over 200 characters).
        """
        check_list_name(list_name)
        return Notifier(self, list_name)

    def _buffer_notification(
        self,
        *,
        list_name: str,
        subject: str,
        body: str,
        source_instance_id: str | None,
        source_script: str | None,
        type: str,
        type_data: dict[str, Any] | None,
    ) -> str:
        now = iso_utc(self._clock())
        notification_id, text = notification_payload(
            list_name=list_name,
            subject=subject,
            body=body,
            source_instance_id=source_instance_id,
            source_script=source_script,
            type=type,
            type_data=type_data,
            site_id=self.site_id,
            enqueued_at=now,
            max_body_bytes=self.max_body_bytes,
        )
        self.buffer.insert(notification_id=notification_id, payload=text, created_at=now)
        self.wake()
        return notification_id

    def wake(self) -> None:
        """Ask the forwarder of this buffer — a thread of this process or the running
        ``forward`` service — to sweep now rather than at its next interval. Never fails."""
        listener = self._listener
        if listener is not None:
            listener.poke()
        else:
            wake_forwarder(self.buffer.path)

    # --- status -----------------------------------------------------------------------------

    def status(self, notification_id: object) -> Record | None:
        """Where a notification is and how it is doing, as a dict; None if nobody knows it.

        While the site holds the row: ``status`` is ``Forwarding`` or (site-side) ``Parked``,
        with ``location`` ``"site"``. Otherwise central's status record (docs/api.md) with
        ``location`` ``"central"``. None when central answers 404. Raises ValueError for an id
        that is not a UUID, :class:`CentralUnreachable` when central cannot be asked,
        :class:`CredentialRejected` on 401/403.
        """
        notification_id = _canonical_id(notification_id)
        row = self.buffer.get(notification_id)
        if row is not None:
            return self._local_status(row)
        client = self._require_client("ask central for a status")
        response = client.get_status(notification_id)
        if response.status == 200 and isinstance(response.json(), dict):
            return {**response.json(), "location": "central"}
        if response.status == 404:
            # The forwarder may have deleted the row between our read and the GET only after
            # central committed it, so a 404 here really means unknown.
            return None
        if response.status in (401, 403):
            raise CredentialRejected(response.status, response.describe())
        raise CentralUnreachable(f"central could not answer the status: {response.describe()}")

    @staticmethod
    def _local_status(row: BufferedRow) -> Record:
        try:
            payload = json.loads(row.payload)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to decode
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        return {
            "notification_id": row.notification_id,
            "type": payload.get("type"),
            "list_name": payload.get("list_name"),
            "status": STATUS_FORWARDING if row.status == FORWARDING else STATUS_PARKED_AT_SITE,
            "retry_count": row.retry_count,
            "last_error": row.last_error,
            "site_enqueued_at": payload.get("site_enqueued_at", row.created_at),
            "created_at": None,  # central's ingest time: not yet
            "last_attempt_at": row.last_attempt_at,
            "next_attempt_at": row.next_attempt_at if row.status == FORWARDING else None,
            "delivered_at": None,
            "location": "site",
        }

    # --- forwarding -------------------------------------------------------------------------

    def _require_client(self, doing: str) -> CentralClient:
        if self.client is None:
            raise AgentNotConfigured(f"cannot {doing}: this agent has no central URL and site key")
        return self.client

    @property
    def forwarder(self) -> Forwarder:
        """The forwarder; AgentNotConfigured when this agent has no central URL and key."""
        if self._forwarder is None:
            self._require_client("forward")
        assert self._forwarder is not None
        return self._forwarder

    def forward_once(
        self,
        *,
        stop_event: StopEvent | None = None,
        progress: Callable[[ForwardResult], None] | None = None,
    ) -> ForwardResult:
        """One sweep: post every due row (batches of ``batch_size``) and apply the answers.

        Returns a :class:`~sites.agent.forwarder.ForwardResult` (forwarded / parked / retrying /
        dropped counts). Stops between requests when ``stop_event`` is set. ``progress(result)``
        is called after each request. Raises :class:`CredentialRejected` when central refuses
        the key or the site (nothing is parked).
        """
        result = self.forwarder.sweep(stop_event=stop_event, progress=progress)
        if self.link is not None:
            self.link.record_sweep(forwarded=result.forwarded, errors=result.errors)
        return result

    def sync_with_central(self, *, heartbeat: bool = True) -> int:
        """A heartbeat (when ``heartbeat``) with the operator commands it brings back, executed;
        then command acknowledgements and parked reports (see :mod:`sites.agent.sitelink`).
        Returns how many parked rows a Retry command made due now. Never raises for central
        being unreachable or refusing (that is logged)."""
        self._require_client("talk to central")
        assert self.link is not None  # exists whenever the client does
        return self.link.sync(heartbeat=heartbeat)

    def run_forever(self, stop_event: StopEvent, *, progress: Callable[[ForwardResult], None] | None = None) -> None:
        """Forward until ``stop_event`` is set: a sweep whenever a notification is sent to this
        buffer (from this process or another, see :mod:`sites.agent.wakeup`) and every
        ``sweep_interval`` seconds for retries; a heartbeat every ``heartbeat_interval`` seconds,
        executing the operator commands central answers with; parked rows reported to central.

        ``stop_event`` is a ``threading.Event`` or a :class:`~sites.agent.stopping.StopSignal`
        (which signal handlers can set safely).

        A rejected credential does not stop the loop: it is logged at ERROR and tried again
        every ``retry_interval`` seconds, so a fixed key resumes forwarding with no restart.
        """
        client = self._require_client("forward")
        listener = WakeListener(self.buffer.path)
        self._listener = listener
        listener.publish()
        logger.info("Forwarding %s to %s every %.0f s", self.buffer.path, client.base_url, self.sweep_interval)
        next_heartbeat = time.monotonic()
        try:
            while not stop_event.is_set():
                wait = self.sweep_interval
                rejected = False
                parked_now = 0
                try:
                    parked_now = self.forward_once(stop_event=stop_event, progress=progress).parked
                except CredentialRejected:
                    wait = max(self.retry_interval, self.sweep_interval)
                    rejected = True
                except Exception:  # a forwarder that dies quietly is worse than one that logs and retries
                    logger.exception("Forwarding sweep failed; trying again in %.0f s", self.sweep_interval)
                if stop_event.is_set():
                    break
                heartbeat_due = self.heartbeat_interval > 0 and time.monotonic() >= next_heartbeat
                if not rejected and (heartbeat_due or parked_now):
                    if heartbeat_due:
                        next_heartbeat = time.monotonic() + self.heartbeat_interval
                    try:
                        if self.sync_with_central(heartbeat=heartbeat_due):
                            continue  # an operator's Retry made rows due: forward them now
                    except Exception:
                        logger.exception("Exchange with central (heartbeat, commands, reports) failed")
                if self.heartbeat_interval > 0:
                    wait = min(wait, max(next_heartbeat - time.monotonic(), 0.0))
                self._sleep(stop_event, listener, wait)
        finally:
            self._listener = None
            listener.close()

    @staticmethod
    def _sleep(stop_event: StopEvent, listener: WakeListener, seconds: float) -> None:
        """Wait ``seconds``, returning early for a wake-up or a stop request."""
        deadline = time.monotonic() + seconds
        if isinstance(stop_event, StopSignal):
            while not stop_event.poll():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or listener.wait(remaining, also=[stop_event.selectable]):
                    return
            return
        # A threading.Event has nothing to select on: look at it between short waits.
        while not stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or listener.wait(min(remaining, _EVENT_POLL_SECONDS)):
                return

    # --- operator actions -------------------------------------------------------------------

    def parked(self) -> list[Record]:
        """The site-parked rows, oldest first, as local status dicts with subject and payload."""
        records = []
        for row in self.buffer.parked():
            record = self._local_status(row)
            try:
                record["subject"] = json.loads(row.payload).get("subject")
            except (ValueError, AttributeError, RecursionError):
                record["subject"] = None
            records.append(record)
        return records

    def retry(self, notification_id: object) -> bool:
        """Parked → Forwarding with the retry count reset, due on the next sweep. True if it was parked."""
        return self.buffer.retry(_canonical_id(notification_id), now=iso_utc(self._clock()))

    def discard(self, notification_id: object) -> dict[str, Any] | None:
        """Delete a parked row; returns its payload dict (what was discarded), or None if not parked."""
        row = self.buffer.discard(_canonical_id(notification_id))
        if row is None:
            return None
        logger.warning("Discarded parked notification %s (last error: %s)", row.notification_id, row.last_error)
        try:
            return json.loads(row.payload)
        except (ValueError, RecursionError):
            return {"notification_id": row.notification_id, "payload": row.payload}

    def stats(self) -> dict[str, int]:
        """``{"buffered": rows waiting to be forwarded, "parked": rows parked at the site}``."""
        counts = self.buffer.counts()
        return {"buffered": counts[FORWARDING], "parked": counts[PARKED]}
