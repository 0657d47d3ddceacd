"""Acknowledgement links and SMS reply codes (docs/acknowledgement.md).

A link is ``{OUTBOX_PUBLIC_URL}/ack/{token}/``. The token is made with Django's own signing
(``django.core.signing.TimestampSigner``, salted for this purpose, keyed by SECRET_KEY): it
carries the notification, and either one recipient (a message to one person: ``individual``
email, an SMS) or nothing more (a message to a whole list: the page then asks for a name), and
the time it was made; it is refused once ``OUTBOX_ACK_TOKEN_DAYS`` have passed, or when a single
character was changed. Nothing is stored per token, so a link needs no table and no clean-up;
a token is not secret from the person holding it (its content is readable, only signed), which
is why it holds a short digest of the recipient (``notifications.channel_targets.target_ref``),
never an address.

The SMS reply code (``ACK 4821``) is four digits derived from the notification id; an inbound
reply is matched only among the notifications that number was sent (notifications.sms_replies).
"""

import base64
import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing

from notifications.channel_targets import target_ref

SALT = "notifications.ack_links"
# What a token is bound to: one recipient, or a list (the page asks for a name); "teams": a
# list through its Teams card (the acknowledgement is recorded as via "teams").
RECIPIENT, LIST, TEAMS = "r", "l", "t"
REF_LENGTH = 8  # of the recipient's digest: binds the token, is not a secret


class AckTokenInvalid(Exception):
    """The token was not made here, or was changed (``expired`` False), or is too old (True)."""

    def __init__(self, *, expired: bool) -> None:
        super().__init__("expired" if expired else "invalid")
        self.expired = expired


@dataclass(frozen=True)
class AckToken:
    """What a valid token says: the notification, how it was sent (``RECIPIENT``, ``LIST``,
    ``TEAMS``) and, for ``RECIPIENT``, the digest of that recipient (match it with
    :func:`recipient_matches`)."""

    notification_id: uuid.UUID
    bound_to: str
    recipient_ref: str = ""

    @property
    def asks_name(self) -> bool:
        """A list-wide message: the page asks who is acknowledging."""
        return self.bound_to != RECIPIENT


def _signer() -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=SALT)


def _recipient_ref(recipient: str) -> str:
    return target_ref(recipient.strip().lower())[:REF_LENGTH]


def ack_token_make(*, notification_id: Any, recipient: str | None = None, teams: bool = False) -> str:
    """A signed token for ``notification_id``: bound to ``recipient`` (an address or a number)
    when given, else to the notification's list (``teams``: the list's Teams card)."""
    compact = base64.urlsafe_b64encode(uuid.UUID(str(notification_id)).bytes).decode().rstrip("=")
    binding = RECIPIENT + _recipient_ref(recipient) if recipient else (TEAMS if teams else LIST)
    return _signer().sign(compact + binding)


def ack_token_read(token: str) -> AckToken:
    """The content of a token made by :func:`ack_token_make`; AckTokenInvalid when it was changed
    or not made here, or when it is older than OUTBOX_ACK_TOKEN_DAYS (``expired``)."""
    max_age = timedelta(days=settings.OUTBOX_ACK_TOKEN_DAYS)
    try:
        value = _signer().unsign(token, max_age=max_age)
    except signing.SignatureExpired:
        raise AckTokenInvalid(expired=True) from None
    except signing.BadSignature:
        raise AckTokenInvalid(expired=False) from None
    try:
        notification_id = uuid.UUID(bytes=base64.urlsafe_b64decode(value[:22] + "=="))
    except ValueError:
        raise AckTokenInvalid(expired=False) from None
    bound_to, ref = value[22:23], value[23:]
    if bound_to not in (RECIPIENT, LIST, TEAMS) or (bound_to == RECIPIENT) != bool(ref):
        raise AckTokenInvalid(expired=False)
    return AckToken(notification_id=notification_id, bound_to=bound_to, recipient_ref=ref)


def recipient_matches(token: AckToken, candidate: str) -> bool:
    """Whether ``candidate`` (an address or a number) is the recipient the token is bound to."""
    return token.bound_to == RECIPIENT and _recipient_ref(candidate) == token.recipient_ref


def ack_link(*, notification: Any, recipient: str | None = None, teams: bool = False) -> str | None:
    """The acknowledgement link of ``notification`` (see :func:`ack_token_make`), or None when it
    does not ask for acknowledgement or OUTBOX_PUBLIC_URL is not set (no public address to
    link to)."""
    base = settings.OUTBOX_PUBLIC_URL
    if not base or not getattr(notification, "asks_ack", False):
        return None
    token = ack_token_make(notification_id=notification.notification_id, recipient=recipient, teams=teams)
    return f"{base}/ack/{token}/"


def sms_ack_code(notification_id: Any) -> str:
    """The four digits a person texts back (``ACK 4821``) to acknowledge this notification."""
    digest = hashlib.sha256(str(notification_id).encode()).digest()
    return f"{int.from_bytes(digest[:4], 'big') % 10_000:04d}"
