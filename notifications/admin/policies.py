"""Delivery policies (one per channel) and channel health (the circuit breakers), in the console.

Policies are configuration (Administrators edit them). Channel health is the workers' shared
state: read-only here, except "Probe now", which lets an open endpoint be probed at once (or
closes one that nothing would be sent to), and "Close…", which closes endpoints with a reason
(an endpoint no longer configured is removed). Both are recorded in the history.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from notifications.health import channel_endpoints, channel_health_close, channel_health_probe_now
from notifications.models import ChannelHealth, DeliveryPolicy, Notification
from notifications.policies import POLICY_FIELDS, delivery_policies_all, delivery_policy_validate
from notifications.trigger import dispatch_request
from notifications.vocabulary import CHANNEL_FAILURES, FailureClass


class DeliveryPolicyForm(forms.ModelForm):
    retry_on = forms.MultipleChoiceField(
        choices=FailureClass.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Failure classes that are retried; the others park at once.",
    )

    park_channel_failures = forms.BooleanField(
        required=False,
        label="Park at once on channel failures",
        help_text="Needed only when connection, timeout, authentication or throttled is not retried: "
        "an outage of the channel then parks every row it touches as a permanent failure.",
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
        unticked = [
            str(label)
            for value, label in FailureClass.choices
            if value in CHANNEL_FAILURES and value not in (cleaned.get("retry_on") or [])
        ]
        if unticked and "retry_on" in cleaned and not cleaned.get("park_channel_failures"):
            self.add_error(
                "retry_on",
                f"Not retried: {', '.join(unticked)}. An outage of the channel would park every row it "
                "touches at once as a permanent failure. Tick them, or confirm with "
                "“Park at once on channel failures”.",
            )
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
        ("Giving up", {"fields": ("retry_on", "park_channel_failures", "max_age_seconds")}),
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

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """A new policy starts from the policy in force for the chosen channel (``?channel=``,
        else the first channel without a stored policy) — its timing and retried classes —
        never from bare field defaults that retry nothing."""
        initial = super().get_changeform_initial_data(request)
        in_force = delivery_policies_all()
        channel = str(initial.get("channel") or "")
        if channel not in in_force:
            channel = next((name for name, policy in in_force.items() if not policy.stored), "")
        if channel:
            initial.update(in_force[channel].as_dict(), channel=channel)
        return initial

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, {**(extra_context or {}), **_in_force()})

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {**(extra_context or {}), **_in_force()})


def _in_force() -> dict[str, Any]:
    """The policy each channel is delivered with now, for the policy pages' table."""
    rows = []
    for channel, policy in delivery_policies_all().items():
        values = policy.as_dict()
        rows.append({"channel": channel, "stored": policy.stored, **values, "retry_on": ", ".join(values["retry_on"])})
    return {"policies_in_force": rows, "policy_add_url": reverse("admin:notifications_deliverypolicy_add")}


class CloseEndpointsForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=2000,
        help_text='Why the endpoint is closed (e.g. "relay replaced by smtp2"); recorded in its history.',
    )


@admin.register(ChannelHealth)
class ChannelHealthAdmin(admin.ModelAdmin):
    list_display = (
        "channel",
        "endpoint",
        "configured",
        "state",
        "opened_at",
        "consecutive_failures",
        "last_failure_class",
        "last_error_excerpt",
        "probe_after",
        "probes",
        "waiting",
    )
    readonly_fields = [field.name for field in ChannelHealth._meta.fields]
    actions = ["probe_now", "close_endpoints"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The row is the workers' state; "change" permits only the Probe now and Close actions.
        return obj is None and super().has_change_permission(request, obj)

    def has_probe_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifications.change_channelhealth")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Read once per page: each channel's configured endpoint and its waiting rows.
        self._endpoints = channel_endpoints()
        self._waiting: dict[str, int] = {}
        return super().changelist_view(request, extra_context)

    def _current(self, obj: ChannelHealth) -> bool:
        endpoints = getattr(self, "_endpoints", None) or channel_endpoints()
        return endpoints.get(obj.channel) == obj.endpoint

    @admin.display(description="configured", boolean=True)
    def configured(self, obj: ChannelHealth) -> bool:
        return self._current(obj)

    @admin.display(description="rows waiting")
    def waiting(self, obj: ChannelHealth) -> int:
        # A channel delivers through its one configured endpoint: the channel's open rows wait for
        # that endpoint, and none for an endpoint no longer configured.
        if not self._current(obj):
            return 0
        cache = getattr(self, "_waiting", {})
        if obj.channel not in cache:
            cache[obj.channel] = Notification.objects.filter(
                status__in=Notification.NON_TERMINAL, type=obj.channel
            ).count()
        return cache[obj.channel]

    @admin.display(description="last error")
    def last_error_excerpt(self, obj: ChannelHealth) -> str:
        text = " ".join(obj.last_error.split())
        return text if len(text) <= 80 else text[:80] + "…"

    @admin.action(description="Probe selected open channels now", permissions=["probe"])
    def probe_now(self, request: HttpRequest, queryset: QuerySet[ChannelHealth]) -> None:
        result = channel_health_probe_now(health_ids=queryset.values_list("pk", flat=True), user=request.user)
        if result.probing:
            transaction.on_commit(dispatch_request)
            count = len(result.probing)
            self.message_user(
                request,
                f"{count} open endpoint{'s' if count != 1 else ''} will be probed by the next dispatch "
                f"({', '.join(result.probing)}).",
                messages.SUCCESS,
            )
        for closed in result.closed:
            self.message_user(request, f"Closed instead of probed: {closed}.", messages.SUCCESS)
        if not result.probing and not result.closed:
            self.message_user(request, "None of the selected endpoints is open: nothing to probe.", messages.WARNING)

    @admin.action(description="Close selected endpoints… (needs a reason)", permissions=["probe"])
    def close_endpoints(self, request: HttpRequest, queryset: QuerySet[ChannelHealth]) -> HttpResponse | None:
        ids = list(queryset.values_list("pk", flat=True))
        form = CloseEndpointsForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            count = channel_health_close(health_ids=ids, reason=form.cleaned_data["reason"], user=request.user)
            transaction.on_commit(dispatch_request)  # rows waiting for a closed endpoint are due again
            self.message_user(
                request,
                f"Closed {count} endpoint{'s' if count != 1 else ''}; those no longer configured were removed.",
                messages.SUCCESS,
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Close channel endpoints?",
            "opts": self.opts,
            "ids": ids,
            "rows": [(row, self._current(row)) for row in ChannelHealth.objects.filter(pk__in=ids)],
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/notifications/channelhealth/close_confirmation.html", context)
