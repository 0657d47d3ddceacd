"""Ingest: validate what a site submits and persist it exactly once.

The contract is written here once: which fields a submission has, which are required, their
length limits (the model's columns) and the site rule. The API's OpenAPI description is
generated from the same declarations (notifications.api), and a test holds the two together.

The notification id is the idempotency key. A row is inserted with ``INSERT … ON CONFLICT DO
NOTHING`` in autocommit mode, so when this module answers "created" the row is committed.
An id that already exists is a replay when the same site sent the same content (same
fingerprint), and an idempotency conflict otherwise; neither changes the stored row.
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from django.db import transaction

from notifications import db
from notifications.acknowledgement import ListSettings, acknowledgement_record, asks_ack, list_settings_by_key
from notifications.channel_targets import teams_type_data_stored, teams_type_data_validate, text_site_masked
from notifications.email_content import email_type_data_measured, email_type_data_validate
from notifications.escalation import (
    escalation_first_after,
    notification_escalations,
    notifications_escalation_start,
)
from notifications.list_names import list_name_key, list_name_normalize, list_name_problem, text_control_problem
from notifications.local_delivery import notifications_delivered_locally_record
from notifications.models import PRIORITY_NAMES, Notification
from notifications.providers import notification_targets
from notifications.suppression import (
    list_decisions,
    row_duplicate_insert,
    rows_need_lock,
    rows_silence,
    rows_suppression_columns,
    suppression_lock,
)
from notifications.trigger import dispatch_request
from notifications.vocabulary import ADAPTER_PATHS, targets_summary

logger = logging.getLogger(__name__)

DEFAULT_TYPE = "email"
MAX_TYPE_DATA_BYTES = 65_536
MAX_TYPE_DATA_DEPTH = 20
INSERT_CHUNK = 500
# Per type, what its own type_data fields must satisfy (problems per field, e.g.
# "type_data.cc[0]"), and what of type_data the size limit counts (email's attachment contents
# have a bound of their own, OUTBOX_MAX_ATTACHMENT_BYTES).
TYPE_DATA_VALIDATORS: dict[str, Callable[[Mapping[str, Any]], dict[str, list[str]]]] = {
    "email": email_type_data_validate,
    "teams": teams_type_data_validate,
}
TYPE_DATA_MEASURED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "email": email_type_data_measured,
}
# Per type, how its type_data is stored when that differs from what was sent (Teams: facts in
# the order sent, notifications.channel_targets.teams_type_data_stored).
TYPE_DATA_STORED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"teams": teams_type_data_stored}


def column_max_length(name: str) -> int:
    """The longest value the ``name`` column of a notification holds: the field's
    ``max_length``, or for the body (a TextField, which has none) ``Notification.BODY_MAX_LENGTH``."""
    limit = cast(Any, Notification._meta.get_field(name)).max_length
    return Notification.BODY_MAX_LENGTH if limit is None else int(limit)


@dataclass(frozen=True)
class TextRule:
    """How one text field of a submission is checked. ``default`` is the value of an optional
    field that is omitted or null; ``blank`` says whether an all-whitespace value is allowed;
    ``max_length`` is the column's."""

    name: str
    required: bool
    single_line: bool = True
    blank: bool = True
    default: str | None = ""
    # Applied to a string value before it is checked and stored (e.g. Unicode normal form).
    normalize: Callable[[str], str] | None = None
    # A further check of the (normalized) value: a problem, or None.
    check: Callable[[str], str | None] | None = None
    max_length: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_length", column_max_length(self.name))


TEXT_RULES = (
    TextRule("list_name", required=True, blank=False, normalize=list_name_normalize, check=list_name_problem),
    TextRule("subject", required=True),
    TextRule("body", required=True, single_line=False),
    TextRule("source_instance_id", required=False),
    TextRule("source_script", required=False),
    # "The same alarm again" (docs/suppression.md); blank: none.
    TextRule("dedup_key", required=False),
    # Optional; when given it must be the key's site (see notification_validate).
    TextRule("source_site_id", required=False, default=None),
)

INVALID = "invalid"
SITE_MISMATCH = "site_mismatch"
SITE_MISMATCH_DETAIL = "source_site_id does not match the site of the API key."


