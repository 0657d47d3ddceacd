"""SMS replies: a person texts ``ACK 4821`` back to acknowledge an alarm (docs/acknowledgement.md).

Twilio posts each inbound message to ``POST /api/v1/providers/twilio/inbound/``
(notifications.providers.TwilioInboundView, signature checked). A reply acknowledges a
notification only when its code is that notification's (notifications.ack_links.sms_ack_code)
**and** the number it comes from is one the notification was sent to (Twilio accepted a message
of it for that number: a ``ProviderMessage`` whose target is that number), within
OUTBOX_ACK_TOKEN_DAYS. A reply that starts with ``ACK`` gets a short answer saying what
happened; anything else gets no answer at all, so an auto-responder cannot start a ping-pong.
"""

import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from notifications import acknowledgement
from notifications.ack_links import sms_ack_code
from notifications.channel_targets import target_ref
from notifications.db import database_now
from notifications.models import AcknowledgedVia, Notification, ProviderMessage

_ACK = re.compile(r"^\s*ACK\b\s*(\d{4})?\b", re.IGNORECASE)


@dataclass(frozen=True)
class SmsReplyOutcome:
    """``reply``: the text to answer with ("" for none); ``acknowledged``: the notification this
    reply acknowledged now, if any."""

    reply: str
    acknowledged: Notification | None = None


def sms_reply_handle(*, from_number: str, body: str) -> SmsReplyOutcome:
    """Act on one inbound SMS (see the module)."""
    match = _ACK.match(body or "")
    if match is None:
        return SmsReplyOutcome(reply="")
    code = match.group(1)
    if not code:
        return SmsReplyOutcome(reply="To acknowledge, reply ACK and the 4-digit code from the alarm, e.g. ACK 1234.")
    since = database_now() - timedelta(days=settings.OUTBOX_ACK_TOKEN_DAYS)
    sent_to_number = ProviderMessage.objects.filter(
        provider="twilio", target_ref=target_ref(from_number.strip()), created_at__gte=since
    ).values_list("notification_id", flat=True)
    candidates = [
        row
        for row in Notification.objects.filter(pk__in=list(sent_to_number), asks_ack=True).only(
            "notification_id", "acknowledged_at", "acknowledged_by", "cleared_at"
        )
        if sms_ack_code(row.notification_id) == code
    ]
    open_ones = [row for row in candidates if row.acknowledged_at is None]
    if not candidates:
        return SmsReplyOutcome(reply=f"No alarm with code {code} was sent to this number recently.")
    if len(open_ones) > 1:
        return SmsReplyOutcome(
            reply=f"Code {code} matches more than one open alarm; please use the link in the message."
        )
    if not open_ones:
        return SmsReplyOutcome(reply=f"Alarm {code} was already acknowledged.")
    outcome = acknowledgement.acknowledge(open_ones[0].pk, via=AcknowledgedVia.SMS, by=from_number.strip())
    if not outcome.changed:
        return SmsReplyOutcome(reply=f"Alarm {code} was already acknowledged.")
    return SmsReplyOutcome(reply=f"Thank you: alarm {code} is acknowledged.", acknowledged=outcome.notification)
