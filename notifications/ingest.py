"""Ingest: validate what a site submits and persist it exactly once.

The notification id is the idempotency key. A row is inserted with ``INSERT … ON CONFLICT DO
NOTHING`` in autocommit mode, so when this module answers "created" the row is committed.
An id that already exists is a replay when the same site sent the same content (same
fingerprint), and an idempotency conflict otherwise; neither changes the stored row.
"""

import hashlib
import json
import math
import uuid
import dataclasses
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from functools import cache
from types import SimpleNamespace

from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.utils import timezone

from notifications.adapters import ADAPTER_PATHS
from notifications.models import Notification
from notifications.tasks import dispatch_request

MAX_LENGTHS = {
    "list_name": 200,
    "subject": 255,
    "body": 100_000,
    "source_instance_id": 200,
    "source_script": 200,
    "source_site_id": 64,
}
MAX_TYPE_DATA_BYTES = 65_536
SINGLE_LINE_FIELDS = ("list_name", "subject", "source_instance_id", "source_script", "source_site_id")
ACCEPTED_FIELDS = frozenset(
    {"notification_id", "type", "list_name", "subject", "body", "type_data",
     "source_instance_id", "source_script", "site_enqueued_at", "source_site_id"}
)  # fmt: skip
INSERT_CHUNK = 500
# What a new row starts with, as SQL (PostgreSQL insert); the same values as _row_for().
NEW_ROW_SQL = {
    "status": "'Pending'", "retry_count": "0", "last_error": "''", "resolved_targets": "'[]'::jsonb",
    "claimed_by": "''", "claimed_until": "NULL", "last_attempt_at": "NULL", "delivered_at": "NULL",
}  # fmt: skip
DOCUMENT_TEXT_COLUMNS = ("type", "list_name", "subject", "body", "source_site_id", "source_instance_id",
                         "source_script", "fingerprint")  # fmt: skip


@dataclass(frozen=True)
class NotificationInput:
    """One validated submission."""

    notification_id: uuid.UUID
    type: str
    list_name: str
    subject: str
    body: str
    type_data: dict
    source_instance_id: str
    source_script: str
    site_enqueued_at: datetime | None  # None: the site did not say; central uses "now"
    source_site_id: str | None
    fingerprint: str = dataclasses.field(init=False)

    def __post_init__(self):
        """The fingerprint is the sha256 of the content; two submissions with one id must
        agree on it. Fields are joined with NUL, which validation keeps out of every field,
        so two different submissions cannot produce the same joined text."""
        parts = (
            self.type, self.list_name, self.subject, self.body,
            json.dumps(self.type_data, sort_keys=True, separators=(",", ":")) if self.type_data else "{}",
            self.source_instance_id, self.source_script,
            self.site_enqueued_at.isoformat() if self.site_enqueued_at else "",
        )  # fmt: skip
        object.__setattr__(self, "fingerprint", hashlib.sha256("\x00".join(parts).encode()).hexdigest())


@dataclass(frozen=True)
class IngestOutcome:
    """``result`` is "created", "replayed" or "conflict". ``notification`` has the row's
    attributes (a Notification, or its values when just inserted); None on conflict."""

    notification_id: uuid.UUID
    result: str
    notification: object


def _text_problem(value, field):
    if not isinstance(value, str):
        return "Must be a string."
    if "\x00" in value:
        return "Must not contain NUL characters."
    if field in SINGLE_LINE_FIELDS and ("\r" in value or "\n" in value):
        return "Must not contain line breaks (CR or LF)."
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "Must be valid Unicode (no unpaired surrogates)."
    limit = MAX_LENGTHS[field]
    if len(value) > limit:
        return f"Must be at most {limit} characters (got {len(value)})."
    return None


def _json_problem(value, depth=0):
    """A problem with a type_data value (nested), or None."""
    if depth > 20:
        return "Is nested too deeply."
    if isinstance(value, str):
        if "\x00" in value:
            return "Must not contain NUL characters."
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "Must be valid Unicode (no unpaired surrogates)."
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = _json_problem(key, depth + 1) or _json_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list):
        for item in value:
            problem = _json_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, float) and not math.isfinite(value):
        return "Must not contain NaN or infinite numbers."
    return None


def _parse_timestamp(value):
    """An aware UTC datetime, or a string saying what is wrong."""
    if not isinstance(value, str):
        return "Must be an ISO-8601 timestamp string."
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return "Is not an ISO-8601 timestamp, e.g. 2026-11-21T10:00:00Z."
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return "Must include a timezone (e.g. a trailing Z for UTC)."
    try:
        return parsed.astimezone(dt_timezone.utc)
    except (OverflowError, ValueError):
        return "Is out of range."


