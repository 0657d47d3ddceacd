"""Helpers the console's pages share."""

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from notifications.secrets import SecretDecryptionError


def json_block(value: Any) -> SafeString:
    """``value`` as indented JSON in a <pre> block."""
    return format_html(
        '<pre class="outbox-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False, default=str)
    )


def missing_object_redirect(
    model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str
) -> HttpResponseRedirect:
    """What Django's own admin views do for an object that does not exist (any more): a warning,
    and back to the console's index."""
    name = model_admin.opts.verbose_name
    model_admin.message_user(
        request, f"{name} with ID “{unquote(object_id)}” doesn’t exist. Perhaps it was deleted?", messages.WARNING
    )
    return HttpResponseRedirect(reverse("admin:index", current_app=model_admin.admin_site.name))


class ReadOnlyRecords:
    """For a model admin whose rows are a record: nobody adds, changes or deletes them in the
    console (its own actions, such as Retry or Discard, are separate permissions)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DiscardForm(forms.Form):
    """The reason an operator gives for a Discard (required)."""

    reason = forms.CharField(
        label="Reason",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Required: kept with the notification, with your name and the time.",
    )


class SecretsUndecryptableExplained(admin.ModelAdmin):
    """A page of an object holding a secret the configured keys cannot decrypt (SECRET_KEY or
    OUTBOX_SECRET_KEYS changed without the old key kept) says so and what to do, on the console's
    index, instead of failing with a server error."""

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        return self._explained(
            request,
            lambda: super(SecretsUndecryptableExplained, self).changeform_view(
                request, object_id, form_url, extra_context
            ),
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        return self._explained(
            request, lambda: super(SecretsUndecryptableExplained, self).changelist_view(request, extra_context)
        )

    def _explained(self, request: HttpRequest, view: Any) -> Any:
        try:
            response = view()
            if hasattr(response, "render"):
                response.render()  # the forms read the stored secrets while the page renders
        except SecretDecryptionError as error:
            self.message_user(
                request,
                f"This {self.opts.verbose_name} cannot be shown: {error} Then run “manage.py rotate_secrets”.",
                messages.ERROR,
            )
            return HttpResponseRedirect(reverse("admin:index"))
        return response


def typed_secrets_kept(form: forms.BaseForm) -> None:
    """When ``form`` comes back with an error (its own or another form's on the same page), its
    write-only fields keep what was typed in this submission, masked: otherwise a new target's
    URL would come back empty and the next save would drop it without a word. A stored secret
    is never rendered: a field left blank stays blank."""
    if form.is_bound:
        for field in form.fields.values():
            if isinstance(field.widget, forms.PasswordInput):
                field.widget.render_value = True


class IncidentNoteForm(forms.Form):
    subject = forms.RegexField(regex=r"^(channel|parked):[\w.-]{1,80}$", max_length=100, widget=forms.HiddenInput)
    text = forms.CharField(
        label="Note for the next shift",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60, "placeholder": "relay team called, ETA 04:00"}),
    )
