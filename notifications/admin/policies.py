"""Delivery policies (one per channel) and channel health (the circuit breakers), in the console.

Policies are configuration (Administrators edit them). Channel health is the workers' shared
state: read-only here, except "Probe now", which lets an open channel be probed at once.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from notifications.clock import database_now
from notifications.models import ChannelHealth, DeliveryPolicy
from notifications.policies import POLICY_FIELDS, delivery_policy_validate
from notifications.vocabulary import FailureClass


class DeliveryPolicyForm(forms.ModelForm):
    retry_on = forms.MultipleChoiceField(
        choices=FailureClass.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Failure classes that are retried; the others park at once.",
    )

    class Meta:
        model = DeliveryPolicy
        fields = ["channel", *POLICY_FIELDS]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        values = {name: cleaned[name] for name in POLICY_FIELDS if cleaned.get(name) is not None}
        for name, problem in delivery_policy_validate(values=values).items():
            if name in self.fields and name not in self.errors:
                self.add_error(name, problem[:1].upper() + problem[1:])
        return cleaned


@admin.register(DeliveryPolicy)
class DeliveryPolicyAdmin(admin.ModelAdmin):
    form = DeliveryPolicyForm
    list_display = ("channel", "strategy", "interval_seconds", "max_attempts", "max_age_seconds", "rate_per_minute")
    fieldsets = (
        (None, {"fields": ("channel",)}),
        (
            "Retry timing",
            {"fields": ("strategy", "interval_seconds", "max_interval_seconds", "jitter", "max_attempts")},
        ),
        ("Giving up", {"fields": ("retry_on", "max_age_seconds")}),
        (
            "Channel health",
            {
                "fields": (
                    "breaker_threshold",
                    "breaker_cooldown_seconds",
                    "breaker_max_cooldown_seconds",
                    "rate_per_minute",
                )
            },
        ),
    )


@admin.register(ChannelHealth)
class ChannelHealthAdmin(admin.ModelAdmin):
    list_display = (
        "channel",
        "endpoint",
        "state",
        "opened_at",
        "consecutive_failures",
        "last_failure_class",
        "last_error_excerpt",
        "probe_after",
        "probes",
    )
    readonly_fields = [field.name for field in ChannelHealth._meta.fields]
    actions = ["probe_now"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The row is the workers' state; "change" permits only the Probe now action.
        return obj is None and super().has_change_permission(request, obj)

    def has_probe_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifications.change_channelhealth")

    @admin.display(description="last error")
    def last_error_excerpt(self, obj: ChannelHealth) -> str:
        text = " ".join(obj.last_error.split())
        return text if len(text) <= 80 else text[:80] + "…"

    @admin.action(description="Probe selected open channels now", permissions=["probe"])
    def probe_now(self, request: HttpRequest, queryset: QuerySet[ChannelHealth]) -> None:
        count = queryset.exclude(state=ChannelHealth.State.CLOSED).update(probe_after=database_now())
        self.message_user(
            request,
            f"{count} open channel{'s' if count != 1 else ''} will be probed by the next dispatch.",
            messages.SUCCESS if count else messages.WARNING,
        )
