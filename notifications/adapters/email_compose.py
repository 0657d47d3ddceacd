"""Composing the email of a notification: the bytes handed to the SMTP server (docs/architecture.md,
"How an email is composed").

Two composers build the same kind of message:

* :func:`compose_message`, the fast one, for plain notifications (subject and body, maybe a
  priority): the headers and a single text part written directly. At thousands of messages a
  second this is most of a dispatcher's CPU time, and ``email.message.EmailMessage``'s header
  folding would be the larger part of it.
* :func:`compose_rich`, with Python's ``email`` package (``EmailMessage``, policy SMTP), for
  everything else: HTML (sanitised here with nh3) as the alternative to the plain body, Cc,
  Reply-To and attachments.

:func:`email_compose` picks one. Header values must have been checked for CR, LF and NUL by the
caller (the adapter refuses such a notification as header injection).
"""

import base64
import dataclasses
import hashlib
import html
import os
import re
from email.header import Header
from email.message import EmailMessage
from email.policy import SMTP
from functools import cache

import nh3
from django.core.exceptions import SuspiciousFileOperation
from django.utils.text import get_valid_filename

from notifications.email_content import PLAIN, EmailContent

MAX_LINE_BYTES = 998  # RFC 5322 §2.1.1
# What "To:" shows when the members are not to see each other: an empty group (RFC 5322 §3.4),
# which every mail client displays as "undisclosed recipients". The From address instead would
# make members' "reply all" go to the sender, and hide that the message had other readers.
UNDISCLOSED_RECIPIENTS = "undisclosed-recipients:;"
PRIORITY_HEADERS = {
    # A notification of high or critical priority: the headers mail clients and gateways read
    # (Outlook/Exchange: Importance; Thunderbird and most others: X-Priority; RFC 2156: Priority).
    "urgent": (("X-Priority", "1 (Highest)"), ("Importance", "high"), ("Priority", "urgent")),
    "high": (("X-Priority", "1 (Highest)"), ("Importance", "high")),
    "normal": (),
    "low": (("X-Priority", "5 (Lowest)"), ("Importance", "low")),
}
FALLBACK_FILENAME = "attachment"
MAX_SAFE_FILENAME_LENGTH = 120

# HTML is reduced to what an alarm table or a short report needs, and nothing that runs or
# fetches: nh3's default tags and attributes (no script, no event handler, no javascript: URL, no
# iframe or form), plus the presentational table attributes and a few inline styles mail clients
# honour. Nothing is loaded from elsewhere when a recipient opens the message (see
# html_attribute_kept): a remote image is a read receipt for whoever serves it, or a request
# from the reader's mail client into their own network.
HTML_ATTRIBUTES = {
    **{tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()},
    "*": {"style", "title", "lang", "dir"},
    "table": {*nh3.ALLOWED_ATTRIBUTES.get("table", set()), "border", "cellpadding", "cellspacing", "width"},
    "td": {*nh3.ALLOWED_ATTRIBUTES.get("td", set()), "valign", "width", "nowrap"},
    "th": {*nh3.ALLOWED_ATTRIBUTES.get("th", set()), "valign", "width", "nowrap"},
    "tr": {*nh3.ALLOWED_ATTRIBUTES.get("tr", set()), "valign"},
}
HTML_STYLE_PROPERTIES = {
    "color",
    "background-color",
    "font-family",
    "font-size",
    "font-style",
    "font-weight",
    "text-align",
    "text-decoration",
    "vertical-align",
    "white-space",
    "width",
    "height",
    "border",
    "border-collapse",
    "border-color",
    "border-style",
    "border-width",
    "border-bottom",
    "border-top",
    "border-left",
    "border-right",
    "padding",
    "margin",
}


# Images travel inside the message: a part of it (cid:) or the image itself (data:, raster
# types only: an SVG is a document that may hold scripts and links).
_IMAGE_SOURCE = re.compile(r"(?i)\s*(?:cid:|data:image/(?:png|gif|jpeg|webp);base64,)")
# An inline style that could fetch (url(), @import, image-set()) or run (expression()). Checked
# before nh3 normalises the style, so CSS escapes (u\72l) and comments (ur/**/l), which would
# hide these words, are refused as well; an alarm email's styles need neither.
_STYLE_FETCHES = re.compile(r"(?i)url\s*\(|expression\s*\(|image-set\s*\(|@import|\\|/\*")
_SCHEME = re.compile(r"(?i)([a-z][a-z0-9+.-]*):")
# What URL parsers (browsers', nh3's) drop from a URL before reading its scheme ("d\tata:").
_URL_IGNORED = re.compile(r"[\x00-\x20]")


