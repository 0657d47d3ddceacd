"""The notification page's acknowledgement parts (docs/console.md): the timeline of the row's
history in words, the acknowledgement and clearing as recorded, and the Acknowledge action
(with an optional note) for anyone who may view notifications."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from notifications import acknowledgement
from notifications.admin.common import missing_object_redirect
from notifications.console_time import console_time
from notifications.models import AcknowledgedVia, Notification
from notifications.timeline import notification_timeline


class AcknowledgeForm(forms.Form):
    note = forms.CharField(
        label="Note",
        max_length=acknowledgement.MAX_NOTE_LENGTH,
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Optional: what you are doing about it. Kept with the acknowledgement, your name and the time.",
    )


def _change_url(notification_id: Any) -> str:
    return reverse("admin:notifications_notification_change", args=[notification_id])


class AcknowledgementAdmin(admin.ModelAdmin):
    """Mixed into the notification admin."""

    def has_acknowledge_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may view notifications may say they have seen one."""
        return self.has_view_permission(request, obj)

    @admin.display(description="history")
    def timeline_display(self, obj: Notification) -> SafeString:
        rows = []
        for event in notification_timeline(obj):
            when = console_time(event.at)  # in the console's chosen zone, as every timestamp
            text: SafeString | str = event.text
            if event.notification_id:
                text = format_html('{} (<a href="{}">open</a>)', event.text, _change_url(event.notification_id))
            details = format_html_join("", "<li>{}</li>", ((line,) for line in event.details))
            rows.append(
                format_html(
                    '<li class="outbox-event outbox-event-{}"><time>{}</time> {}{}</li>',
                    event.kind,
                    when,
                    text,
                    format_html("<ul>{}</ul>", details) if event.details else "",
                )
            )
        return format_html('<ol class="outbox-timeline" id="timeline">{}</ol>', SafeString("".join(rows)))

    @admin.display(description="acknowledgement")
    def acknowledgement_display(self, obj: Notification) -> str:
        if obj.acknowledged_at is None:
            return "Asked for; not acknowledged yet" if obj.asks_ack else "Not asked for; not acknowledged"
        via = AcknowledgedVia(obj.acknowledged_via).label if obj.acknowledged_via in AcknowledgedVia.values else ""
        text = f"By {obj.acknowledged_by} via {via} at {console_time(obj.acknowledged_at)}"
        return text + (f". Note: {obj.acknowledged_note}" if obj.acknowledged_note else "")

    @admin.display(description="cleared")
    def cleared_display(self, obj: Notification) -> str:
        if obj.cleared_at is None:
            return "—"
        text = f"At {console_time(obj.cleared_at)}: the alarm returned to normal at the site"
        return text + (f". Note: {obj.cleared_note}" if obj.cleared_note else "")

    def acknowledge_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """GET: the form with an optional note; POST: acknowledge as the user (via console)."""
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return missing_object_redirect(self, request, object_id)
        if not self.has_acknowledge_permission(request, obj):
            raise PermissionDenied
        form = AcknowledgeForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            outcome = acknowledgement.acknowledge(
                obj.pk,
                via=AcknowledgedVia.CONSOLE,
                by=request.user.get_username(),
                note=form.cleaned_data["note"],
                user=request.user,
            )
            if outcome.changed:
                self.message_user(request, "Acknowledged.", messages.SUCCESS)
            elif outcome.notification is not None:
                row = outcome.notification
                self.message_user(
                    request,
                    f"Already acknowledged by {row.acknowledged_by} at {console_time(row.acknowledged_at)}.",
                    messages.WARNING,
                )
            return HttpResponseRedirect(_change_url(obj.pk))
        context = {
            **self.admin_site.each_context(request),
            "title": "Acknowledge notification",
            "opts": self.opts,
            "original": obj,
            "form": form,
        }
        return TemplateResponse(request, "admin/notifications/notification/acknowledge.html", context)