@dataclass(frozen=True)
class NotificationInput:
    """One validated submission: exactly the columns a site provides, by attribute name.
    ``source_site_id`` is the submitting key's site (validation has checked any value the site
    sent against it)."""

    notification_id: uuid.UUID
    type: str
    list_name: str
    subject: str
    body: str
    type_data: dict[str, Any]
    source_instance_id: str
    source_script: str
    site_enqueued_at: datetime | None  # None: the site did not say; central uses the ingest time
    source_site_id: str
    priority: int = Notification.Priority.NORMAL
    dedup_key: str = ""
    # When the site delivered it itself (its agent's local fallback). Not part of the
    # fingerprint: a replay may add it (notifications.local_delivery).
    delivered_locally_at: datetime | None = None
    fingerprint: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        """The fingerprint is the sha256 of the content; two submissions with one id must
        agree on it. Fields are joined with NUL, which validation keeps out of every field,
        so two different submissions cannot produce the same joined text. The site is not
        part of it: a replay is judged against the stored row's site separately."""
        parts: tuple[str, ...] = (
            self.type,
            self.list_name,
            self.subject,
            self.body,
            json.dumps(self.type_data, sort_keys=True, separators=(",", ":")) if self.type_data else "{}",
            self.source_instance_id,
            self.source_script,
            self.site_enqueued_at.isoformat() if self.site_enqueued_at else "",
        )
        if self.priority != Notification.Priority.NORMAL:
            # Only a priority other than the default is part of it, so that rows stored before
            # priorities existed keep their fingerprints and their replays stay replays.
            parts += (f"priority={Notification.Priority(self.priority).label}",)
        if self.dedup_key:
            # Likewise only when given: a replay carries the same key, so it stays a replay.
            parts += (f"dedup_key={self.dedup_key}",)
        object.__setattr__(self, "fingerprint", hashlib.sha256("\x00".join(parts).encode()).hexdigest())


# A submission's fields are the input's, less what central computes.
ACCEPTED_FIELDS = frozenset(f.name for f in dataclasses.fields(NotificationInput) if f.init)
# The columns a new row takes from the input; every other column starts at its model default.
SUBMITTED_COLUMNS = tuple(f.name for f in dataclasses.fields(NotificationInput))
# Ingest time, on the database clock: when the row was created and first due; also the site's
# enqueue time when the site did not say.
# (A row held for a flood digest is first due when its digest is: notifications.suppression.)
INGEST_TIME_COLUMNS = ("created_at",)
INGEST_TIME_IF_MISSING = ("site_enqueued_at", "next_attempt_at")
_DEFAULTED_FIELDS = tuple(
    f for f in Notification._meta.concrete_fields if f.attname not in {*SUBMITTED_COLUMNS, *INGEST_TIME_COLUMNS}
)


@dataclass(frozen=True)
class Rejection:
    """Why a submission is refused. ``error`` is "invalid", or "site_mismatch" when it names
    another site than the key's; ``errors`` holds the messages per field."""

    error: str
    detail: str
    errors: dict[str, list[str]]


@dataclass(frozen=True)
class IngestOutcome:
    """``result`` is "created", "replayed" or "conflict". ``notification`` has the row's
    attributes (a Notification, or its values when just inserted); None on conflict."""

    notification_id: uuid.UUID
    result: str
    notification: Any


def _control_problem(value: str, rule: TextRule) -> str | None:
    """NUL anywhere, and in one-line fields any control character, as the value was sent."""
    if "\x00" in value:
        return "Must not contain NUL characters."
    if rule.single_line:
        if "\r" in value or "\n" in value:
            return "Must not contain line breaks (CR or LF)."
        # Other controls (VT, FF, ESC …) are no safer in a mail header or a console cell: a
        # downstream re-serialisation can turn them into line breaks.
        return text_control_problem(value)
    return None


def _text_problem(value: object, rule: TextRule) -> str | None:
    if not isinstance(value, str):
        return "Must be a string."
    problem = _control_problem(value, rule)
    if problem:
        return problem
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "Must be valid Unicode (no unpaired surrogates)."
    if len(value) > rule.max_length:
        return f"Must be at most {rule.max_length} characters (got {len(value)})."
    if not rule.blank and not value.strip():
        return "Must not be blank."
    if rule.check is not None:
        return rule.check(value)
    return None


def _json_problem(value: object, depth: int = 0) -> str | None:
    """A problem with a type_data value (nested), or None."""
    if depth > MAX_TYPE_DATA_DEPTH:
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


def _parse_timestamp(value: object) -> datetime | str:
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
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return "Is out of range."