def html_attribute_kept(tag: str, name: str, value: str) -> str | None:
    """nh3's attribute filter: ``value``, or None to drop the attribute. An image's ``src`` only
    as ``cid:`` or a ``data:`` raster image; a link never to ``cid:`` or ``data:`` (nh3 allows
    both schemes for the images); no ``style`` that could fetch or run; no ``background``."""
    if name == "src":
        return value if tag == "img" and _IMAGE_SOURCE.match(value) else None
    if name == "style":
        return None if _STYLE_FETCHES.search(value) else value
    if name == "background":
        return None
    if name in ("href", "cite"):
        scheme = _SCHEME.match(_URL_IGNORED.sub("", value))
        if scheme and scheme.group(1).lower() in ("cid", "data"):
            return None
    return value


@cache
def _cleaner() -> nh3.Cleaner:
    return nh3.Cleaner(
        attributes=HTML_ATTRIBUTES,
        filter_style_properties=HTML_STYLE_PROPERTIES,
        attribute_filter=html_attribute_kept,
        url_schemes=nh3.ALLOWED_URL_SCHEMES | {"cid", "data"},
    )


def html_sanitise(html: str) -> str:
    """``html`` with everything that could run or fetch on its own removed: script and style
    elements with their content, event-handler attributes, ``javascript:`` and other unknown
    URL schemes, frames and forms, and everything a mail client would load when the message is
    opened (remote images, CSS ``url()``, ``background``). What remains is markup to show."""
    return _cleaner().clean(html)


def attachment_filename(filename: str) -> str:
    """The name an attachment is sent with: the last path component, reduced to letters,
    digits, ``-``, ``_`` and ``.`` (spaces become ``_``), no leading dots, at most 120
    characters with the extension kept; ``attachment`` when nothing is left."""
    name = re.split(r"[/\\]", filename)[-1]
    try:
        name = get_valid_filename(name)
    except SuspiciousFileOperation:
        return FALLBACK_FILENAME
    name = name.lstrip(".")
    if len(name) > MAX_SAFE_FILENAME_LENGTH:
        stem, extension = os.path.splitext(name)
        extension = extension[:20]
        name = stem[: MAX_SAFE_FILENAME_LENGTH - len(extension)] + extension
    return name or FALLBACK_FILENAME


ACK_LINE = "Acknowledge this alarm (confirm on the page that opens):"


def email_with_ack_link(*, body: str, content: EmailContent, link: str) -> tuple[str, EmailContent]:
    """``body`` and ``content`` with the acknowledgement ``link`` added: at the end of the text
    and, when there is HTML, at the end of the HTML as a link."""
    body = f"{body.rstrip()}\n\n{ACK_LINE}\n{link}\n"
    if content.html:
        escaped = html.escape(link, quote=True)
        paragraph = f'<p><a href="{escaped}">Acknowledge this alarm</a></p>'
        content = dataclasses.replace(content, html=content.html + paragraph)
    return body, content


def message_id_for(*, notification_id: str, domain: str, recipient: str | None = None) -> str:
    """The Message-ID of a notification's email, the same on every attempt so that a receiver
    can drop a duplicate. Each message of individual mode (to one member, or to the Cc
    addresses) gets its own, derived from its ``recipient`` text without showing it."""
    if recipient is None:
        return f"<{notification_id}@{domain}>"
    digest = hashlib.sha256(recipient.lower().encode()).hexdigest()[:16]
    return f"<{notification_id}.{digest}@{domain}>"


def email_compose(
    *,
    from_address: str,
    to: list[str],
    subject: str,
    body: str,
    message_id: str,
    notification_id: str,
    date: str,
    content: EmailContent = PLAIN,
) -> bytes:
    """The message as bytes with CRLF line ends (smtplib dot-stuffs it). ``to`` is what the
    To: header shows; empty shows the undisclosed-recipients group. Plain content takes the
    fast composer, anything else the ``email`` package."""
    if content.is_plain:
        return compose_message(
            from_address=from_address,
            to=to,
            subject=subject,
            body=body,
            message_id=message_id,
            notification_id=notification_id,
            date=date,
            priority=content.priority,
        )
    return compose_rich(
        from_address=from_address,
        to=to,
        subject=subject,
        body=body,
        message_id=message_id,
        notification_id=notification_id,
        date=date,
        content=content,
    )


