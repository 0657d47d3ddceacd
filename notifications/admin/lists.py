"""Notification lists and their email recipients. Names follow notifications.list_names (stored
trimmed in NFC, compared ignoring case, look-alikes refused); addresses ignore case.

List tools (notifications.list_tools): "Who would receive" (each channel's resolved targets,
for anyone who may view lists, Operators included), "Send a test notification" (through the
ingest path) and "Add many addresses" (a textarea on the list's form, checked line by line)."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from notifications.admin.channels import CHANNEL_INLINES
from notifications.admin.common import SecretsUndecryptableExplained, missing_object_redirect
from notifications.email_address import email_address_problem
from notifications.escalation import escalation_problems, lists_escalation_stored
from notifications.list_names import list_name_normalize, list_name_problem, notification_list_clash
from notifications.list_tools import (
    TEST_SUBJECT_PREFIX,
    TestNotificationError,
    address_pasted,
    addresses_parse,
    list_add_addresses,
    list_recipients_preview,
    list_send_test,
)
from notifications.models import EmailRecipient, NotificationList
from notifications.vocabulary import ADAPTER_PATHS

# A list's suppression settings (docs/suppression.md).
SUPPRESSION_FIELDS = ("dedup_window_seconds", "flood_threshold", "flood_window_seconds")


class NotificationListForm(forms.ModelForm):
    add_addresses = forms.CharField(
        required=False,
        label="Add many addresses",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "placeholder": "one address per line"}),
        help_text="Paste addresses, one per line (commas also separate). Each line is checked; "
        "addresses already in the list are skipped.",
    )

    class Meta:
        model = NotificationList
        fields = (
            "name",
            "description",
            "recipient_mode",
            "resend_after_local_delivery",
            "ack_required_from",
            "escalation",
            "repeat_last_every_seconds",
            *SUPPRESSION_FIELDS,
        )
        widgets = {
            "recipient_mode": forms.RadioSelect,
            "escalation": forms.Textarea(
                attrs={
                    "rows": 4,
                    "cols": 80,
                    "placeholder": '[{"after_seconds": 300, "list": "Shift-Leads", "type": "sms"}]',
                }
            ),
        }
        help_texts = {
            "escalation": "Steps in JSON, in order: when a notification that asks for acknowledgement is neither "
            "acknowledged nor cleared after_seconds after it was created, a copy goes to that list by that channel "
            "(email, teams, webhook, sms, apprise). Each step counts from the creation, so after_seconds increase. "
            "Empty: no escalation.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A form posted without them (a script, an older page) keeps the list's values; the
        # suppression settings left out (or blank) keep theirs too.
        for name in ("ack_required_from", "repeat_last_every_seconds", *SUPPRESSION_FIELDS):
            if name in self.fields:
                self.fields[name].required = False

    def clean_ack_required_from(self) -> str:
        return self.cleaned_data.get("ack_required_from") or self.instance.ack_required_from

    def clean_repeat_last_every_seconds(self) -> int:
        value = self.cleaned_data.get("repeat_last_every_seconds")
        return self.instance.repeat_last_every_seconds if value is None else value

    def clean_escalation(self) -> Any:
        return self.cleaned_data.get("escalation") or []  # a blank field: no steps

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "escalation" not in cleaned or "repeat_last_every_seconds" not in cleaned:
            return cleaned  # a field error already says what is wrong
        stored = lists_escalation_stored()
        if self.instance.pk:
            stored.steps.pop(self.instance.name, None)  # this list's steps are the form's
        problems = escalation_problems(
            steps=cleaned["escalation"],
            repeat_last_every_seconds=cleaned["repeat_last_every_seconds"],
            list_name=cleaned.get("name") or self.instance.name,
            lists=stored.steps,
            channels_of=stored.channels,
        )
        for problem in problems:
            field = "repeat_last_every_seconds" if problem.startswith("repeat_last_every_seconds") else "escalation"
            self.add_error(field, problem)
        return cleaned

    def _clean_setting(self, name: str) -> int:
        value = self.cleaned_data.get(name)
        if value is None:
            default = NotificationList._meta.get_field(name).default  # type: ignore[union-attr]
            return int(getattr(self.instance, name, default) if self.instance.pk else default)
        return int(value)

    def clean_dedup_window_seconds(self) -> int:
        return self._clean_setting("dedup_window_seconds")

    def clean_flood_threshold(self) -> int:
        return self._clean_setting("flood_threshold")

    def clean_flood_window_seconds(self) -> int:
        return self._clean_setting("flood_window_seconds")

    def clean_name(self) -> str:
        name = list_name_normalize(self.cleaned_data["name"])
        problem = list_name_problem(name)
        if problem:
            raise ValidationError(problem)
        clash = notification_list_clash(name=name, exclude_pk=self.instance.pk)
        if clash is not None:
            raise ValidationError(f"A list named {clash.name!r} already exists (list names ignore case).")
        return name

    def clean_add_addresses(self) -> list[str]:
        addresses, problems = addresses_parse(self.cleaned_data.get("add_addresses") or "")
        if problems:
            raise ValidationError(problems)
        return addresses


class TestNotificationForm(forms.Form):
    """``channels``: the channels the list has targets on, the only ones offered."""

    channel = forms.ChoiceField(choices=[(name, name) for name in sorted(ADAPTER_PATHS)])
    subject = forms.CharField(max_length=200, help_text=f"Sent with “{TEST_SUBJECT_PREFIX.strip()}” in front.")
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "cols": 60}), max_length=10_000)

    def __init__(self, *args: Any, channels: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["channel"].choices = [(name, name) for name in channels]  # type: ignore[attr-defined]
        self.fields["channel"].help_text = "Only the channels this list has recipients or targets on."


class EmailRecipientForm(forms.ModelForm):
    # A CharField first: "Robert Ito <r.ito@example.com>" pasted from a mail program is
    # reduced to its address before the address is checked.
    email = forms.CharField(max_length=400, required=False)

    class Meta:
        model = EmailRecipient
        fields = ("email",)

    def clean_email(self) -> str:
        address = address_pasted(self.cleaned_data.get("email") or "")
        if address:
            validate_email(address)
        return address


class EmailRecipientFormSet(forms.BaseInlineFormSet):
    def add_fields(self, form: "forms.ModelForm[Any]", index: int | None) -> None:
        # A tabular inline has one column heading and no per-row <label>: name each field for
        # screen readers.
        super().add_fields(form, index)
        form.fields["email"].widget.attrs.setdefault("aria-label", "Email address")
        if "DELETE" in form.fields:
            form.fields["DELETE"].widget.attrs.setdefault("aria-label", "Remove this recipient")

    def clean(self) -> None:
        super().clean()
        seen: set[str] = set()
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or form.cleaned_data.get("DELETE"):
                continue
            email = (form.cleaned_data.get("email") or "").strip().lower()
            if not email:
                continue
            problem = email_address_problem(email)
            if problem:
                form.add_error("email", problem)
                continue
            if email in seen:
                form.add_error("email", f"{email} is already in this list (addresses ignore case).")
            seen.add(email)


class EmailRecipientInline(admin.TabularInline):
    model = EmailRecipient
    form = EmailRecipientForm
    formset = EmailRecipientFormSet
    extra = 1
    fields = ("email",)


@admin.register(NotificationList)
class NotificationListAdmin(SecretsUndecryptableExplained):
    form = NotificationListForm
    inlines = [EmailRecipientInline, *CHANNEL_INLINES]
    list_display = ("name", "recipient_count", "recipient_mode", "description")
    list_filter = ("recipient_mode",)
    search_fields = ("name", "email_recipients__email")

    def get_queryset(self, request: HttpRequest) -> QuerySet[NotificationList]:
        return super().get_queryset(request).annotate(recipient_count=Count("email_recipients"))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if not self.has_change_permission(request, obj) and "add_addresses" in fields:
            fields.remove("add_addresses")  # view-only: nothing to paste into
        return fields

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        pasted = form.cleaned_data.get("add_addresses") or []
        if pasted:
            added, already = list_add_addresses(notification_list=form.instance, addresses=pasted)
            said = f"Added {len(added)} address{'es' if len(added) != 1 else ''} to {form.instance.name}."
            if already:
                said += f" Already in the list, skipped: {', '.join(already)}."
            self.message_user(request, said, messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/recipients/",
                self.admin_site.admin_view(self.recipients_view),
                name="notifications_notificationlist_recipients",
            ),
            path(
                "<path:object_id>/send-test/",
                self.admin_site.admin_view(self.send_test_view),
                name="notifications_notificationlist_send_test",
            ),
            *super().get_urls(),
        ]

    def _list_context(self, request: HttpRequest, notification_list: Any, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "original": notification_list,
            **extra,
        }

    def recipients_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Who a notification to this list would reach, per channel (view permission suffices)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        notification_list = self.get_object(request, unquote(object_id))
        if notification_list is None:
            return missing_object_redirect(self, request, object_id)
        preview = list_recipients_preview(notification_list=notification_list)
        context = self._list_context(request, notification_list, f"Who would receive “{notification_list.name}”")
        context["preview"] = preview
        return TemplateResponse(request, "admin/notifications/notificationlist/recipients.html", context)

    def send_test_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """A real notification to this list, marked as a test, created through ingest."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        notification_list = self.get_object(request, unquote(object_id))
        if notification_list is None:
            return missing_object_redirect(self, request, object_id)
        channels = [
            entry.channel for entry in list_recipients_preview(notification_list=notification_list) if entry.targets
        ]
        if request.method == "POST":
            form = TestNotificationForm(request.POST, channels=channels)
            if form.is_valid():
                try:
                    notification_id = list_send_test(
                        notification_list=notification_list, username=request.user.get_username(), **form.cleaned_data
                    )
                except TestNotificationError as error:
                    self.message_user(request, str(error), messages.ERROR)
                else:
                    self.message_user(
                        request,
                        f"Test notification {str(notification_id)[:8]} to {notification_list.name} was queued; "
                        "it is delivered like any other notification.",
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(
                        reverse("admin:notifications_notification_change", args=[notification_id])
                    )
        else:
            form = TestNotificationForm(
                channels=channels,
                initial={
                    "channel": "email" if "email" in channels else next(iter(channels), ""),
                    "subject": f"Test notification to {notification_list.name}",
                    "body": f"This is a test notification to the list {notification_list.name}, sent from the "
                    f"Outbox console by {request.user.get_username()}. No action is needed.",
                },
            )
        context = self._list_context(
            request,
            notification_list,
            f"Send a test notification to “{notification_list.name}”",
            form=form,
            channels=channels,
        )
        return TemplateResponse(request, "admin/notifications/notificationlist/send_test.html", context)

    @admin.display(description="email recipients", ordering="recipient_count")
    def recipient_count(self, obj: Any) -> int:
        return obj.recipient_count
