"""Microsoft Teams through a Workflows webhook: one Adaptive Card per target (docs/channels.md).

The card has the subject as its title, the body as its text, ``type_data.facts`` as a fact
set and, when OUTBOX_PUBLIC_URL is set, a button opening the notification in the console and,
for a notification that asks for acknowledgement, an "Acknowledge" button opening its
acknowledgement page (docs/acknowledgement.md).
Answers are classified as every HTTP channel's (notifications.adapters.http).
"""

from typing import Any

import httpx
from django.conf import settings
from django.urls import reverse

from notifications.ack_links import ack_link
from notifications.adapters.http import TargetOutcome, TargetsAdapter, TargetsSession, http_exception, http_failure
from notifications.channel_targets import Target
from notifications.models import Notification

CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"


def console_link(notification: Notification) -> str | None:
    """The notification's page in the console, or None without OUTBOX_PUBLIC_URL."""
    base = settings.OUTBOX_PUBLIC_URL
    if not base:
        return None
    return base.rstrip("/") + reverse("admin:notifications_notification_change", args=[notification.pk])


def teams_facts(type_data: Any) -> list[dict[str, str]]:
    """``type_data.facts`` as Adaptive Card facts: an object (title → value) or a list of
    ``{"title", "value"}``; anything else gives no facts (ingest refuses it anyway)."""
    facts = type_data.get("facts") if isinstance(type_data, dict) else None
    if isinstance(facts, dict):
        return [{"title": str(title), "value": str(value)} for title, value in facts.items()]
    if isinstance(facts, list):
        return [
            {"title": str(fact.get("title", "")), "value": str(fact.get("value", ""))}
            for fact in facts
            if isinstance(fact, dict)
        ]
    return []


def teams_card(notification: Notification) -> dict[str, Any]:
    """The Workflows webhook message: one Adaptive Card attachment."""
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": notification.subject or "(no subject)",
            "weight": "Bolder",
            "size": "Medium",
            "wrap": True,
        },
    ]
    if notification.body:
        body.append({"type": "TextBlock", "text": notification.body, "wrap": True})
    facts = teams_facts(notification.type_data)
    if facts:
        body.append({"type": "FactSet", "facts": facts})
    content: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    actions = []
    acknowledge = ack_link(notification=notification, teams=True)
    if acknowledge:
        # Opens the confirmation page (a GET never acknowledges; the page's button does).
        actions.append({"type": "Action.OpenUrl", "title": "Acknowledge", "url": acknowledge})
    link = console_link(notification)
    if link:
        actions.append({"type": "Action.OpenUrl", "title": "Open in Outbox", "url": link})
    if actions:
        content["actions"] = actions
    return {
        "type": "message",
        "attachments": [{"contentType": CARD_CONTENT_TYPE, "contentUrl": None, "content": content}],
    }


class TeamsSession(TargetsSession):
    channel = "teams"

    def send_one(self, notification: Notification, target: Target) -> TargetOutcome:
        try:
            response = self.http.post(target.address, json=teams_card(notification))
        except httpx.HTTPError as exc:
            return http_exception(exc)
        if response.is_success:
            return TargetOutcome("delivered", f"HTTP {response.status_code}", http_status=response.status_code)
        return http_failure(response)


class TeamsAdapter(TargetsAdapter):
    channel = "teams"
    session_class = TeamsSession