def compose_message(
    *,
    from_address: str,
    to: list[str],
    subject: str,
    body: str,
    message_id: str,
    notification_id: str,
    date: str,
    priority: str = "normal",
) -> bytes:
    """A plain message, written directly: a non-ASCII subject is RFC 2047-encoded; the body is
    sent as 7bit when it is ASCII with short lines, else base64 of its UTF-8. ``to`` empty
    shows the undisclosed-recipients group."""
    encoded_subject = subject if subject.isascii() else Header(subject, "utf-8").encode(linesep="\r\n")
    lines = body.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if body.isascii() and all(len(line) <= MAX_LINE_BYTES for line in lines):
        encoding, payload = "7bit", "\r\n".join(lines).encode("ascii")
    else:
        encoding, payload = "base64", base64.encodebytes(body.encode("utf-8")).replace(b"\n", b"\r\n")
    recipients = ",\r\n ".join(to) if to else UNDISCLOSED_RECIPIENTS  # folded: a long list stays in the line limit
    extra = "".join(f"{name}: {value}\r\n" for name, value in PRIORITY_HEADERS[priority])
    headers = (
        f"From: {from_address}\r\n"
        f"To: {recipients}\r\n"
        f"Subject: {encoded_subject}\r\n"
        f"Date: {date}\r\n"
        f"Message-ID: {message_id}\r\n"
        f"X-Notification-Id: {notification_id}\r\n"
        f"{extra}"
        "MIME-Version: 1.0\r\n"
        'Content-Type: text/plain; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    )
    # Headers are ASCII, but for an address whose local part has no ASCII form (sent with
    # SMTPUTF8, whose messages carry UTF-8 headers as they are: RFC 6532).
    return headers.encode("utf-8") + payload + (b"" if payload.endswith(b"\r\n") else b"\r\n")


def compose_rich(
    *,
    from_address: str,
    to: list[str],
    subject: str,
    body: str,
    message_id: str,
    notification_id: str,
    date: str,
    content: EmailContent,
) -> bytes:
    """A MIME message: the plain ``body`` as ``text/plain``; with HTML, ``multipart/alternative``
    of the body and the sanitised HTML (the body is the text alternative, never derived from
    the HTML); with attachments, all of that inside ``multipart/mixed`` followed by each
    attachment under its sanitised file name."""
    message = email_headers_build(
        from_address=from_address,
        to=to,
        subject=subject,
        message_id=message_id,
        notification_id=notification_id,
        date=date,
        content=content,
    )
    message.set_content(body.replace("\r\n", "\n").replace("\r", "\n"))
    if content.html:
        message.add_alternative(html_sanitise(content.html), subtype="html")
    for attachment in content.attachments:
        maintype, _, subtype = attachment.content_type.partition("/")
        message.add_attachment(
            attachment.content,
            maintype=maintype,
            subtype=subtype,
            filename=attachment_filename(attachment.filename),
        )
    return message.as_bytes()


def email_headers_build(
    *,
    from_address: str,
    to: list[str],
    subject: str,
    message_id: str,
    notification_id: str,
    date: str,
    content: EmailContent,
) -> EmailMessage:
    """An EmailMessage (policy SMTP) carrying the headers of the notification's email and no
    content yet: the rich composer adds the parts, the console shows the headers."""
    message = EmailMessage(policy=SMTP)
    message["From"] = from_address
    message["To"] = ", ".join(to) if to else UNDISCLOSED_RECIPIENTS
    if content.cc:
        message["Cc"] = ", ".join(content.cc)
    if content.reply_to:
        message["Reply-To"] = ", ".join(content.reply_to)
    message["Subject"] = subject
    message["Date"] = date
    message["Message-ID"] = message_id
    message["X-Notification-Id"] = notification_id
    for name, value in PRIORITY_HEADERS[content.priority]:
        message[name] = value
    return message
