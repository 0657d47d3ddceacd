"""What a notification's ``type_data`` may say about its email (docs/api.md, "type_data for email").

One reading serves both ends. Ingest rejects a submission whose email fields are malformed,
naming each field the way a client wrote it (``type_data.attachments[0].content_base64``), and
stores the submission exactly as sent. Delivery reads the same fields again into an
:class:`EmailContent` and composes from that (notifications.adapters.email_compose); a stored
row that no longer reads cleanly (say, an operator has since narrowed the content-type
allow-list) fails permanently with the same message instead of being sent without its part.

Keys of ``type_data`` other than these are stored and ignored by email.
"""

import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from notifications.email_address import email_address_control_refusal, email_address_refusal
from notifications.models import NotificationPriority

FIELDS = ("html", "reply_to", "cc", "priority", "attachments")
PRIORITIES = ("high", "normal", "low")
# Not a value of type_data.priority: what a notification of high or critical priority is sent as.
URGENT = "urgent"
MAX_REPLY_TO = 10
MAX_CC = 50
MAX_ATTACHMENTS = 10
MAX_FILENAME_LENGTH = 255
ATTACHMENT_FIELDS = ("filename", "content_type", "content_base64")
# Base64 may be wrapped in lines, as most encoders do; nothing else but the alphabet is allowed.
_BASE64_WHITESPACE = str.maketrans("", "", " \t\r\n")


@dataclass(frozen=True)
class Attachment:
    """One attachment as submitted: its file name (sanitised only when composed), its content
    type (lower case, on the allow-list) and its decoded bytes."""

    filename: str
    content_type: str
    content: bytes


@dataclass(frozen=True)
class EmailContent:
    """The email fields of a notification's ``type_data``, read and checked."""

    html: str = ""
    reply_to: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    priority: str = "normal"
    attachments: tuple[Attachment, ...] = ()

    @property
    def is_plain(self) -> bool:
        """True when the message is subject and body only (a priority is a header, nothing
        more), so the fast composer builds it."""
        return not (self.html or self.reply_to or self.cc or self.attachments)


PLAIN = EmailContent()


def email_content_read(type_data: Mapping[str, Any]) -> tuple[EmailContent, dict[str, list[str]]]:
    """Read the email fields of ``type_data``.

    Returns the content and the problems per field (keys such as ``type_data.cc[1]``, in the
    order the fields are checked); the content means something only when there are none.
    """
    if not type_data or type_data.keys().isdisjoint(FIELDS):
        return PLAIN, {}
    errors: dict[str, list[str]] = {}

    html = type_data.get("html")
    if html is None:
        html = ""
    elif not isinstance(html, str):
        errors["type_data.html"] = ["Must be a string of HTML."]
        html = ""

    reply_to = _addresses(type_data.get("reply_to"), "type_data.reply_to", MAX_REPLY_TO, errors)
    cc = _addresses(type_data.get("cc"), "type_data.cc", MAX_CC, errors)

    priority = type_data.get("priority")
    if priority is None:
        priority = "normal"
    elif priority not in PRIORITIES:
        errors["type_data.priority"] = [f"Must be one of {', '.join(PRIORITIES)}."]
        priority = "normal"

    attachments = _attachments(type_data.get("attachments"), errors)
    content = EmailContent(html=html, reply_to=reply_to, cc=cc, priority=priority, attachments=attachments)
    return content, errors


def email_content_prioritised(content: EmailContent, *, priority: int) -> EmailContent:
    """``content`` as the notification's own ``priority`` (a ``Notification.Priority``) marks it:
    high and critical are sent as urgent (X-Priority 1, Importance high, Priority urgent); a
    normal one keeps what its ``type_data.priority`` asked for; a low one sets no header."""
    if priority >= NotificationPriority.HIGH:
        return replace(content, priority=URGENT)
    if priority < NotificationPriority.NORMAL and content.priority != "normal":
        return replace(content, priority="normal")
    return content


def email_type_data_validate(type_data: Mapping[str, Any]) -> dict[str, list[str]]:
    """The problems of the email fields of ``type_data``, per field; empty when it is valid."""
    return email_content_read(type_data)[1]


def email_type_data_measured(type_data: dict[str, Any]) -> dict[str, Any]:
    """``type_data`` as the general ``type_data`` size limit counts it: without the attachments'
    ``content_base64`` values, which OUTBOX_MAX_ATTACHMENT_BYTES bounds instead."""
    attachments = type_data.get("attachments")
    if not isinstance(attachments, list):
        return type_data
    return {
        **type_data,
        "attachments": [
            {key: value for key, value in item.items() if key != "content_base64"} if isinstance(item, dict) else item
            for item in attachments
        ],
    }