def _notification_id_read(data: dict[str, Any], errors: dict[str, list[str]]) -> uuid.UUID | None:
    """The submitted ``notification_id``, or None with its problem in ``errors``."""
    raw_id = data.get("notification_id")
    if raw_id is None:
        errors["notification_id"] = ["This field is required."]
    elif not isinstance(raw_id, str):
        errors["notification_id"] = ["Must be a UUID string."]
    else:
        try:
            return uuid.UUID(raw_id)
        except ValueError:
            errors["notification_id"] = ["Must be a valid UUID."]
    return None


def _type_read(data: dict[str, Any], errors: dict[str, list[str]]) -> Any:
    """The submitted ``type`` (default: email); an unknown one is a problem in ``errors``."""
    type_name = data.get("type")
    if type_name is None:
        type_name = DEFAULT_TYPE
    if not isinstance(type_name, str) or type_name not in ADAPTER_PATHS:
        known = ", ".join(sorted(ADAPTER_PATHS))
        errors["type"] = [f"Unknown notification type {str(type_name)[:40]!r}; known types: {known}."]
    return type_name


def _priority_read(data: dict[str, Any], errors: dict[str, list[str]]) -> int:
    """The submitted ``priority`` (default: normal); anything but a known name is a problem in
    ``errors``."""
    name = data.get("priority")
    if name is None:
        return Notification.Priority.NORMAL
    priority = Notification.Priority.named(name) if isinstance(name, str) else None
    if priority is None:
        errors["priority"] = [f"Unknown priority {str(name)[:40]!r}; known priorities: {', '.join(PRIORITY_NAMES)}."]
        return Notification.Priority.NORMAL
    return priority


def _texts_read(data: dict[str, Any], errors: dict[str, list[str]]) -> dict[str, str | None]:
    """The text fields (TEXT_RULES), normalised, or their defaults; problems in ``errors``."""
    texts: dict[str, str | None] = {}
    for rule in TEXT_RULES:
        value = data.get(rule.name)
        if value is None:
            if rule.required:
                errors[rule.name] = ["This field is required."]
            texts[rule.name] = rule.default
            continue
        problem = None
        if rule.normalize is not None and isinstance(value, str):
            # Judged as sent first: trimming must not hide a CR or LF at either end.
            problem = _control_problem(value, rule)
            if problem is None:
                value = rule.normalize(value)
        problem = problem or _text_problem(value, rule)
        if problem:
            errors[rule.name] = [problem]
        texts[rule.name] = value
    return texts


def _type_data_read(data: dict[str, Any], type_name: Any, errors: dict[str, list[str]]) -> Any:
    """The submitted ``type_data`` (default: an empty object), checked for size and by its
    type's own rules; problems in ``errors``."""
    type_data = data.get("type_data")
    if type_data is None:
        type_data = {}
    if not isinstance(type_data, dict):
        errors["type_data"] = ["Must be a JSON object."]
        return type_data
    typed = type_name if isinstance(type_name, str) and type_name in ADAPTER_PATHS else None
    problem = _json_problem(type_data)
    measured = TYPE_DATA_MEASURED[typed](type_data) if typed in TYPE_DATA_MEASURED else type_data
    if not problem and len(json.dumps(measured)) > MAX_TYPE_DATA_BYTES:
        problem = f"Must be at most {MAX_TYPE_DATA_BYTES} bytes as JSON."
    if problem:
        errors["type_data"] = [problem]
    elif typed in TYPE_DATA_VALIDATORS:
        errors.update(TYPE_DATA_VALIDATORS[typed](type_data))
    return type_data


def _timestamp_read(data: dict[str, Any], name: str, errors: dict[str, list[str]]) -> datetime | None:
    """The optional timestamp ``name`` in UTC (None when omitted or null); a problem in
    ``errors``."""
    if data.get(name) is None:
        return None
    parsed = _parse_timestamp(data[name])
    if isinstance(parsed, str):
        errors[name] = [parsed]
        return None
    return parsed


