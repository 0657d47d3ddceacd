"""Silences and maintenance windows in the console (docs/suppression.md).

A silence is set from its own page or from a notification's page ("Silence this source / this
site / this list for 30 min, 2 h, until tomorrow 06:00": links to the add form filled in). An
ended silence that suppressed notifications offers to deliver them anyway."""

from datetime import datetime, timedelta
from datetime import time as dt_time
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from notifications.console_time import console_time
from notifications.models import MaintenanceWindow, Notification, Silence
from notifications.operations import notification_release
from notifications.suppression import (
    SILENCE_MATCHERS,
    flood_report,
    silence_end,
    silence_problems,
    silence_suppressed,
)

# The presets a notification's page offers: label → how long (None: until tomorrow 06:00 in the
# console's zone).
PRESETS: dict[str, timedelta | None] = {"30 min": timedelta(minutes=30), "2 h": timedelta(hours=2), "until 06:00": None}
PRESET_KEYS = {"30m": "30 min", "2h": "2 h", "morning": "until 06:00"}


def preset_end(key: str, *, now: datetime) -> datetime | None:
    """The end of preset ``key`` ("30m", "2h", "morning": tomorrow 06:00 on the console's
    zone's wall clock) from ``now``; None for an unknown key."""
    label = PRESET_KEYS.get(key)
    if label is None:
        return None
    length = PRESETS[label]
    if length is not None:
        return now + length
    local = timezone.localtime(now)
    tomorrow = local.date() + timedelta(days=1)
    return datetime.combine(tomorrow, dt_time(6, 0), tzinfo=timezone.get_current_timezone())


def silence_links(notification: Notification) -> list[tuple[str, str]]:
    """(label, URL of the add form filled in) for silencing this notification's source, site
    or list with each preset."""
    scopes = [
        ("this source", {"site": notification.source_site_id, "source_instance_id": notification.source_instance_id}),
        ("this site", {"site": notification.source_site_id}),
        ("this list", {"list_name": notification.list_name}),
    ]
    add = reverse("admin:notifications_silence_add")
    links = []
    for scope, matchers in scopes:
        if scope == "this source" and not notification.source_instance_id:
            continue
        for key, label in PRESET_KEYS.items():
            query = urlencode({**matchers, "preset": key, "reason": f"Silenced from {notification.pk}"})
            links.append(
                (
                    f"Silence {scope} for {label}" if label != "until 06:00" else f"Silence {scope} {label}",
                    f"{add}?{query}",
                )
            )
    return links


