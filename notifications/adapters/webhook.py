"""Signed webhooks: POST the notification as JSON, signed per the Standard Webhooks
specification with the ``standardwebhooks`` library (docs/channels.md).

Headers: ``webhook-id`` (the notification id, stable across retries so a receiver can
de-duplicate), ``webhook-timestamp`` (Unix seconds of this attempt) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256>`` under the target's secret). A receiver verifies with
``standardwebhooks.Webhook(secret).verify(body, headers)``.
"""

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

from notifications.adapters.http import TargetOutcome, TargetsAdapter, TargetsSession, http_exception, http_failure
from notifications.channel_targets import Target
from notifications.models import Notification


def webhook_payload(notification: Notification) -> dict[str, Any]:
    return {
        "notification_id": str(notification.notification_id),
        "type": notification.type,
        "list_name": notification.list_name,
        "subject": notification.subject,
        "body": notification.body,
        "type_data": notification.type_data,
        "site_id": notification.source_site_id,
        "created_at": notification.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
    }


def webhook_signed(
    *, notification: Notification, secret: str, now: datetime | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one signed delivery."""
    body = json.dumps(webhook_payload(notification), separators=(",", ":"), ensure_ascii=False)
    now = now or datetime.now(UTC)
    message_id = str(notification.notification_id)
    signature = Webhook(secret).sign(msg_id=message_id, timestamp=now, data=body)
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    return body.encode(), headers


class WebhookSession(TargetsSession):
    channel = "webhook"

    def send_one(self, notification: Notification, target: Target) -> TargetOutcome:
        body, headers = webhook_signed(notification=notification, secret=target.secret)
        try:
            response = self.http.post(target.address, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return http_exception(exc)
        if response.is_success:
            return TargetOutcome("delivered", f"HTTP {response.status_code}", http_status=response.status_code)
        return http_failure(response)


class WebhookAdapter(TargetsAdapter):
    channel = "webhook"
    session_class = WebhookSession
