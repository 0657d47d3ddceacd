"""What central's ingest API accepts, checked at the site before anything is buffered.

A notification that central will certainly refuse must fail at ``send()`` with an error naming
the field, not sit in the buffer until central parks it. The limits mirror central's ingest
contract (docs/api.md): text lengths are counted in characters, ``type_data`` in characters of
its ASCII-escaped JSON, and the whole POST body in UTF-8 bytes against central's request body
limit (``OUTBOX_MAX_BODY_BYTES``, 1 MiB unless central's operator changed it; a site whose
central uses a smaller limit configures the same number here).

Whether the notification list or the type exists is central's decision at delivery time, so
the agent does not check them.
"""

from __future__ import annotations

import json
import math
import unicodedata
import uuid
from typing import Any

# Central's default OUTBOX_MAX_BODY_BYTES.
MAX_BODY_BYTES = 1_048_576

MAX_LENGTHS = {
    "list_name": 200,
    "subject": 255,
    "body": 100_000,
    "source_instance_id": 200,
    "source_script": 200,
    "source_site_id": 64,
    "dedup_key": 200,
    "watchdog name": 200,
    "by": 200,
    "note": 1000,
}
MAX_TYPE_DATA_CHARS = 65_536
MAX_TYPE_DATA_DEPTH = 20
SINGLE_LINE_FIELDS = frozenset(
    {
        "type",
        "list_name",
        "subject",
        "source_instance_id",
        "source_script",
        "source_site_id",
        "dedup_key",
        "watchdog name",
        "by",
    }
)

# Most urgent first: the forwarder takes its buffer in this order, then by age.
PRIORITIES = ("critical", "high", "normal", "low")
DEFAULT_PRIORITY = "normal"
# Central takes watchdog intervals in whole seconds; a day is the longest a dead-man switch is useful.
MAX_WATCHDOG_SECONDS = 7 * 24 * 3600


class InvalidNotification(ValueError):
    """Central would refuse this notification; ``field`` names the offending field.

    A ValueError, so code that caught ValueError from ``send()`` keeps working.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_text(field: str, value: object) -> str:
    """``value`` if central would accept it as ``field``; TypeError for a non-string,
    :class:`InvalidNotification` for NUL, line breaks in a single-line field, unpaired
    surrogates or a length over the limit."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidNotification(field, "must not contain NUL characters")
    if field in SINGLE_LINE_FIELDS:
        if "\r" in value or "\n" in value:
            raise InvalidNotification(field, "must be a single line (no CR/LF)")
        control = _control_character(value)
        if control is not None:
            raise InvalidNotification(
                field, f"must not contain control characters or line separators (found U+{ord(control):04X})"
            )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidNotification(field, f"is not valid Unicode ({error.reason})") from None
    limit = MAX_LENGTHS.get(field)
    if limit is not None and len(value) > limit:
        raise InvalidNotification(field, f"must be at most {limit:,} characters (got {len(value):,})")
    return value


def _control_character(value: str) -> str | None:
    """The first character central refuses in a one-line field: C0 controls but TAB, DEL, C1
    controls, and the Unicode line and paragraph separators."""
    for character in value:
        code = ord(character)
        if character != "\t" and (code < 0x20 or 0x7F <= code <= 0x9F or character in "\u2028\u2029"):
            return character
    return None


def check_list_name(name: object) -> str:
    """``name`` if central would accept it as a list name (central stores it trimmed, in NFC):
    besides :func:`check_text`, not blank, no invisible formatting characters, and letters of
    one script only (a Cyrillic ``О`` in ``Оperators`` is a different, look-alike name)."""
    check_text("list_name", name)
    assert isinstance(name, str)
    if not name.strip():
        raise InvalidNotification("list_name", "must not be blank")
    scripts = set()
    for character in unicodedata.normalize("NFC", name):
        category = unicodedata.category(character)
        if category == "Cf":
            raise InvalidNotification(
                "list_name", f"must not contain invisible formatting characters (found U+{ord(character):04X})"
            )
        if category.startswith("L"):
            script = unicodedata.name(character, "").split(" ", 1)[0]
            script = {"MODIFIER": "", "FULLWIDTH": "LATIN"}.get(script, script)
            if script:
                scripts.add(script)
    if len(scripts) > 1:
        raise InvalidNotification("list_name", f"mixes {' and '.join(sorted(s.title() for s in scripts))} letters")
    return name


def check_priority(priority: object) -> str:
    """``priority`` if it is one of :data:`PRIORITIES`; TypeError for a non-string,
    :class:`InvalidNotification` naming the field otherwise."""
    if not isinstance(priority, str):
        raise TypeError(f"priority must be a str, not {type(priority).__name__}")
    if priority not in PRIORITIES:
        raise InvalidNotification("priority", f"must be one of {', '.join(PRIORITIES)} (got {priority[:40]!r})")
    return priority


def priority_rank(priority: str) -> int:
    """0 for ``critical`` … 3 for ``low``: the order the forwarder sends in."""
    return PRIORITIES.index(priority)


def check_dedup_key(dedup_key: object) -> str | None:
    """``dedup_key`` (None: not given) if central would accept it: one line, at most 200
    characters, not blank."""
    if dedup_key is None:
        return None
    check_text("dedup_key", dedup_key)
    assert isinstance(dedup_key, str)
    if not dedup_key.strip():
        raise InvalidNotification("dedup_key", "must not be blank (leave it out, None, for no de-duplication)")
    return dedup_key