def _addresses(value: object, field: str, limit: int, errors: dict[str, list[str]]) -> tuple[str, ...]:
    """One address or a list of them, each a valid ASCII address, none twice."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        errors[field] = ["Must be an email address or a non-empty list of them."]
        return ()
    if len(items) > limit:
        errors[field] = [f"Must list at most {limit} addresses (got {len(items)})."]
        return ()
    addresses: list[str] = []
    seen: set[str] = set()
    for index, address in enumerate(items):
        where = field if isinstance(value, str) else f"{field}[{index}]"
        problem = _address_problem(address)
        if problem is None and address.lower() in seen:
            problem = "Is listed twice."
        if problem is not None:
            errors[where] = [problem]
            continue
        seen.add(address.lower())
        addresses.append(address)
    return tuple(addresses)


def _address_problem(address: object) -> str | None:
    """The rule every address meets (notifications.email_address), and ASCII only: these go
    into headers as written."""
    if not isinstance(address, str):
        return "Must be a string."
    if not address.isascii() and email_address_control_refusal(address) is None:
        # SMTP without the SMTPUTF8 extension carries ASCII addresses only.
        return "Must be an ASCII address (write an internationalised domain in its xn-- form)."
    return email_address_refusal(address)


def _attachment_read(item: dict[Any, Any], allowed: Any, problems: dict[str, str]) -> Attachment | None:
    """One attachment of ``type_data.attachments``, its problems by key in ``problems``; its
    content is decoded (and counts toward the total) even when another key has a problem."""
    for key in sorted(set(item) - set(ATTACHMENT_FIELDS), key=str):
        problems[str(key)[:40]] = "Unknown field."
    for key in ATTACHMENT_FIELDS:
        if item.get(key) is None:
            problems[key] = "This field is required."
        elif not isinstance(item[key], str):
            problems[key] = "Must be a string."

    filename = item.get("filename")
    if "filename" not in problems:
        assert isinstance(filename, str)
        problem = _filename_problem(filename)
        if problem:
            problems["filename"] = problem

    content_type = item.get("content_type")
    if "content_type" not in problems:
        assert isinstance(content_type, str)
        content_type = content_type.strip().lower()
        if content_type not in allowed:
            problems["content_type"] = (
                f"Content type {content_type[:100]!r} is not allowed; allowed: {', '.join(sorted(allowed))}."
            )

    if "content_base64" in problems:
        return None
    try:
        # Strict: the alphabet only, correct padding, nothing after it.
        content = binascii.a2b_base64(item["content_base64"].translate(_BASE64_WHITESPACE), strict_mode=True)
    except (binascii.Error, ValueError):
        problems["content_base64"] = "Not valid base64."
        return None
    return Attachment(filename=str(filename), content_type=str(content_type), content=content)


def _filename_problem(filename: str) -> str | None:
    if not filename.strip():
        return "Must not be blank."
    if len(filename) > MAX_FILENAME_LENGTH:
        return f"Must be at most {MAX_FILENAME_LENGTH} characters (got {len(filename)})."
    if any(ord(character) < 32 or character == "\x7f" for character in filename):
        return "Must not contain line breaks or other control characters."
    return None


def _attachments(value: object, errors: dict[str, list[str]]) -> tuple[Attachment, ...]:
    field = "type_data.attachments"
    if value is None:
        return ()
    if not isinstance(value, list):
        errors[field] = ["Must be a list of attachments."]
        return ()
    if len(value) > MAX_ATTACHMENTS:
        errors[field] = [f"Must have at most {MAX_ATTACHMENTS} attachments (got {len(value)})."]
        return ()
    allowed = settings.OUTBOX_ATTACHMENT_CONTENT_TYPES
    attachments: list[Attachment] = []
    total = 0
    for index, item in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(item, dict):
            errors[where] = ["Must be an object with filename, content_type and content_base64."]
            continue
        problems: dict[str, str] = {}
        attachment = _attachment_read(item, allowed, problems)
        total += len(attachment.content) if attachment is not None else 0
        for key, problem in problems.items():
            errors[f"{where}.{key}"] = [problem]
        if attachment is not None and not problems:
            attachments.append(attachment)
    limit = settings.OUTBOX_MAX_ATTACHMENT_BYTES
    if total > limit:
        errors[field] = [f"Attachments total {total:,} bytes (decoded); at most {limit:,} are allowed."]
    return tuple(attachments)