def notification_validate(data: object, *, site_id: str) -> tuple[NotificationInput, None] | tuple[None, Rejection]:
    """Validate one object submitted with the key of site ``site_id``.

    Returns ``(NotificationInput, None)`` when valid, else ``(None, Rejection)``. A valid
    object whose optional ``source_site_id`` is not ``site_id`` is rejected as
    "site_mismatch" (the API answers 403); any other problem is "invalid" (400).
    """
    if not isinstance(data, dict):
        return None, rejection_invalid({"non_field_errors": ["Each notification must be a JSON object."]})
    errors: dict[str, list[str]] = {}

    for name in sorted(set(data) - ACCEPTED_FIELDS, key=str):
        errors[str(name)[:100]] = ["Unknown field."]
    notification_id = _notification_id_read(data, errors)
    type_name = _type_read(data, errors)
    priority = _priority_read(data, errors)
    texts = _texts_read(data, errors)
    type_data = _type_data_read(data, type_name, errors)
    site_enqueued_at = _timestamp_read(data, "site_enqueued_at", errors)
    delivered_locally_at = _timestamp_read(data, "delivered_locally_at", errors)

    if errors:
        return None, rejection_invalid(errors)
    if texts["source_site_id"] is not None and texts["source_site_id"] != site_id:
        return None, Rejection(
            error=SITE_MISMATCH,
            detail=SITE_MISMATCH_DETAIL,
            errors={"source_site_id": ["Does not match the site of the API key."]},
        )
    assert notification_id is not None
    return (
        NotificationInput(
            notification_id=notification_id,
            type=type_name,
            list_name=cast(str, texts["list_name"]),
            subject=cast(str, texts["subject"]),
            body=cast(str, texts["body"]),
            type_data=type_data,
            source_instance_id=cast(str, texts["source_instance_id"]),
            source_script=cast(str, texts["source_script"]),
            dedup_key=cast(str, texts["dedup_key"]),
            site_enqueued_at=site_enqueued_at,
            source_site_id=site_id,
            priority=priority,
            delivered_locally_at=delivered_locally_at,
        ),
        None,
    )


def rejection_invalid(errors: dict[str, list[str]]) -> Rejection:
    """The rejection of input with these problems per field."""
    return Rejection(error=INVALID, detail="Invalid input.", errors=errors)


def notifications_ingest(*, site_id: str, inputs: Sequence[NotificationInput]) -> list[IngestOutcome]:
    """Persist validated submissions from one site; one outcome per input, in order.

    Every row reported "created" is committed before this returns. Repeated ids within
    ``inputs`` are judged against the first occurrence, exactly as a later replay would be.
    """
    first_by_id: dict[uuid.UUID, NotificationInput] = {}
    for item in inputs:
        first_by_id.setdefault(item.notification_id, item)

    # Each list's settings as this process last read them (at most a few seconds old).
    settings_by_key = list_settings_by_key()
    lists = {item.list_name: settings_by_key.get(list_name_key(item.list_name)) for item in first_by_id.values()}
    rows = [_row_for(item, site_id=site_id, list_settings=lists[item.list_name]) for item in first_by_id.values()]
    # Seconds to the first escalation step of the rows whose list escalates them.
    escalating = {
        item.notification_id: after
        for item in first_by_id.values()
        if (after := escalation_first_after(priority=item.priority, list_settings=lists[item.list_name]))
    }
    inserted = _rows_insert(rows, site_id=site_id, escalating=escalating)

    if inserted:
        transaction.on_commit(dispatch_request)  # coalesced; costs this request no query
    created_rows = {}
    for row in rows:
        ingest_time = inserted.get(row["notification_id"])
        if ingest_time is not None:
            created_rows[row["notification_id"]] = _created(row, ingest_time)
    existing = {}
    missing = [nid for nid in first_by_id if nid not in inserted]
    if missing:
        existing = Notification.objects.in_bulk(missing)

    outcomes = []
    for item in inputs:
        nid = item.notification_id
        created = created_rows.get(nid)
        if created is not None:
            if item is first_by_id[nid]:
                outcomes.append(IngestOutcome(nid, "created", created))
            elif created.fingerprint == item.fingerprint:
                outcomes.append(IngestOutcome(nid, "replayed", created))
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
    _delivered_locally_add(site_id=site_id, inputs=inputs, outcomes=outcomes)
    _outcomes_log(site_id=site_id, inputs=inputs, outcomes=outcomes)
    return outcomes


