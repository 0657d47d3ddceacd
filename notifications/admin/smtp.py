"""The SMTP configuration (a singleton) and its "Send test email", which sends through the email
adapter exactly as delivery does (notifications.operations.smtp_configuration_send_test)."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from notifications.admin.common import missing_object_redirect
from notifications.models import SmtpConfiguration
from notifications.operations import smtp_configuration_send_test, smtp_password_kept_problem


class SmtpConfigurationForm(forms.ModelForm):
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored password is never shown. Leave blank to keep it.",
    )
    clear_password = forms.BooleanField(required=False, label="Remove the stored password")

    class Meta:
        model = SmtpConfiguration
        fields = [
            "host",
            "port",
            "security",
            "username",
            "password",
            "from_address",
            "timeout_seconds",
            "data_timeout_seconds",
            "max_retries",
            "retry_interval_seconds",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["password"] = ""
        stored = "A password is stored." if self.instance.pk and self.instance.password else "No password is stored."
        self.fields["password"].help_text = f"{stored} {self.fields['password'].help_text}"

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("clear_password"):
            cleaned["password"] = ""
        elif not cleaned.get("password"):
            stored = SmtpConfiguration.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
            problem = smtp_password_kept_problem(stored=stored, changes=cleaned)
            if problem:
                self.add_error("password", problem)
            cleaned["password"] = stored.password if stored is not None else ""
        return cleaned


class SendTestForm(forms.Form):
    to = forms.EmailField(label="Send a test message to")


@admin.register(SmtpConfiguration)
class SmtpConfigurationAdmin(admin.ModelAdmin):
    form = SmtpConfigurationForm
    fieldsets = (
        ("Server", {"fields": ("host", "port", "security", "timeout_seconds", "data_timeout_seconds")}),
        ("Authentication", {"fields": ("username", "password", "clear_password")}),
        ("Messages", {"fields": ("from_address",)}),
        (
            "Email retry timing (used while no delivery policy for email is stored)",
            {"fields": ("max_retries", "retry_interval_seconds")},
        ),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A singleton: once configured there is only something to change.
        return super().has_add_permission(request) and not SmtpConfiguration.objects.exists()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        config = SmtpConfiguration.current()
        if config is not None and self.has_view_or_change_permission(request):
            return HttpResponseRedirect(reverse("admin:notifications_smtpconfiguration_change", args=[config.pk]))
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/send-test/",
                self.admin_site.admin_view(self.send_test_view),
                name="notifications_smtpconfiguration_send_test",
            ),
            *super().get_urls(),
        ]

    def send_test_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        if not self.has_change_permission(request):
            raise PermissionDenied
        config = self.get_object(request, unquote(object_id))
        if config is None:
            return missing_object_redirect(self, request, object_id)
        result = None
        if request.method == "POST":
            form = SendTestForm(request.POST)
            if form.is_valid():
                result = smtp_configuration_send_test(config=config, to=form.cleaned_data["to"])
                level = messages.SUCCESS if result.ok else messages.ERROR
                outcome = "accepted the test message" if result.ok else "did not accept the test message"
                self.message_user(request, f"{config.host}:{config.port} {outcome}: {result.reply}", level)
        else:
            form = SendTestForm(initial={"to": getattr(request.user, "email", "")})
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a test email",
            "opts": self.opts,
            "original": config,
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/notifications/smtpconfiguration/send_test.html", context)
