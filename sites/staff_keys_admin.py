"""Staff API keys in the console (superusers): issue one to a staff user with a name and an
expiry (the key is shown on the next page, once, and stored only as a hash), see when each was
last used, rename, revoke. A key's user is fixed when it is issued; keys are revoked, never
deleted, so the list stays a record of who could use the staff API."""

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from sites.models import StaffAPIKey
from sites.services import STAFF_KEY_DEFAULT_DAYS, staff_key_issue, staff_key_revoke


def _default_expiry() -> Any:
    return (timezone.now() + timedelta(days=STAFF_KEY_DEFAULT_DAYS)).replace(second=0, microsecond=0)


class StaffKeyIssueForm(forms.ModelForm):
    """Whose key, what for, until when."""

    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_staff=True, is_active=True).order_by("username"),
        help_text="An active staff user; the key acts as this user and cannot be handed to another.",
    )
    expiry_date = forms.DateTimeField(
        label="Expires (UTC)",
        initial=_default_expiry,
        error_messages={"invalid": "Enter the expiry as a date and time, e.g. 2027-01-31 18:00."},
    )

    class Meta:
        model = StaffAPIKey
        fields = ("user", "name", "expiry_date")
        help_texts = {"name": "What uses the key, e.g. 'monitoring' or 'shift report script'."}

    def clean_expiry_date(self) -> Any:
        expiry = self.cleaned_data["expiry_date"]
        if expiry <= timezone.now():
            raise forms.ValidationError(
                "The expiry must be in the future; a key that expired at once would be useless."
            )
        return expiry


class StaffKeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "Live"), ("expired", "Expired"), ("revoked", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        if self.value() == "live":
            return queryset.filter(revoked=False, expiry_date__gt=now)
        if self.value() == "expired":
            return queryset.filter(revoked=False, expiry_date__lte=now)
        if self.value() == "revoked":
            return queryset.filter(revoked=True)
        return queryset


@admin.register(StaffAPIKey)
class StaffAPIKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "state", "created", "expiry_date", "last_used_at")
    list_filter = (StaffKeyStateFilter,)
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    actions = ["revoke_keys"]

    @admin.display(description="state")
    def state(self, staff_key: StaffAPIKey) -> str:
        if staff_key.revoked:
            return "revoked"
        return "expired" if staff_key.has_expired else "live"

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = StaffKeyIssueForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("user", "name", "expiry_date")
        return ("prefix", "user", "name", "state", "created", "expiry_date", "last_used_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        fixed = ("prefix", "user", "state", "created", "expiry_date", "last_used_at")
        return (*fixed, "name") if obj.revoked else fixed

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the list stays a record of the keys that existed

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        if change:
            return super().save_form(request, form, change)
        staff_key, plaintext = staff_key_issue(
            user=form.cleaned_data["user"], name=form.cleaned_data["name"], expiry_date=form.cleaned_data["expiry_date"]
        )
        staff_key.plaintext_once = plaintext  # type: ignore[attr-defined]  # for response_add, this request only
        return staff_key

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)  # a new key is saved as it is issued

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        if change:
            super().save_related(request, form, formsets, change)

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: str | None = None) -> HttpResponse:
        """The new key's plaintext is in this one response and nowhere else."""
        response = TemplateResponse(
            request,
            "admin/sites/staffapikey/key_issued.html",
            {
                **self.admin_site.each_context(request),
                "title": f"New staff key for {obj.user.get_username()}",
                "opts": self.opts,
                "staff_key": obj,
                "plaintext": obj.plaintext_once,
            },
        )
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected staff keys (cannot be undone)", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet) -> None:
        revoked = skipped = 0
        for staff_key in queryset:
            if staff_key.revoked:
                skipped += 1
                continue
            staff_key_revoke(prefix=staff_key.prefix)
            self.log_change(request, staff_key, "Revoked.")
            revoked += 1
        self.message_user(
            request,
            f"Revoked {revoked} staff key{'s' if revoked != 1 else ''}; requests with them are now refused."
            + (f" {skipped} already revoked, left as they were." if skipped else ""),
            messages.SUCCESS,
        )
