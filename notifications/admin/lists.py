"""Notification lists and their email recipients. Names follow notifications.list_names (stored
trimmed in NFC, compared ignoring case, look-alikes refused); addresses ignore case."""

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from notifications.list_names import list_name_normalize, list_name_problem, notification_list_clash
from notifications.models import EmailRecipient, NotificationList


class NotificationListForm(forms.ModelForm):
    class Meta:
        model = NotificationList
        fields = ("name", "description", "recipient_mode")
        widgets = {"recipient_mode": forms.RadioSelect}

    def clean_name(self) -> str:
        name = list_name_normalize(self.cleaned_data["name"])
        problem = list_name_problem(name)
        if problem:
            raise ValidationError(problem)
        clash = notification_list_clash(name=name, exclude_pk=self.instance.pk)
        if clash is not None:
            raise ValidationError(f"A list named {clash.name!r} already exists (list names ignore case).")
        return name


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
            if email in seen:
                form.add_error("email", f"{email} is already in this list (addresses ignore case).")
            seen.add(email)


class EmailRecipientInline(admin.TabularInline):
    model = EmailRecipient
    formset = EmailRecipientFormSet
    extra = 1
    fields = ("email",)


@admin.register(NotificationList)
class NotificationListAdmin(admin.ModelAdmin):
    form = NotificationListForm
    inlines = [EmailRecipientInline]
    list_display = ("name", "recipient_count", "recipient_mode", "description")
    list_filter = ("recipient_mode",)
    search_fields = ("name", "email_recipients__email")

    def get_queryset(self, request: HttpRequest) -> QuerySet[NotificationList]:
        return super().get_queryset(request).annotate(recipient_count=Count("email_recipients"))

    @admin.display(description="email recipients", ordering="recipient_count")
    def recipient_count(self, obj: Any) -> int:
        return obj.recipient_count
