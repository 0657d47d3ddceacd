"""The console's view of a notification's email as delivery composes it: the headers, the parts
and the sanitised HTML (shown in a sandboxed frame, never executed)."""

from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import default
from email.utils import format_datetime
from typing import Any

from django.utils import timezone

from notifications.adapters.email_compose import attachment_filename, email_compose, html_sanitise, message_id_for
from notifications.email_content import email_content_prioritised, email_content_read
from notifications.models import Notification, NotificationList, RecipientMode, SmtpConfiguration

NO_CONFIGURATION_FROM = "outbox@smtp-not-configured.invalid"


@dataclass(frozen=True)
class EmailPreview:
    """What :func:`email_preview_build` found. ``headers`` are the composed message's
    top-level headers in order; ``parts`` describe its content (type and what it holds);
    ``html`` is the sanitised HTML ("" when there is none); ``recipient_mode`` is the list's
    mode now (None when no list of that name exists); ``notes`` say how the preview differs
    from a delivered message; ``problems`` are the type_data problems that would stop delivery."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    html: str = ""
    recipient_mode: str | None = None
    notes: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)


def email_preview_build(*, notification: Notification) -> EmailPreview:
    """The notification's email as it is composed now: with the list's current recipient mode
    and members and the current From address (delivery resolves both at delivery time, so
    for a delivered notification they may have changed since). Reads the list and the SMTP
    configuration; sends nothing."""
    content, problems = email_content_read(notification.type_data or {})
    if problems:
        return EmailPreview(problems=problems)
    content = email_content_prioritised(content, priority=notification.priority)
    notes: list[str] = []
    config = SmtpConfiguration.current()
    from_address = config.from_address if config else NO_CONFIGURATION_FROM
    if config is None:
        notes.append("No SMTP configuration: the From address shown is a placeholder.")
    notification_list = (
        NotificationList.objects.filter(name__iexact=notification.list_name).only("pk", "recipient_mode").first()
    )
    mode = notification_list.recipient_mode if notification_list else None
    to: list[str] = []
    if mode == RecipientMode.TO and notification_list is not None:
        to = list(notification_list.email_recipients.values_list("email", flat=True))
    elif mode == RecipientMode.INDIVIDUAL:
        notes.append(
            "Individual mode: each member gets a message of their own with only their address in To: "
            "(shown here as undisclosed recipients) and a Message-ID of its own."
        )
    elif mode is None:
        notes.append(f"No list named {notification.list_name!r} exists now.")
    moment = notification.delivered_at or notification.last_attempt_at or timezone.now()
    domain = from_address.rpartition("@")[2] or "outbox"
    raw = email_compose(
        from_address=from_address,
        to=to,
        subject=notification.subject,
        body=notification.body,
        message_id=message_id_for(notification_id=str(notification.notification_id), domain=domain),
        notification_id=str(notification.notification_id),
        date=format_datetime(moment),
        content=content,
    )
    message = BytesParser(policy=default).parsebytes(raw, headersonly=True)
    headers = [(name, str(value)) for name, value in message.items()]

    parts = [f"text/plain: the body ({len(notification.body):,} characters)"]
    html = html_sanitise(content.html) if content.html else ""
    if html:
        parts.append(f"text/html: the sanitised HTML ({len(html):,} characters), the alternative to the body")
    for attachment in content.attachments:
        parts.append(
            f"attachment {attachment_filename(attachment.filename)!r}: {attachment.content_type}, "
            f"{len(attachment.content):,} bytes"
        )
    return EmailPreview(headers=headers, parts=parts, html=html, recipient_mode=mode, notes=notes)


def type_data_shorten(type_data: Any) -> Any:
    """``type_data`` with each attachment's base64 content replaced by its length, so that a
    page shows what was sent without megabytes of base64."""
    if not isinstance(type_data, dict) or not isinstance(type_data.get("attachments"), list):
        return type_data
    shown = []
    for item in type_data["attachments"]:
        if isinstance(item, dict) and isinstance(item.get("content_base64"), str):
            item = {**item, "content_base64": f"({len(item['content_base64']):,} characters of base64)"}
        shown.append(item)
    return {**type_data, "attachments": shown}