def _rows_insert(
    rows: list[dict[str, Any]], *, site_id: str, escalating: dict[uuid.UUID, int]
) -> dict[uuid.UUID, datetime]:
    """Insert the new rows, suppressed where a silence, a duplicate or a flood says so
    (notifications.suppression); ``{id: ingest time}`` of the rows inserted. A row in
    ``escalating`` (seconds to its first escalation step) that is sent now is committed with its
    first due time, never without it (notifications.escalation)."""
    rows_suppression_columns(rows)
    rows_silence(rows)
    locked_lists = {name.casefold(): name for name in rows_need_lock(rows)}
    plain = [row for row in rows if row["list_name"].casefold() not in locked_lists]
    inserted: dict[uuid.UUID, datetime] = {}
    for start in range(0, len(plain), INSERT_CHUNK):
        inserted.update(_insert(plain[start : start + INSERT_CHUNK], escalating=escalating))
    for folded, list_name in locked_lists.items():
        group = [row for row in rows if row["list_name"].casefold() == folded]
        if len(group) == 1:
            # One notification with a key: decided and inserted in one statement where it can be.
            alone = row_duplicate_insert(
                site_id=site_id, row=group[0], escalate_after=escalating.get(group[0]["notification_id"])
            )
            if alone is not None:
                inserted.update(alone)
                continue
        inserted.update(_insert_deciding(site_id=site_id, list_name=list_name, rows=group, escalating=escalating))
    return inserted


def _insert(rows: list[dict[str, Any]], *, escalating: dict[uuid.UUID, int]) -> dict[uuid.UUID, datetime]:
    """Insert ``rows``; a Suppressed row is never due (its next attempt stays null) and never
    escalates, nor does a row held for a flood digest (it starts when released)."""
    suppressed = [row for row in rows if row["status"] == Notification.Status.SUPPRESSED]
    others = [row for row in rows if row["status"] != Notification.Status.SUPPRESSED]
    starting = escalating.keys() & {row["notification_id"] for row in others if row.get("held_for_digest") is None}
    with transaction.atomic() if starting else contextlib.nullcontext():
        inserted = db.insert_ignoring_conflicts(
            Notification, others, stamped=INGEST_TIME_COLUMNS, stamped_if_null=INGEST_TIME_IF_MISSING
        )
        notifications_escalation_start(
            created={nid: (inserted[nid], escalating[nid]) for nid in starting if nid in inserted}
        )
    inserted.update(
        db.insert_ignoring_conflicts(
            Notification, suppressed, stamped=INGEST_TIME_COLUMNS, stamped_if_null=("site_enqueued_at",)
        )
    )
    return inserted


def _insert_deciding(
    *, site_id: str, list_name: str, rows: list[dict[str, Any]], escalating: dict[uuid.UUID, int]
) -> dict[uuid.UUID, datetime]:
    """Insert the rows of one list whose fate depends on earlier rows (duplicates, floods): in
    one transaction under the list's lock, deciding for the rows that are new (a replay changes
    nothing), then recording what the decisions counted."""
    inserted: dict[uuid.UUID, datetime] = {}
    with transaction.atomic():
        now = suppression_lock(site_id=site_id, list_name=list_name)
        existing: set[Any] = set()
        if len(rows) > 1:
            # A replay must not count, nor stand as the anchor of the rows after it. A single
            # row (one API request) needs no look: a replay's insert does nothing, and its
            # counts are taken back below.
            ids = [row["notification_id"] for row in rows]
            existing = set(Notification.objects.filter(pk__in=ids).values_list("pk", flat=True))
        decisions = list_decisions(site_id=site_id, list_name=list_name, now=now)
        decisions.decide(row for row in rows if row["notification_id"] not in existing)
        for start in range(0, len(rows), INSERT_CHUNK):
            inserted.update(_insert(rows[start : start + INSERT_CHUNK], escalating=escalating))
        decisions.save(inserted)
    return inserted


def _delivered_locally_add(*, site_id: str, inputs: Sequence[NotificationInput], outcomes: list[IngestOutcome]) -> None:
    """Replays that say the site delivered the row itself add that to a row that does not say
    so yet (notifications.local_delivery); the outcome's row shows it."""
    moments: dict[uuid.UUID, datetime] = {}
    for item, outcome in zip(inputs, outcomes, strict=True):
        row = outcome.notification
        if item.delivered_locally_at is not None and outcome.result == "replayed" and row.delivered_locally_at is None:
            moments.setdefault(item.notification_id, item.delivered_locally_at)
    if not moments:
        return
    recorded = notifications_delivered_locally_record(site_id=site_id, moments=moments)
    for outcome in outcomes:
        if outcome.notification_id in recorded:
            outcome.notification.delivered_locally_at = moments[outcome.notification_id]


