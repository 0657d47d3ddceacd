"""Provider status callbacks (docs/channels.md): what a provider later says about a message it
accepted — for Twilio SMS, ``queued`` → ``sent`` → ``delivered`` / ``undelivered`` /
``failed`` — recorded on that target of the notification, with its time.

``POST /api/v1/providers/twilio/status/`` is called by Twilio with a form body and an
``X-Twilio-Signature`` header, an HMAC of the callback URL and the form under the account's
auth token (checked with the official ``twilio`` helper, RequestValidator). A request without a
valid signature is refused with 403 and changes nothing; an unknown message id is 404; a
replay, or a status older than the one recorded (callbacks may arrive out of order), is
answered 200 and changes nothing.

The callback URL checked is OUTBOX_PUBLIC_URL + the path when that is set (what Twilio was told
to call, whatever proxies rewrote on the way), else the URL the request arrived at.

A provider status is information for operators and sites; it does not change the
notification's status (Delivered still means the provider accepted the message).
"""

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape

from django.conf import settings
from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework import status as http_status
from rest_framework.parsers import FormParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from twilio.request_validator import RequestValidator

from notifications.channel_targets import target_site_masked
from notifications.models import ChannelConfiguration, Notification, ProviderMessage
from notifications.sms_replies import sms_reply_handle
from notifications.vocabulary import target_outcome

# Twilio's message statuses, by how far along they are: a callback never moves a target back.
TWILIO_STATUS_RANK = {
    "accepted": 0,
    "scheduled": 0,
    "queued": 1,
    "sending": 2,
    "sent": 3,
    "receiving": 3,
    "received": 4,
    "delivered": 4,
    "undelivered": 4,
    "failed": 4,
    "canceled": 4,
    "partially_delivered": 4,
    "read": 5,
}


class CallbackRefused(Exception):
    """A callback that must not change anything: ``status`` is the HTTP answer."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def twilio_signature_valid(*, url: str, params: dict[str, str], signature: str) -> bool:
    """Whether ``signature`` is Twilio's for ``url`` and ``params`` under the configured SMS
    account's auth token (False when no token is configured)."""
    config = ChannelConfiguration.objects.filter(channel=ChannelConfiguration.Channel.SMS).first()
    if config is None or not config.auth_token or not signature:
        return False
    return bool(RequestValidator(config.auth_token).validate(url, params, signature))


def provider_status_record(
    *, provider: str, provider_id: str, provider_status: str, error_code: str = "", now: datetime | None = None
) -> bool:
    """Record ``provider_status`` for the message ``provider_id``; returns whether anything
    changed. Raises CallbackRefused (404) for an unknown message id. A status ranked no
    further than the recorded one changes nothing."""
    now = now or timezone.now()
    with transaction.atomic():
        message = ProviderMessage.objects.select_for_update().filter(provider=provider, provider_id=provider_id).first()
        if message is None:
            raise CallbackRefused(f"No message {provider_id!r} is known.", status=http_status.HTTP_404_NOT_FOUND)
        rank = TWILIO_STATUS_RANK.get(provider_status, -1)
        if message.provider_status and rank <= TWILIO_STATUS_RANK.get(message.provider_status, -1):
            return False
        message.provider_status = provider_status
        message.provider_status_at = now
        message.save(update_fields=["provider_status", "provider_status_at"])
        notification = Notification.objects.select_for_update().filter(pk=message.notification_id).first()
        if notification is not None:
            targets_apply_provider_statuses(notification=notification, messages=[message], error_code=error_code)
    return True


def targets_apply_provider_statuses(
    *, notification: Notification, messages: Iterable[ProviderMessage], error_code: str = ""
) -> None:
    """Write the messages' provider statuses into ``notification.resolved_targets`` (the
    caller holds the row's lock)."""
    by_id = {message.provider_id: message for message in messages}
    targets = notification.resolved_targets if isinstance(notification.resolved_targets, list) else []
    changed = False
    for entry in targets:
        message = by_id.get(str(entry.get("provider_id"))) if isinstance(entry, dict) else None
        if message is None or not message.provider_status:
            continue
        if entry.get("provider_status") == message.provider_status and entry.get("provider_status_at"):
            continue
        entry["provider_status"] = message.provider_status
        entry["provider_status_at"] = message.provider_status_at.isoformat() if message.provider_status_at else None
        if error_code:
            entry["provider_error_code"] = error_code
        changed = True
    if changed:
        Notification.objects.filter(pk=notification.pk).update(resolved_targets=targets)


def provider_statuses_reapply(*, notification_ids: Iterable[Any]) -> None:
    """After a delivery wrote a fresh ``resolved_targets`` snapshot, put back the provider
    statuses callbacks recorded meanwhile (the snapshot was taken before them)."""
    messages = list(
        ProviderMessage.objects.filter(notification_id__in=list(notification_ids)).exclude(provider_status="")
    )
    if not messages:
        return
    by_notification: dict[Any, list[ProviderMessage]] = {}
    for message in messages:
        by_notification.setdefault(message.notification_id, []).append(message)
    for notification in Notification.objects.select_for_update().filter(pk__in=list(by_notification)):
        targets_apply_provider_statuses(notification=notification, messages=by_notification[notification.pk])


