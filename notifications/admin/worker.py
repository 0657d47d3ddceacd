"""The workers in the console: their heartbeat (read-only), and django-q2's schedules,
restricted to the outbox's own tasks.

django-q2's own admin lets a superuser schedule any importable Python function (and a "hook"
function run after it): from the console, arbitrary code in the worker. Here a schedule may
only run one of the tasks the outbox declares (notifications.schedules), with no hook.
"""

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django_q.admin import ScheduleAdmin
from django_q.models import Schedule

from notifications.models import WorkerProcess
from notifications.schedules import schedule_functions_allowed


class OutboxScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = [
            "name",
            "func",
            "hook",
            "args",
            "kwargs",
            "schedule_type",
            "minutes",
            "repeats",
            "next_run",
            "cron",
            "cluster",
            "intended_date_kwarg",
        ]

    def clean_func(self) -> Any:
        func = (self.cleaned_data.get("func") or "").strip()
        allowed = schedule_functions_allowed()
        if func not in allowed:
            raise ValidationError(f"Only the outbox's own tasks can be scheduled: {', '.join(sorted(allowed))}.")
        return func

    def clean_hook(self) -> Any:
        if (self.cleaned_data.get("hook") or "").strip():
            raise ValidationError("A hook function cannot be set from the console.")
        return None


class OutboxScheduleAdmin(ScheduleAdmin):
    form = OutboxScheduleForm


if admin.site.is_registered(Schedule):
    admin.site.unregister(Schedule)
admin.site.register(Schedule, OutboxScheduleAdmin)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(admin.ModelAdmin):
    """Each worker task process as it last reported itself (notifications.workers): written by
    the workers only, so read-only here."""

    list_display = ("host", "pid", "cluster", "started_at", "last_seen_at", "last_action")
    list_filter = ("host", "cluster")
    ordering = ("-last_seen_at",)
    search_fields = ("host", "last_action")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
