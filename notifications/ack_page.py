"""The acknowledgement page behind a link in a message: ``/ack/<token>/`` (docs/acknowledgement.md).

No console account is needed: the signed token is the permission, and it says which
notification and, for a message to one person, who. **A GET never acknowledges** — mail
scanners and link previews open links by themselves — it shows what the alarm was and a
button; the button's POST (with Django's CSRF protection) acknowledges. Expired and changed
tokens get a page saying so, with a 4xx status.

The token is in the path, so the page sends no Referer onwards and is not cached, and the logs
show ``/ack/[redacted]/`` (outbox_project.log_redaction).
"""

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from notifications import acknowledgement
from notifications.ack_links import TEAMS, AckToken, AckTokenInvalid, ack_token_read, recipient_matches
from notifications.channel_targets import text_site_masked
from notifications.models import AcknowledgedVia, Notification


class AckForm(forms.Form):
    name = forms.CharField(
        label="Your name",
        max_length=acknowledgement.MAX_BY_LENGTH,
        required=False,
        help_text="So that the others know who is on it.",
    )
    note = forms.CharField(
        label="Note (optional)",
        max_length=acknowledgement.MAX_NOTE_LENGTH,
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
    )

    def __init__(self, *args: Any, asks_name: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if asks_name:
            self.fields["name"].required = True
        else:
            del self.fields["name"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name in ("name", "note"):
            value = cleaned.get(name)
            if isinstance(value, str) and "\x00" in value:
                self.add_error(name, "Must not contain NUL characters.")
        return cleaned


def _recipient(token: AckToken, notification: Notification) -> str:
    """The recipient a one-person token is bound to, by matching the notification's targets
    (the token holds a digest, never the address); "" when none matches any more."""
    for entry in notification.resolved_targets if isinstance(notification.resolved_targets, list) else []:
        target = entry.get("target") if isinstance(entry, dict) else None
        if isinstance(target, str) and recipient_matches(token, target):
            return target
    return ""


def _page(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    response = render(request, f"ack/{template}", context, status=status)
    # The token is in this page's URL: never sent to another site as a Referer, never kept by a
    # cache. (Not "no-referrer": browsers then send "Origin: null" with the form, which Django's
    # CSRF check rightly refuses; to this server the Referer is redacted in the logs.)
    response["Referrer-Policy"] = "same-origin"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


def _already(notification: Notification) -> dict[str, Any]:
    """Who acknowledged it, as the page shows them: an address or a number masked (the page is
    open to anyone holding a link, who may not see the other members of a list)."""
    return {
        "by": text_site_masked(notification.acknowledged_by),
        "via": AcknowledgedVia(notification.acknowledged_via).label if notification.acknowledged_via else "",
        "at": notification.acknowledged_at,
        "note": notification.acknowledged_note,
    }


@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def ack_page(request: HttpRequest, token: str) -> HttpResponse:
    """GET: the confirmation page (never acknowledges). POST: acknowledge, then say so (or who
    already did)."""
    try:
        content = ack_token_read(token)
    except AckTokenInvalid as invalid:
        template = "expired.html" if invalid.expired else "invalid.html"
        return _page(request, template, {}, status=410 if invalid.expired else 400)
    notification = Notification.objects.filter(pk=content.notification_id).first()
    if notification is None:
        return _page(request, "invalid.html", {"gone": True}, status=404)
    recipient = "" if content.asks_name else _recipient(content, notification)
    asks_name = content.asks_name or not recipient
    context: dict[str, Any] = {"notification": notification, "asks_name": asks_name}
    if notification.acknowledged_at is not None:
        return _page(request, "done.html", {**context, "already": _already(notification), "fresh": False})
    form = AckForm(request.POST if request.method == "POST" else None, asks_name=asks_name)
    if request.method != "POST" or not form.is_valid():
        return _page(request, "confirm.html", {**context, "form": form}, status=400 if form.errors else 200)
    outcome = acknowledgement.acknowledge(
        notification.pk,
        via=AcknowledgedVia.TEAMS if content.bound_to == TEAMS else AcknowledgedVia.LINK,
        by=form.cleaned_data.get("name") or recipient,
        note=form.cleaned_data.get("note", ""),
    )
    acknowledged = outcome.notification or notification
    return _page(request, "done.html", {**context, "already": _already(acknowledged), "fresh": outcome.changed})