def provider_error_code(entry: dict[str, Any]) -> str:
    """The provider's error code of one target, as text ("" when none): the one its status
    callback reported last (``ErrorCode``, e.g. 30003 unreachable), else the one it refused the
    message with (e.g. 21211 invalid number)."""
    code = entry.get("provider_error_code") or entry.get("provider_code")
    return "" if code in (None, "") else str(code)


def notification_targets(notification: Any, *, staff: bool = False) -> list[dict[str, Any]]:
    """The status record's ``targets``: channel, target, outcome and provider status (with its
    time and error code, when there are) of each target, from the notification's
    ``resolved_targets``. The target is the stored form (secrets masked) for ``staff``, else
    what a site may see of it (``o***@example.com``, a host …:
    notifications.channel_targets.target_site_masked)."""
    targets = getattr(notification, "resolved_targets", None)
    if not isinstance(targets, list):
        return []
    records = []
    for entry in targets:
        if not isinstance(entry, dict) or "target" not in entry:
            continue
        channel = entry.get("channel", notification.type)
        record = {
            "channel": channel,
            "target": entry["target"] if staff else target_site_masked(channel=channel, target=entry["target"]),
            "outcome": target_outcome(entry),
            "provider_status": entry.get("provider_status"),
        }
        if entry.get("provider_status_at"):
            record["provider_status_at"] = entry["provider_status_at"]
        code = provider_error_code(entry)
        if code:
            record["provider_error_code"] = code
        records.append(record)
    return records


class TwilioStatusCallbackView(APIView):
    """Twilio's message status callback. Authenticated by Twilio's signature, not a site key."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    parser_classes = [FormParser]
    throttle_classes: list[Any] = []
    schema = None  # Twilio's interface, not ours: left out of the OpenAPI document

    def post(self, request: Request) -> Response:
        params = {key: request.POST.get(key, "") for key in request.POST}
        base = settings.OUTBOX_PUBLIC_URL
        url = base + request.get_full_path() if base else request.build_absolute_uri()
        if not twilio_signature_valid(url=url, params=params, signature=request.headers.get("X-Twilio-Signature", "")):
            return Response(
                {"error": "forbidden", "detail": "Missing or invalid X-Twilio-Signature."},
                status=http_status.HTTP_403_FORBIDDEN,
            )
        sid = params.get("MessageSid") or params.get("SmsSid") or ""
        status_value = params.get("MessageStatus") or params.get("SmsStatus") or ""
        problems = {}
        if not sid:
            problems["MessageSid"] = ["Required."]
        if status_value not in TWILIO_STATUS_RANK:
            problems["MessageStatus"] = [f"Unknown status {status_value[:40]!r}."]
        if problems:
            return Response({"error": "invalid", "detail": "Invalid callback.", "errors": problems}, status=400)
        try:
            changed = provider_status_record(
                provider="twilio",
                provider_id=sid,
                provider_status=status_value,
                error_code=params.get("ErrorCode", "")[:16],
            )
        except CallbackRefused as refused:
            return Response({"error": "not_found", "detail": refused.message}, status=refused.status)
        return Response({"recorded": changed}, status=http_status.HTTP_200_OK)


def twiml(reply: str = "") -> HttpResponse:
    """A TwiML answer: one SMS back with ``reply``, or none for ""."""
    message = f"<Message>{escape(reply)}</Message>" if reply else ""
    document = f'<?xml version="1.0" encoding="UTF-8"?><Response>{message}</Response>'
    return HttpResponse(document, content_type="text/xml; charset=utf-8")


class TwilioInboundView(APIView):
    """Twilio's incoming message webhook: SMS replies (``ACK 4821``) acknowledge alarms
    (notifications.sms_replies). Authenticated by Twilio's signature like the status callback;
    always answered with TwiML (a short reply, or none), never an error a retry would repeat."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    parser_classes = [FormParser]
    throttle_classes: list[Any] = []
    schema = None  # Twilio's interface, not ours

    def post(self, request: Request) -> HttpResponse:
        params = {key: request.POST.get(key, "") for key in request.POST}
        base = settings.OUTBOX_PUBLIC_URL
        url = base + request.get_full_path() if base else request.build_absolute_uri()
        if not twilio_signature_valid(url=url, params=params, signature=request.headers.get("X-Twilio-Signature", "")):
            # Not from Twilio: refused (Twilio itself always signs), and never answered with an SMS.
            response = twiml()
            response.status_code = http_status.HTTP_403_FORBIDDEN
            return response
        outcome = sms_reply_handle(from_number=params.get("From", "")[:32], body=params.get("Body", "")[:1600])
        return twiml(outcome.reply)
