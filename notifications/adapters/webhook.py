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

from notifications.adapters.base import Adapter
from notifications.adapters.http import TargetOutcome, TargetsSession, http_exception, http_failure
from notifications.adapters.teams import channel_timeout
from notifications.backoff import RetryTiming
from notifications.channel_targets import Target, targets_resolve
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


class WebhookAdapter(Adapter):
    channel = "webhook"

    def default_timing(self) -> RetryTiming:
        return RetryTiming(strategy="exponential", interval_seconds=30, max_interval_seconds=3600, max_attempts=10)

    def endpoint(self) -> str | None:
        # One breaker for all of the channel's receivers (see docs/channels.md).
        return self.channel

    def resolve_targets(self, *, list_names: set[str]) -> dict[str, list[str]]:
        return targets_resolve(channel=self.channel, list_names=list_names)

    def open_session(self) -> "WebhookSession":
        return WebhookSession(timeout=channel_timeout(self.channel))


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
