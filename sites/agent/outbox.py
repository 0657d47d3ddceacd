"""``SiteOutbox``: the API a site script uses (send, status) and the forwarder's entry points."""

import json
import logging
import uuid
from datetime import datetime, timezone

from sites.agent.buffer import FORWARDING, PARKED, Buffer, iso_utc
from sites.agent.central import CentralClient, CentralUnreachable
from sites.agent.forwarder import CredentialRejected, Forwarder

logger = logging.getLogger("sites.agent")

# Statuses the agent reports for rows it still holds (DESIGN §2: Forwarding exists only here).
STATUS_FORWARDING = "Forwarding"
STATUS_PARKED_AT_SITE = "Parked"


class AgentNotConfigured(Exception):
    """The operation needs central's URL and the site key, and this agent was given none."""


def _utc_now():
    return datetime.now(timezone.utc)


def _canonical_id(notification_id):
    """The id as lower-case hyphenated text; ValueError if it is not a UUID."""
    return str(uuid.UUID(str(notification_id)))


def _check_text(name, value, *, single_line=False):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    if single_line and ("\r" in value or "\n" in value):
        raise ValueError(f"{name} must be a single line (no CR/LF)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} is not valid Unicode: {error}") from None


def notification_payload(
    *, list_name, subject, body, source_instance_id, source_script, type, type_data, site_id, enqueued_at
):
    """A new notification id and the JSON text of its POST body (DESIGN §3), as stored and sent.

    The text is stored as sent, so a resend is byte-for-byte the same notification and central
    answers it as a replay.
    """
    notification_id = str(uuid.uuid4())
    payload = {
        "notification_id": notification_id,
        "type": type,
        "list_name": list_name,
        "subject": subject,
        "body": body,
        "type_data": type_data,
        "source_instance_id": source_instance_id or "",
        "source_script": source_script or "",
        "site_enqueued_at": enqueued_at,
    }
    if site_id:
        payload["source_site_id"] = site_id
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"type_data is not JSON-serialisable: {error}") from None
    _check_text("type_data", text)
    return notification_id, text