def _outcomes_log(*, site_id: str, inputs: Sequence[NotificationInput], outcomes: list[IngestOutcome]) -> None:
    """One record per submission: a conflict at INFO (the site sent a different notification
    under a used id), created and replayed at DEBUG."""
    debug = logger.isEnabledFor(logging.DEBUG)
    for item, outcome in zip(inputs, outcomes, strict=True):
        if outcome.result == "conflict" or debug:
            logger.log(
                logging.INFO if outcome.result == "conflict" else logging.DEBUG,
                "ingest %s from %s: %s",
                item.notification_id,
                site_id,
                outcome.result,
                extra={
                    "notification_id": str(item.notification_id),
                    "site": site_id,
                    "channel": item.type,
                    "outcome": outcome.result,
                },
            )


def _row_for(item: NotificationInput, *, site_id: str, list_settings: ListSettings | None) -> dict[str, Any]:
    """The submitted columns of the new row (plain values: a model instance per row would
    cost more than the insert), and whether it asks for acknowledgement (its list decides).
    The ingest time is left to the insert (the database's clock)."""
    row = {name: getattr(item, name) for name in SUBMITTED_COLUMNS}
    row["source_site_id"] = site_id
    row["asks_ack"] = asks_ack(
        priority=item.priority, ack_required_from=list_settings.ack_required_from if list_settings else None
    )
    if item.type in TYPE_DATA_STORED:
        row["type_data"] = TYPE_DATA_STORED[item.type](item.type_data)
    return row


def _created(row: dict[str, Any], ingest_time: datetime) -> SimpleNamespace:
    """The attributes of a row just inserted: the submitted columns, the ingest times, and every
    other column at its model default (as the insert wrote them)."""
    values = {field.attname: field.get_default() for field in _DEFAULTED_FIELDS}
    values.update(row)
    values.update(dict.fromkeys(INGEST_TIME_COLUMNS, ingest_time))
    for name in INGEST_TIME_IF_MISSING:
        if values[name] is None:
            values[name] = ingest_time
    if values["status"] == Notification.Status.SUPPRESSED:
        values["next_attempt_at"] = None  # final at once: never due
    return SimpleNamespace(**values)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def notification_status_record(notification: Any, *, staff: bool = False) -> dict[str, Any]:
    """The status record (docs/api.md), as a JSON-ready dict. A site (``staff`` false) sees
    outcomes, not recipients: its targets and the addresses, numbers and URLs in its
    ``last_error`` are masked (notifications.channel_targets); staff see them as stored."""
    return {
        "notification_id": str(notification.notification_id),
        "type": notification.type,
        "list_name": notification.list_name,
        "status": notification.status,
        "priority": Notification.Priority(notification.priority).label,
        "retry_count": notification.retry_count,
        "last_error": notification.last_error if staff else text_site_masked(notification.last_error),
        "site_enqueued_at": _iso(notification.site_enqueued_at),
        "created_at": _iso(notification.created_at),
        "last_attempt_at": _iso(notification.last_attempt_at),
        "next_attempt_at": _iso(notification.next_attempt_at),
        "delivered_at": _iso(notification.delivered_at),
        "delivered_locally_at": _iso(getattr(notification, "delivered_locally_at", None)),
        **suppression_record(notification),
        **_targets_record(getattr(notification, "resolved_targets", None)),
        "targets": notification_targets(notification, staff=staff),
        **acknowledgement_record(notification, staff=staff),
        "escalations": [
            {**child, "created_at": _iso(child["created_at"])} for child in notification_escalations(notification)
        ],
    }


def suppression_record(notification: Any) -> dict[str, Any]:
    """``suppressed_by`` (blank unless it was suppressed), ``dedup_key``, ``occurrences`` (the
    times its alarm was raised while it stood for its duplicates, itself included),
    ``last_occurrence_at`` and ``held_for_digest`` (when a flood digest takes it, else null)."""
    return {
        "suppressed_by": getattr(notification, "suppressed_by", ""),
        "dedup_key": getattr(notification, "dedup_key", ""),
        "occurrences": getattr(notification, "occurrences", 1),
        "last_occurrence_at": _iso(getattr(notification, "last_occurrence_at", None)),
        "held_for_digest": _iso(getattr(notification, "held_for_digest", None)),
    }


def _targets_record(entries: Any) -> dict[str, Any]:
    """``delivery_summary`` ("delivered to 118 of 120, 2 refused (550)"; empty until an attempt
    recorded outcomes) and ``target_counts`` (the counts by outcome, or None)."""
    summary = targets_summary(entries)
    if summary is None:
        return {"delivery_summary": "", "target_counts": None}
    text = summary.pop("text")
    return {"delivery_summary": text, "target_counts": summary}