class SilenceForm(forms.ModelForm):
    class Meta:
        model = Silence
        fields = (*SILENCE_MATCHERS, "starts_at", "ends_at", "reason", "include_high", "include_critical")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The admin's split date and time inputs have no label of their own: name each one.
        for name, words in (("starts_at", "starts"), ("ends_at", "ends")):
            parts = getattr(self.fields[name].widget, "widgets", [])
            for part, unit in zip(parts, ("date", "time"), strict=False):
                part.attrs.setdefault("aria-label", f"{words}: {unit}")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        starts_at, ends_at = cleaned.get("starts_at"), cleaned.get("ends_at")
        if starts_at is None or ends_at is None:
            return cleaned
        problems = silence_problems(
            matchers={name: cleaned.get(name) or "" for name in SILENCE_MATCHERS},
            starts_at=starts_at,
            ends_at=ends_at,
            reason=cleaned.get("reason") or "",
            now=timezone.now() if self.instance.pk is None else min(timezone.now(), starts_at),
        )
        for name, errors in problems.items():
            self.add_error(None if name == "non_field_errors" else name, errors)
        return cleaned


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    form = SilenceForm
    list_display = ("__str__", "reason", "starts_column", "ends_column", "state", "suppressed_column", "created_by")
    list_filter = ("include_high", "include_critical")
    search_fields = ("site", "list_name", "source_instance_id", "subject_contains", "reason")
    actions = ["end_selected", "release_suppressed"]
    readonly_fields = ("created_by", "created_at")

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        now = timezone.now()
        initial.setdefault("starts_at", now)
        end = preset_end(request.GET.get("preset", ""), now=now)
        if end is not None:
            initial["ends_at"] = end
        initial.pop("preset", None)
        return initial

    def save_model(self, request: HttpRequest, obj: Silence, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user.get_username()[:150]
        super().save_model(request, obj, form, change)

    @admin.display(description="starts")
    def starts_column(self, obj: Silence) -> str:
        return console_time(obj.starts_at)

    @admin.display(description="ends")
    def ends_column(self, obj: Silence) -> str:
        return console_time(obj.ends_at)

    @admin.display(description="state")
    def state(self, obj: Silence) -> str:
        now = timezone.now()
        if obj.ends_at <= now:
            return "ended"
        return "active" if obj.starts_at <= now else "to come"

    @admin.display(description="suppressed")
    def suppressed_column(self, obj: Silence) -> str:
        """How many rows it holds Suppressed; once ended, a link to them (to deliver them anyway)."""
        count = silence_suppressed(obj.pk).count()
        if not count:
            return "0"
        url = reverse("admin:notifications_notification_changelist")
        query = urlencode({"status": Notification.Status.SUPPRESSED, "suppressed_by": f"silence:{obj.pk}"})
        words = "deliver anyway?" if obj.ends_at <= timezone.now() else "see them"
        return format_html('<a href="{}?{}">{} ({})</a>', url, query, count, words)

    @admin.action(description="End selected silences now", permissions=["delete"])
    def end_selected(self, request: HttpRequest, queryset: QuerySet[Silence]) -> None:
        ended = sum(silence_end(silence=silence) for silence in queryset)
        self.message_user(request, f"Ended {ended} silence(s); skipped {queryset.count() - ended} already over.")

    @admin.action(description="Deliver anyway what the selected silences suppressed", permissions=["release"])
    def release_suppressed(self, request: HttpRequest, queryset: QuerySet[Silence]) -> None:
        ids = [pk for silence in queryset for pk in silence_suppressed(silence.pk).values_list("pk", flat=True)]
        result = notification_release(notification_ids=ids, user=request.user)
        self.message_user(
            request,
            f"Released {result.changed} notification(s) to be delivered; skipped {result.skipped}.",
            messages.SUCCESS if result.changed else messages.WARNING,
        )

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("notifications.retry_notification"))


class MaintenanceWindowForm(forms.ModelForm):
    days = forms.TypedMultipleChoiceField(
        choices=[(0, "Mon"), (1, "Tue"), (2, "Wed"), (3, "Thu"), (4, "Fri"), (5, "Sat"), (6, "Sun")],
        coerce=int,
        widget=forms.CheckboxSelectMultiple,
        help_text="The days it starts on; a window whose end is not after its start runs past midnight.",
    )

    class Meta:
        model = MaintenanceWindow
        fields = ("site", "days", "starts", "ends", "time_zone", "reason", "include_high", "include_critical")

    def clean_time_zone(self) -> str:
        name = str(self.cleaned_data["time_zone"]).strip()
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise forms.ValidationError(f"{name!r} is not an IANA time zone (e.g. Europe/Berlin).") from None
        return name


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    form = MaintenanceWindowForm
    list_display = ("site", "__str__", "days_column", "reason")
    list_filter = ("site",)

    @admin.display(description="days")
    def days_column(self, obj: MaintenanceWindow) -> str:
        names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
        return ", ".join(names[int(day)] for day in sorted(obj.days))


def flood_report_page(model_admin: Any, request: HttpRequest) -> TemplateResponse:
    """The flood report (docs/suppression.md#the-flood-report): alarms per list per 10 minutes
    against ISA-18.2's benchmark, and the top sources over 24 h and 7 days, each with a
    one-click silence (the add form, filled in for 2 hours)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    report = flood_report()
    add = reverse("admin:notifications_silence_add")
    can_silence = request.user.has_perm("notifications.add_silence")
    for period in ("top_sources_24h", "top_sources_7d"):
        for entry in report[period]:
            query = {"site": entry["site"], "preset": "2h", "reason": "Chattering source (flood report)"}
            if entry["source_instance_id"]:
                query["source_instance_id"] = entry["source_instance_id"]
            entry["silence_url"] = f"{add}?{urlencode(query)}" if can_silence else ""
    for entry in report["lists_24h"]:
        entry["over"] = entry["max_per_10_min"] > report["benchmark_per_10_min"]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Flood report",
        "opts": model_admin.opts,
        "report": report,
    }
    return TemplateResponse(request, "admin/notifications/flood_report.html", context)