class Notifier:
    """``outbox.notify("Operators")``: sends notifications to one notification list."""

    def __init__(self, outbox, list_name):
        self._outbox = outbox
        self.list_name = list_name

    def send(self, subject, body, *, source_instance_id=None, source_script=None, type="email", type_data=None):
        """Buffer one notification durably and return its id (a str UUID) at once.

        Returns only after the row is committed to the local SQLite buffer; never waits for
        central. Raises TypeError/ValueError for input central would certainly refuse (not a
        string, NUL characters, a multi-line subject, type_data that is not a JSON object).
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
    ``clock`` (returning an aware UTC datetime) exists for tests.
    """

    def __init__(
        self,
        db_path,
        central_url,
        api_key,
        *,
        sweep_interval=10,
        retry_interval=30,
        max_retries=50,
        batch_size=500,
        timeout=10,
        site_id=None,
        clock=None,
    ):
        if sweep_interval <= 0 or retry_interval < 0 or max_retries < 0 or batch_size < 1 or timeout <= 0:
            raise ValueError(
                "need sweep_interval > 0, retry_interval >= 0, max_retries >= 0, batch_size >= 1, timeout > 0"
            )
        self.sweep_interval = float(sweep_interval)
        self.retry_interval = float(retry_interval)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.timeout = float(timeout)
        self.site_id = site_id
        self._clock = clock or _utc_now
        self.buffer = Buffer(db_path)
        self.client = CentralClient(central_url, api_key, timeout=timeout) if central_url and api_key else None
        self._forwarder = None
        if self.client is not None:
            self._forwarder = Forwarder(
                buffer=self.buffer,
                client=self.client,
                clock=self._clock,
                retry_interval=self.retry_interval,
                max_retries=self.max_retries,
                batch_size=self.batch_size,
            )

    def close(self):
        self.buffer.close()
        if self.client is not None:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # --- sending ----------------------------------------------------------------------------

    def notify(self, list_name):
        """A sender for the notification list ``list_name`` (resolved by central at delivery)."""
        _check_text("list_name", list_name, single_line=True)
        if not list_name.strip():
            raise ValueError("list_name must not be blank")
        return Notifier(self, list_name)

    def _buffer_notification(self, *, list_name, subject, body, source_instance_id, source_script, type, type_data):
        _check_text("subject", subject, single_line=True)
        _check_text("body", body)
        _check_text("type", type, single_line=True)
        for name, value in (("source_instance_id", source_instance_id), ("source_script", source_script)):
            if value is not None:
                _check_text(name, value, single_line=True)
        if type_data is None:
            type_data = {}
        if not isinstance(type_data, dict):
            raise TypeError("type_data must be a dict (a JSON object) or None")
        now = iso_utc(self._clock())
        notification_id, text = notification_payload(
            list_name=list_name, subject=subject, body=body, source_instance_id=source_instance_id,
            source_script=source_script, type=type, type_data=type_data, site_id=self.site_id, enqueued_at=now,
        )  # fmt: skip
        self.buffer.insert(notification_id=notification_id, payload=text, created_at=now)
        return notification_id

    # --- status -----------------------------------------------------------------------------

    def status(self, notification_id):
        """Where a notification is and how it is doing, as a dict; None if nobody knows it.

        While the site holds the row: ``status`` is ``Forwarding`` or (site-side) ``Parked``,
        with ``location`` ``"site"``. Otherwise central's status record (DESIGN §3) with
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
    def _local_status(row):
        try:
            payload = json.loads(row.payload)
        except ValueError:
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

    def _require_client(self, doing):
        if self.client is None:
            raise AgentNotConfigured(f"cannot {doing}: this agent has no central URL and site key")
        return self.client

    @property
    def forwarder(self):
        if self._forwarder is None:
            self._require_client("forward")
        return self._forwarder

    def forward_once(self, *, stop_event=None, progress=None):
        """One sweep: post every due row (batches of ``batch_size``) and apply the answers.

        Returns a :class:`~sites.agent.forwarder.ForwardResult` (forwarded / parked / retrying /
        dropped counts). Stops between requests when ``stop_event`` is set. ``progress(result)``
        is called after each request. Raises :class:`CredentialRejected` when central refuses
        the key or the site (nothing is parked).
        """
        return self.forwarder.sweep(stop_event=stop_event, progress=progress)

    def run_forever(self, stop_event, *, progress=None):
        """Sweep every ``sweep_interval`` seconds until ``stop_event`` is set.

        A rejected credential does not stop the loop: it is logged at ERROR and tried again
        every ``retry_interval`` seconds, so a fixed key resumes forwarding with no restart.
        """
        client = self._require_client("forward")
        logger.info("Forwarding %s to %s every %.0f s", self.buffer.path, client.base_url, self.sweep_interval)
        while not stop_event.is_set():
            wait = self.sweep_interval
            try:
                self.forward_once(stop_event=stop_event, progress=progress)
            except CredentialRejected:
                wait = max(self.retry_interval, self.sweep_interval)
            except Exception:  # a forwarder that dies quietly is worse than one that logs and retries
                logger.exception("Forwarding sweep failed; trying again in %.0f s", self.sweep_interval)
            stop_event.wait(wait)

    # --- operator actions -------------------------------------------------------------------

    def parked(self):
        """The site-parked rows, oldest first, as local status dicts with subject and payload."""
        records = []
        for row in self.buffer.parked():
            record = self._local_status(row)
            try:
                record["subject"] = json.loads(row.payload).get("subject")
            except (ValueError, AttributeError):
                record["subject"] = None
            records.append(record)
        return records

    def retry(self, notification_id):
        """Parked → Forwarding with the retry count reset, due on the next sweep. True if it was parked."""
        return self.buffer.retry(_canonical_id(notification_id), now=iso_utc(self._clock()))

    def discard(self, notification_id):
        """Delete a parked row; returns its payload dict (what was discarded), or None if not parked."""
        row = self.buffer.discard(_canonical_id(notification_id))
        if row is None:
            return None
        logger.warning("Discarded parked notification %s (last error: %s)", row.notification_id, row.last_error)
        try:
            return json.loads(row.payload)
        except ValueError:
            return {"notification_id": row.notification_id, "payload": row.payload}

    def stats(self):
        """``{"buffered": rows waiting to be forwarded, "parked": rows parked at the site}``."""
        counts = self.buffer.counts()
        return {"buffered": counts[FORWARDING], "parked": counts[PARKED]}