def check_watchdog(*, name: object, every_seconds: object, list_name: object, type: object) -> None:
    """A watchdog ping central would accept: a one-line name of at most 200 characters, a whole
    number of seconds from 1 up to a week, a valid list name and type."""
    check_text("watchdog name", name)
    assert isinstance(name, str)
    if not name.strip():
        raise InvalidNotification("watchdog name", "must not be blank")
    if isinstance(every_seconds, bool) or not isinstance(every_seconds, int):
        raise TypeError(f"every_seconds must be an int (whole seconds), not {type_name(every_seconds)}")
    if not 1 <= every_seconds <= MAX_WATCHDOG_SECONDS:
        raise InvalidNotification(
            "every_seconds", f"must be from 1 to {MAX_WATCHDOG_SECONDS:,} seconds (got {every_seconds:,})"
        )
    check_list_name(list_name)
    check_text("type", type)
    assert isinstance(type, str)
    if not type.strip():
        raise InvalidNotification("type", "must not be blank")


def type_name(value: object) -> str:
    """The name of ``value``'s type, for messages."""
    return value.__class__.__name__


def _json_problem(value: object, depth: int = 0) -> str | None:
    if depth > MAX_TYPE_DATA_DEPTH:
        return f"is nested more than {MAX_TYPE_DATA_DEPTH} levels deep"
    if isinstance(value, str):
        if "\x00" in value:
            return "must not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return f"is not valid Unicode ({error.reason})"
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = _json_problem(key, depth + 1) or _json_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for item in value:
            problem = _json_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, float) and not math.isfinite(value):
        return "must not contain NaN or infinite numbers"
    return None


def _measured(type_data: dict[str, Any], type_name: str) -> dict[str, Any]:
    """``type_data`` as central's size limit counts it: for email without the attachments'
    ``content_base64`` values, which central bounds separately (its OUTBOX_MAX_ATTACHMENT_BYTES;
    here the whole body limit covers them)."""
    attachments = type_data.get("attachments")
    if type_name != "email" or not isinstance(attachments, list):
        return type_data
    stripped = [
        {key: value for key, value in item.items() if key != "content_base64"} if isinstance(item, dict) else item
        for item in attachments
    ]
    return dict(type_data, attachments=stripped)


def check_type_data(type_data: object, type_name: str = "email") -> dict[str, Any]:
    """``type_data`` (None becomes ``{}``) if central would accept it: a JSON object, no NUL,
    finite numbers, at most 64 KiB as ASCII-escaped JSON (for ``type_name`` email, not counting
    attachment contents). TypeError when it is not a dict."""
    if type_data is None:
        return {}
    if not isinstance(type_data, dict):
        raise TypeError("type_data must be a dict (a JSON object) or None")
    problem = _json_problem(type_data)
    if problem:
        raise InvalidNotification("type_data", problem)
    try:
        size = len(json.dumps(_measured(type_data, type_name), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise InvalidNotification("type_data", f"is not JSON-serialisable: {error}") from None
    if size > MAX_TYPE_DATA_CHARS:
        raise InvalidNotification("type_data", f"must be at most {MAX_TYPE_DATA_CHARS:,} bytes as JSON (got {size:,})")
    return type_data


def notification_payload(
    *,
    list_name: str,
    subject: str,
    body: str,
    source_instance_id: str | None,
    source_script: str | None,
    type: str,
    type_data: dict[str, Any] | None,
    site_id: str | None,
    enqueued_at: str,
    max_body_bytes: int = MAX_BODY_BYTES,
    priority: str = DEFAULT_PRIORITY,
    dedup_key: str | None = None,
) -> tuple[str, str]:
    """A new notification id and the JSON text of its POST body (the ingest API, docs/api.md).

    Every field is checked against central's contract first (TypeError or
    :class:`InvalidNotification`), and the encoded body against ``max_body_bytes``. The text is
    stored and sent as it is, so a resend is byte-for-byte the same notification and central
    answers it as a replay. ``priority`` and ``dedup_key`` are in the body only when they are
    not the default (a central older than them never sees them unless they are used).
    """
    check_list_name(list_name)
    check_priority(priority)
    check_dedup_key(dedup_key)
    check_text("type", type)
    if not type.strip():
        raise InvalidNotification("type", "must not be blank")
    check_text("subject", subject)
    check_text("body", body)
    for field, value in (("source_instance_id", source_instance_id), ("source_script", source_script)):
        if value is not None:
            check_text(field, value)
    if site_id:
        check_text("source_site_id", site_id)
    checked_type_data = check_type_data(type_data, type)
    notification_id = str(uuid.uuid4())
    payload = {
        "notification_id": notification_id,
        "type": type,
        "list_name": list_name,
        "subject": subject,
        "body": body,
        "type_data": checked_type_data,
        "source_instance_id": source_instance_id or "",
        "source_script": source_script or "",
        "site_enqueued_at": enqueued_at,
    }
    if site_id:
        payload["source_site_id"] = site_id
    if priority != DEFAULT_PRIORITY:
        payload["priority"] = priority
    if dedup_key is not None:
        payload["dedup_key"] = dedup_key
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > max_body_bytes:
        raise InvalidNotification(
            "notification",
            f"is {size:,} bytes as JSON; central accepts request bodies of at most {max_body_bytes:,} bytes",
        )
    return notification_id, text
