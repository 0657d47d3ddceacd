"""``SiteOutbox``: the API a site script uses (send, status, watchdogs, acknowledgements) and
the forwarder's entry points."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping

from sites.agent.buffer import FORWARDING, PARKED, Buffer, BufferedRow, iso_utc, parse_utc
from sites.agent.central import CentralClient, CentralUnreachable
from sites.agent.contract import (
    DEFAULT_PRIORITY,
    MAX_BODY_BYTES,
    check_list_name,
    check_text,
    check_watchdog,
    notification_payload,
)
from sites.agent.fallback import FallbackResult, LocalFallback, fallback_config
from sites.agent.forwarder import SERVER_ERROR_MAX_BACKOFF, CredentialRejected, Forwarder, ForwardResult
from sites.agent.sitelink import SiteLink
from sites.agent.state import LinkSnapshot, LinkState
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
# Central's statuses after which nothing more happens to a notification. ``Suppressed``: central
# kept it without sending it (a duplicate, a silence, a flood digest; ``suppressed_by`` says which).
FINAL_STATUSES = ("Delivered", "Discarded", "Suppressed")

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
        priority: str = DEFAULT_PRIORITY,
        dedup_key: str | None = None,
    ) -> str:
        """Buffer one notification durably and return its id (a str UUID) at once.

        Returns only after the row is committed to the local SQLite buffer; never waits for
        central. ``priority`` (``critical``, ``high``, ``normal``, ``low``) orders the
        forwarding and decides what the local fallback relay sends; ``dedup_key`` lets central
        suppress repeats of the same alarm. Input central would certainly refuse raises before
        anything is buffered: TypeError for a value of the wrong type,
        :class:`~sites.agent.contract.InvalidNotification` (a ValueError naming the field) for
        an unknown priority, NUL characters, a multi-line subject, a field over its length
        limit, type_data over 64 KiB, or a notification over ``max_body_bytes``.
        """
        return self._outbox._buffer_notification(
            list_name=self.list_name,
            subject=subject,
            body=body,
            source_instance_id=source_instance_id,
            source_script=source_script,
            type=type,
            type_data=type_data,
            priority=priority,
            dedup_key=dedup_key,
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
    ``fallback``: the local relay for urgent notifications while central is unreachable
    (:mod:`sites.agent.fallback`), checked here. ``use_returning`` False forces the buffer's
    path for SQLite older than 3.35. ``clock`` (returning an aware UTC datetime) exists for
    tests. Raises ValueError for a setting out of range, a fallback setting that is wrong
    (naming it) or a certificate file that cannot be loaded.
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
        fallback: Mapping[str, Any] | None = None,
        server_error_max_backoff: float = SERVER_ERROR_MAX_BACKOFF,
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
        self.fallback_config = fallback_config(fallback)
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
        self.state = LinkState(buffer=self.buffer, clock=self._clock)
        self._forwarder: Forwarder | None = None
        self.link: SiteLink | None = None
        self.fallback: LocalFallback | None = None
        if self.fallback_config is not None:
            self.fallback = LocalFallback(
                config=self.fallback_config,
                buffer=self.buffer,
                state=self.state,
                clock=self._clock,
                site=site_id or socket.gethostname(),
                central_url=central_url or "central",
                retry_interval=self.retry_interval,
            )
        if self.client is not None:
            from sites.agent import __version__

            self.link = SiteLink(
                buffer=self.buffer,
                client=self.client,
                clock=self._clock,
                agent_version=__version__,
                state=self.state,
                fallback=self.fallback,
                retry_interval=self.retry_interval,
            )
            self._forwarder = Forwarder(
                buffer=self.buffer,
                client=self.client,
                clock=self._clock,
                retry_interval=self.retry_interval,
                max_retries=self.max_retries,
                batch_size=self.batch_size,
                max_batch_bytes=self.max_body_bytes,
                state=self.state,
                server_error_max_backoff=server_error_max_backoff,
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
        priority: str,
        dedup_key: str | None,
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
            priority=priority,
            dedup_key=dedup_key,
        )
        self.buffer.insert(notification_id=notification_id, payload=text, created_at=now, priority=priority)
        self.wake()
        return notification_id

    # --- watchdogs ----------------------------------------------------------------------------

    def watchdog(self, name: str, every_seconds: int, list_name: str, type: str = "email") -> None:
        """Ping the watchdog ``name``: the site script is alive. Central raises a ``high``
        notification for ``list_name`` (on channel ``type``) when two intervals of
        ``every_seconds`` pass without a ping, and a ``normal`` one when pings resume.

        Cheap enough for a script's main loop, every second: one local write that keeps only
        this watchdog's latest ping, and no network call (the forwarder sends the latest ping
        before each heartbeat). Raises TypeError/:class:`~sites.agent.contract.InvalidNotification`
        for a blank or multi-line name, an interval that is not a whole number of seconds from
        1 to a week, or a list name or type central would refuse.
        """
        check_watchdog(name=name, every_seconds=every_seconds, list_name=list_name, type=type)
        self.buffer.watchdog_ping(
            name=name, every_seconds=every_seconds, list_name=list_name, type=type, pinged_at=iso_utc(self._clock())
        )

    # --- acknowledgements -----------------------------------------------------------------------

    def acknowledgements(self, since: datetime | str | None = None, *, consume: bool = False) -> list[Record]:
        """Acknowledgements central sent for this site's notifications, in the order they
        arrived: dicts with ``notification_id``, ``acknowledged_at`` (central's time),
        ``acknowledged_via`` (``link``, ``sms``, ``teams``, ``console`` or ``api``: central does
        not send back the site's own),
        ``acknowledged_by`` (masked by central), ``note`` and ``received_at`` (when this site
        stored it, by this site's clock).

        ``since`` (an aware datetime, or ISO-8601 text; a naive one is taken as UTC): only those
        with ``received_at`` after it. ``consume=True``: only those no call with ``consume=True``
        has returned yet — in any process, before any restart — and they are marked handed over
        in the same transaction, so each is handed over exactly once. Any process using this
        buffer can read them; the forwarder that stored them may run elsewhere. ValueError for a
        ``since`` that is not a time.
        """
        since_text = None
        if since is not None:
            moment = since if isinstance(since, datetime) else parse_utc(str(since))
            if moment is None:
                raise ValueError(f"since must be a datetime or an ISO-8601 time, got {since!r}")
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            since_text = iso_utc(moment)
        stored = self.buffer.acknowledgements(since=since_text, consume=consume, now=iso_utc(self._clock()))
        return [acknowledgement.as_dict() for acknowledgement in stored]

    def acknowledge(self, notification_id: object, by: str = "", note: str = "") -> None:
        """The plant acknowledged this notification (e.g. in its HMI): buffered, and sent to
        central once the notification itself has reached central. Central stops escalating
        it. ``by``: who (one line, at most 200 characters); ``note``: at most 1,000 characters.
        ValueError for an id that is not a UUID or text central would refuse."""
        notification_id = _canonical_id(notification_id)
        body: dict[str, str] = {}
        if by:
            body["by"] = check_text("by", by)
        if note:
            body["note"] = check_text("note", note)
        self._buffer_site_action(notification_id, "ack", body)

    def clear(self, notification_id: object, note: str = "") -> None:
        """The alarm behind this notification returned to normal at the plant: buffered, and
        sent to central once the notification itself has reached central (central stops
        escalating; clearing is not an acknowledgement). ValueError as for :meth:`acknowledge`."""
        notification_id = _canonical_id(notification_id)
        body = {"note": check_text("note", note)} if note else {}
        self._buffer_site_action(notification_id, "clear", body)

    def _buffer_site_action(self, notification_id: str, action: str, body: dict[str, str]) -> None:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        self.buffer.site_action_add(
            notification_id=notification_id, action=action, body=text, now=iso_utc(self._clock())
        )
        self.wake()

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
        with ``location`` ``"site"``, its ``priority``, ``held`` (why it is not reaching central
        now — a refused key, a rate limit, an outage, central failing on it — or None) and
        ``local_delivery`` (what the local fallback relay did with it, or None). Otherwise
        central's status record (docs/api.md) with ``location`` ``"central"``; central's final
        statuses are ``Delivered``, ``Discarded`` and ``Suppressed`` (``final`` True; for
        ``Suppressed`` central says why in ``suppressed_by``). Both carry ``acknowledgement``:
        the acknowledgement central sent this site, or None. None when central answers 404.
        Raises ValueError for an id that is not a UUID, :class:`CentralUnreachable` when central
        cannot be asked, :class:`CredentialRejected` on 401/403.
        """
        notification_id = _canonical_id(notification_id)
        acknowledgement = self.buffer.acknowledgement_for(notification_id)
        ack = None if acknowledgement is None else acknowledgement.as_dict()
        row = self.buffer.get(notification_id)
        if row is not None:
            return {**self._local_status(row, self.state.snapshot()), "acknowledgement": ack}
        client = self._require_client("ask central for a status")
        response = client.get_status(notification_id)
        if response.status == 200 and isinstance(response.json(), dict):
            record = response.json()
            return {
                **record,
                "location": "central",
                "final": record.get("status") in FINAL_STATUSES,
                "acknowledgement": ack,
            }
        if response.status == 404:
            # The forwarder may have deleted the row between our read and the GET only after
            # central committed it, so a 404 here really means unknown.
            return None
        if response.status in (401, 403):
            raise CredentialRejected(response.status, response.describe())
        raise CentralUnreachable(f"central could not answer the status: {response.describe()}")

    @staticmethod
    def _local_status(row: BufferedRow, snapshot: LinkSnapshot | None = None) -> Record:
        try:
            payload = json.loads(row.payload)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to decode
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        held = None
        if row.status == FORWARDING:
            if snapshot is not None:
                held = snapshot.held_reason(row.priority)
            if held is None and row.server_errors:
                held = (
                    f"central failed on this notification {row.server_errors} time(s) ({row.last_error}); "
                    f"retried with back-off, next at {row.next_attempt_at}"
                )
        local_delivery = None
        if row.local_state is not None:
            local_delivery = {
                "state": row.local_state,
                "attempts": row.local_attempts,
                "last_attempt_at": row.local_attempt_at,
                "error": row.local_error,
            }
        return {
            "notification_id": row.notification_id,
            "type": payload.get("type"),
            "list_name": payload.get("list_name"),
            "status": STATUS_FORWARDING if row.status == FORWARDING else STATUS_PARKED_AT_SITE,
            "priority": row.priority,
            "dedup_key": payload.get("dedup_key"),
            "retry_count": row.retry_count,
            "last_error": row.last_error,
            "site_enqueued_at": payload.get("site_enqueued_at", row.created_at),
            "created_at": None,  # central's ingest time: not yet
            "last_attempt_at": row.last_attempt_at,
            "next_attempt_at": row.next_attempt_at if row.status == FORWARDING else None,
            "delivered_at": None,
            "delivered_locally_at": row.delivered_locally_at,
            "held": held,
            "local_delivery": local_delivery,
            "location": "site",
            "final": False,
        }

    def link_status(self) -> Record:
        """How forwarding stands, from the buffer (whatever process forwards): ``state`` one of
        ``ok``, ``key_refused``, ``unreachable``, ``rate_limited``, with ``since``/``until``,
        ``detail`` (one line), ``server_errors`` (rows central answered 500 to more than once)
        and ``fallback`` (None when none is configured here)."""
        snapshot = self.state.snapshot()
        rows, since, last_error = self.buffer.server_error_summary()
        record: Record = {
            "state": "ok",
            "since": None,
            "until": None,
            "detail": "",
            "last_forward_at": self.buffer.state_get("last_forward_at"),
            "server_errors": {"rows": rows, "since": since, "last_error": last_error} if rows else None,
            "fallback": None,
        }
        if snapshot.key_refused is not None:
            record.update(state="key_refused", since=snapshot.key_refused.get("since"))
            record["detail"] = snapshot.held_reason("normal") or ""
        elif snapshot.unreachable_since is not None:
            record.update(state="unreachable", since=iso_utc(snapshot.unreachable_since), detail=snapshot.last_error)
        elif snapshot.rate_limited:
            record.update(
                state="rate_limited",
                until=iso_utc(max(snapshot.rate_limited.values())),
                detail=snapshot.rate_limit_line(),
            )
        if self.fallback is not None:
            record["fallback"] = self.fallback.report()
        return record

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
        """One sweep: post every due row (critical rows first, in requests of their own; then by
        priority and age; batches of ``batch_size``) and apply the answers.

        Returns a :class:`~sites.agent.forwarder.ForwardResult` (forwarded / parked / retrying /
        dropped counts, rate-limit holds, whether central was unreachable). Stops between
        requests when ``stop_event`` is set. ``progress(result)`` is called after each request.
        Raises :class:`CredentialRejected` when central refuses the key or the site (nothing is
        parked; the buffer is held).
        """
        result = self.forwarder.sweep(stop_event=stop_event, progress=progress)
        if self.link is not None:
            self.link.record_sweep(forwarded=result.forwarded, errors=result.errors)
        return result

    def deliver_locally_once(self, *, stop_event: StopEvent | None = None) -> FallbackResult:
        """One pass of the local fallback: when central has been unreachable for the configured
        ``after_seconds``, hand each urgent buffered row to the local relay once
        (:mod:`sites.agent.fallback`). Does nothing (an inactive result) otherwise, or when no
        fallback is configured."""
        if self.fallback is None:
            return FallbackResult()
        return self.fallback.run_pass(stop_event=stop_event)

    def sync_with_central(self, *, heartbeat: bool = True, pings: bool = True) -> int:
        """Watchdog pings (when ``pings`` or ``heartbeat``), a heartbeat (when ``heartbeat``) with
        the commands it brings back, executed; then command acknowledgements, parked reports and
        the site's acknowledge/clear calls (see :mod:`sites.agent.sitelink`). Returns how many
        parked rows a Retry command made due now. Never raises for central being unreachable or
        refusing (that is logged)."""
        self._require_client("talk to central")
        assert self.link is not None  # exists whenever the client does
        return self.link.sync(heartbeat=heartbeat, pings=pings)

    def run_forever(self, stop_event: StopEvent, *, progress: Callable[[ForwardResult], None] | None = None) -> None:
        """Forward until ``stop_event`` is set: a sweep whenever a notification is sent to this
        buffer (from this process or another, see :mod:`sites.agent.wakeup`) and every
        ``sweep_interval`` seconds for retries; after each sweep the watchdog pings (at most once
        a ``sweep_interval``), a heartbeat every ``heartbeat_interval`` seconds (executing the
        commands central answers with), command acknowledgements, parked reports and the site's
        acknowledge/clear calls. While central is unreachable only the heartbeat (with the pings
        before it) is tried besides the sweeps. With a fallback configured, local deliveries
        run on a thread of their own, so a slow relay never holds up forwarding.

        ``stop_event`` is a ``threading.Event`` or a :class:`~sites.agent.stopping.StopSignal`
        (which signal handlers can set safely). On stop, the local delivery in progress (if any)
        is finished first.

        A rejected credential does not stop the loop: it is logged at ERROR and tried again
        every ``retry_interval`` seconds, so a fixed key resumes forwarding with no restart.
        """
        client = self._require_client("forward")
        listener = WakeListener(self.buffer.path)
        self._listener = listener
        listener.publish()
        logger.info("Forwarding %s to %s every %.0f s", self.buffer.path, client.base_url, self.sweep_interval)
        local = _LocalDeliveries(self.fallback, stop_event) if self.fallback is not None else None
        next_heartbeat = next_pings = time.monotonic()
        try:
            while not stop_event.is_set():
                wait = self.sweep_interval
                rejected = unreachable = False
                parked_now = 0
                try:
                    result = self.forward_once(stop_event=stop_event, progress=progress)
                    parked_now, unreachable = result.parked, result.unreachable
                except CredentialRejected:
                    wait = max(self.retry_interval, self.sweep_interval)
                    rejected = True
                except Exception:  # a forwarder that dies quietly is worse than one that logs and retries
                    logger.exception("Forwarding sweep failed; trying again in %.0f s", self.sweep_interval)
                if stop_event.is_set():
                    break
                if local is not None:
                    local.start_if_due()
                now = time.monotonic()
                # Right after the key works again, tell central at once how long it was refused.
                heartbeat_due = self.heartbeat_interval > 0 and (
                    now >= next_heartbeat or bool(self.state.snapshot().key_refused_episode)
                )
                pings_due = now >= next_pings
                if not rejected and (heartbeat_due or not unreachable or parked_now):
                    if heartbeat_due:
                        next_heartbeat = now + self.heartbeat_interval
                    if pings_due or heartbeat_due:
                        next_pings = now + self.sweep_interval
                    try:
                        if self.sync_with_central(heartbeat=heartbeat_due, pings=pings_due and not unreachable):
                            continue  # an operator's Retry made rows due: forward them now
                    except Exception:
                        logger.exception("Exchange with central (heartbeat, commands, reports) failed")
                if self.heartbeat_interval > 0:
                    wait = min(wait, max(next_heartbeat - time.monotonic(), 0.0))
                hold = self.forwarder.next_hold_end()
                if hold is not None:
                    wait = min(wait, hold)
                self._sleep(stop_event, listener, wait)
        finally:
            self._listener = None
            listener.close()
            if local is not None:
                local.close()

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


class _LocalDeliveries:
    """Runs the local fallback's passes on one thread of their own, one pass at a time."""

    def __init__(self, fallback: LocalFallback, stop_event: StopEvent) -> None:
        self.fallback = fallback
        self.stop_event = stop_event
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-local-fallback")
        self._running: Future[FallbackResult] | None = None

    def start_if_due(self) -> None:
        """Start a pass unless one is running or central is not unreachable long enough."""
        if self._running is not None and not self._running.done():
            return
        if self._running is not None:
            error = self._running.exception()
            if error is not None:
                logger.error("Local fallback pass failed: %s", error, exc_info=error)
        self._running = None
        if self.fallback.active():
            self._running = self._pool.submit(self.fallback.run_pass, stop_event=self.stop_event)

    def close(self) -> None:
        """Wait for the pass in progress (it stops between rows once the stop event is set)."""
        self._pool.shutdown(wait=True)