def notification_validate(data):
    """Validate one submitted object.

    Returns ``(NotificationInput, None)`` when valid, else ``(None, errors)`` where errors maps
    each offending field to a list of messages.
    """
    if not isinstance(data, dict):
        return None, {"non_field_errors": ["Each notification must be a JSON object."]}
    errors = {}

    unknown = sorted(set(data) - ACCEPTED_FIELDS)
    for name in unknown:
        errors[str(name)[:100]] = ["Unknown field."]

    raw_id = data.get("notification_id")
    notification_id = None
    if raw_id is None:
        errors["notification_id"] = ["This field is required."]
    elif not isinstance(raw_id, str):
        errors["notification_id"] = ["Must be a UUID string."]
    else:
        try:
            notification_id = uuid.UUID(raw_id)
        except ValueError:
            errors["notification_id"] = ["Must be a valid UUID."]

    type_name = data.get("type") if data.get("type") is not None else "email"
    if not isinstance(type_name, str) or type_name not in ADAPTER_PATHS:
        known = ", ".join(sorted(ADAPTER_PATHS))
        errors["type"] = [f"Unknown notification type {str(type_name)[:40]!r}; known types: {known}."]

    values = {}
    for field, required, default in (
        ("list_name", True, None),
        ("subject", True, None),
        ("body", True, None),
        ("source_instance_id", False, ""),
        ("source_script", False, ""),
        ("source_site_id", False, None),
    ):
        if field not in data or data[field] is None:
            if required:
                errors[field] = ["This field is required."]
            values[field] = default
            continue
        problem = _text_problem(data[field], field)
        if problem:
            errors[field] = [problem]
        values[field] = data[field]
    if "list_name" not in errors and not values["list_name"].strip():
        errors["list_name"] = ["Must not be blank."]

    type_data = data.get("type_data", {})
    if type_data is None:
        type_data = {}
    if not isinstance(type_data, dict):
        errors["type_data"] = ["Must be a JSON object."]
    else:
        problem = _json_problem(type_data)
        if not problem and len(json.dumps(type_data)) > MAX_TYPE_DATA_BYTES:
            problem = f"Must be at most {MAX_TYPE_DATA_BYTES} bytes as JSON."
        if problem:
            errors["type_data"] = [problem]

    site_enqueued_at = None
    if data.get("site_enqueued_at") is not None:
        parsed = _parse_timestamp(data["site_enqueued_at"])
        if isinstance(parsed, str):
            errors["site_enqueued_at"] = [parsed]
        else:
            site_enqueued_at = parsed

    if errors:
        return None, errors
    return (
        NotificationInput(
            notification_id=notification_id,
            type=type_name,
            list_name=values["list_name"],
            subject=values["subject"],
            body=values["body"],
            type_data=type_data,
            source_instance_id=values["source_instance_id"],
            source_script=values["source_script"],
            site_enqueued_at=site_enqueued_at,
            source_site_id=values["source_site_id"],
        ),
        None,
    )


def notifications_ingest(*, site_id, inputs):
    """Persist validated submissions from one site; one outcome per input, in order.

    Every row reported "created" is committed before this returns. Repeated ids within
    ``inputs`` are judged against the first occurrence, exactly as a later replay would be.
    """
    first_by_id = {}
    for item in inputs:
        first_by_id.setdefault(item.notification_id, item)

    rows = [_row_for(item, site_id=site_id) for item in first_by_id.values()]
    inserted = {}
    for start in range(0, len(rows), INSERT_CHUNK):
        inserted.update(_insert_ignoring_conflicts(rows[start : start + INSERT_CHUNK]))

    if inserted:
        transaction.on_commit(dispatch_request)  # coalesced; costs this request no query
    created_rows = {}
    for row in rows:
        created_at = inserted.get(row["notification_id"])
        if created_at is not None:
            row["created_at"] = row["next_attempt_at"] = created_at
            row["site_enqueued_at"] = row["site_enqueued_at"] or created_at
            created_rows[row["notification_id"]] = SimpleNamespace(**row)
    existing = {}
    missing = [nid for nid in first_by_id if nid not in inserted]
    if missing:
        existing = Notification.objects.in_bulk(missing)

    outcomes = []
    for item in inputs:
        nid = item.notification_id
        row = created_rows.get(nid)
        if row is not None:
            if item is first_by_id[nid]:
                outcomes.append(IngestOutcome(nid, "created", row))
            elif row.fingerprint == item.fingerprint:
                outcomes.append(IngestOutcome(nid, "replayed", row))
            else:
                outcomes.append(IngestOutcome(nid, "conflict", None))
            continue
        stored = existing.get(nid)
        if stored is None:
            # Inserted by someone else and gone before we could read it (purged): the
            # submission was not stored by us. Report a conflict rather than a false ack.
            outcomes.append(IngestOutcome(nid, "conflict", None))
        elif stored.source_site_id == site_id and stored.fingerprint == item.fingerprint:
            outcomes.append(IngestOutcome(nid, "replayed", stored))
        else:
            outcomes.append(IngestOutcome(nid, "conflict", None))
    return outcomes


def _row_for(item, *, site_id):
    """The new row's column values by attribute name (model instances cost ~50 µs each).
    The ingest time is left to the insert (the database's clock)."""
    return {
        "notification_id": item.notification_id,
        "type": item.type,
        "list_name": item.list_name,
        "subject": item.subject,
        "body": item.body,
        "type_data": item.type_data,
        "status": Notification.Status.PENDING.value,
        "retry_count": 0,
        "last_error": "",
        "resolved_targets": [],
        "source_site_id": site_id,
        "source_instance_id": item.source_instance_id,
        "source_script": item.source_script,
        "site_enqueued_at": item.site_enqueued_at,
        "created_at": None,
        "last_attempt_at": None,
        "next_attempt_at": None,
        "delivered_at": None,
        "claimed_by": "",
        "claimed_until": None,
        "fingerprint": item.fingerprint,
    }


def _insert_ignoring_conflicts(rows):
    """INSERT … ON CONFLICT DO NOTHING RETURNING id; {id: created_at} of the rows it inserted.

    Runs as one statement in autocommit mode (outside any transaction of ours), so the
    insert is committed when it returns. PostgreSQL makes a concurrent inserter of the same
    id wait for the first one's commit, which is what lets replays be judged exactly.
    Django's bulk_create(ignore_conflicts=True) cannot say which rows it inserted.

    On PostgreSQL the ingest time (``created_at``, the first ``next_attempt_at`` and a missing
    ``site_enqueued_at``) is the database's clock, as are all dispatch times, so a web process
    whose clock is off never schedules a row into the future or past.
    """
    if not rows:
        return {}
    meta = Notification._meta
    fields = meta.concrete_fields
    if connection.vendor == "postgresql":
        # The whole chunk travels as one JSON document expanded by jsonb_to_recordset:
        # binding 20 values per row as separate parameters costs more than the insert itself.
        document = [
            {
                **{name: row[name] for name in DOCUMENT_TEXT_COLUMNS},
                "notification_id": str(row["notification_id"]),
                "type_data": row["type_data"],
                "site_enqueued_at": row["site_enqueued_at"].isoformat() if row["site_enqueued_at"] else None,
            }
            for row in rows
        ]
        sql = _postgresql_insert_sql()
        params = [json.dumps(document, ensure_ascii=False)]
    else:
        # SQLite is embedded: the web process and the database share one clock.
        now = timezone.now()
        quote = connection.ops.quote_name
        columns = ", ".join(quote(f.column) for f in fields)
        table, pk = quote(meta.db_table), quote(meta.pk.column)
        one_row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = (
            f"INSERT INTO {table} ({columns}) VALUES {', '.join([one_row] * len(rows))} "
            f"ON CONFLICT ({pk}) DO NOTHING RETURNING {pk}"
        )
        clock = {"created_at": now, "next_attempt_at": now}
        defaults = {f.attname: f.get_default() for f in fields if f.attname not in rows[0]}
        params = []
        for row in rows:
            values = dict(row, **clock, site_enqueued_at=row["site_enqueued_at"] or now)
            params.extend(
                field.get_db_prep_save(values.get(field.attname, defaults.get(field.attname)), connection)
                for field in fields
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {value if isinstance(value, uuid.UUID) else uuid.UUID(value): now for (value,) in cursor.fetchall()}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {value: created_at for value, created_at in cursor.fetchall()}


@cache
def _postgresql_insert_sql():
    """The INSERT … SELECT FROM jsonb_to_recordset statement; built once (db_type() per field
    per request cost more than the rest of the Python side of an ingest)."""
    meta = Notification._meta
    fields = meta.concrete_fields
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    from_document = {"notification_id", "type_data", "site_enqueued_at", *DOCUMENT_TEXT_COLUMNS}
    definitions = ", ".join(f"{quote(f.column)} {f.db_type(connection)}" for f in fields if f.column in from_document)
    computed = {
        "created_at": "statement_timestamp()",
        "next_attempt_at": "statement_timestamp()",
        "site_enqueued_at": f"COALESCE(r.{quote('site_enqueued_at')}, statement_timestamp())",
        **NEW_ROW_SQL,
    }
    missing = [f.column for f in fields if f.column not in computed and f.column not in from_document]
    if missing:
        raise ImproperlyConfigured(f"ingest does not know how to fill new Notification columns: {missing}")
    selects = ", ".join(computed.get(f.column, f"r.{quote(f.column)}") for f in fields)
    return (
        f"INSERT INTO {table} ({columns}) SELECT {selects} "
        f"FROM jsonb_to_recordset(%s::jsonb) AS r({definitions}) "
        f"ON CONFLICT ({pk}) DO NOTHING RETURNING {pk}, {quote('created_at')}"
    )


def _iso(value):
    return value.astimezone(dt_timezone.utc).isoformat().replace("+00:00", "Z") if value else None


def notification_status_record(notification):
    """The status record of DESIGN §3, as a JSON-ready dict."""
    return {
        "notification_id": str(notification.notification_id),
        "type": notification.type,
        "list_name": notification.list_name,
        "status": notification.status,
        "retry_count": notification.retry_count,
        "last_error": notification.last_error,
        "site_enqueued_at": _iso(notification.site_enqueued_at),
        "created_at": _iso(notification.created_at),
        "last_attempt_at": _iso(notification.last_attempt_at),
        "next_attempt_at": _iso(notification.next_attempt_at),
        "delivered_at": _iso(notification.delivered_at),
    }
