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
from notifications.email_address import email_address_problem
from notifications.models import SmtpConfiguration
from notifications.operations import (
    smtp_configuration_send_test,
    smtp_oauth_secret_kept_problem,
    smtp_password_kept_problem,
    smtp_setting_problem,
)

PLAINTEXT_AUTH_WARNING = (
    "The SMTP configuration sends a username and password with security=none: they cross the network "
    "unencrypted. Use security=starttls or tls unless the relay is on this host."
)


class SmtpConfigurationForm(forms.ModelForm):
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored password is never shown. Leave blank to keep it.",
    )
    clear_password = forms.BooleanField(required=False, label="Remove the stored password")
    oauth_client_secret = forms.CharField(
        label="OAuth client secret",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored secret is never shown. Leave blank to keep it.",
    )
    clear_oauth_client_secret = forms.BooleanField(required=False, label="Remove the stored OAuth client secret")

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
            "local_hostname",
            "ca_file",
            "client_cert",
            "client_key",
            "auth_method",
            "oauth_tenant_id",
            "oauth_client_id",
            "oauth_client_secret",
            "oauth_client_certificate",
            "oauth_authority",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["password"] = ""
        stored = "A password is stored." if self.instance.pk and self.instance.password else "No password is stored."
        self.fields["password"].help_text = f"{stored} {self.fields['password'].help_text}"
        self.initial["oauth_client_secret"] = ""
        self.fields["auth_method"].required = False  # absent: password, as before the field existed
        has_secret = self.instance.pk and self.instance.oauth_client_secret
        stored = "A client secret is stored." if has_secret else "No client secret is stored."
        self.fields["oauth_client_secret"].help_text = f"{stored} {self.fields['oauth_client_secret'].help_text}"

    def clean_from_address(self) -> str:
        address = self.cleaned_data["from_address"]
        problem = email_address_problem(address)
        if problem:
            raise forms.ValidationError(problem)
        return address

    def _clean_setting(self, name: str) -> str:
        value = (self.cleaned_data.get(name) or "").strip()
        problem = smtp_setting_problem(name, value) if value else None
        if problem:
            raise forms.ValidationError(problem)
        return value

    def clean_local_hostname(self) -> str:
        return self._clean_setting("local_hostname")

    def clean_ca_file(self) -> str:
        return self._clean_setting("ca_file")

    def clean_client_cert(self) -> str:
        return self._clean_setting("client_cert")

    def clean_client_key(self) -> str:
        return self._clean_setting("client_key")

    def clean_oauth_client_certificate(self) -> str:
        return self._clean_setting("oauth_client_certificate")

    def clean_oauth_authority(self) -> str:
        return self._clean_setting("oauth_authority")

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
        cleaned["auth_method"] = cleaned.get("auth_method") or SmtpConfiguration.AuthMethod.PASSWORD
        if cleaned.get("clear_oauth_client_secret"):
            cleaned["oauth_client_secret"] = ""
        elif not cleaned.get("oauth_client_secret"):
            stored = SmtpConfiguration.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
            problem = smtp_oauth_secret_kept_problem(stored=stored, changes=cleaned)
            if problem:
                self.add_error("oauth_client_secret", problem)
            cleaned["oauth_client_secret"] = stored.oauth_client_secret if stored is not None else ""
        if cleaned.get("auth_method") == SmtpConfiguration.AuthMethod.XOAUTH2:
            for name in ("username", "oauth_tenant_id", "oauth_client_id"):
                if not cleaned.get(name) and name not in self.errors:
                    self.add_error(
                        name, "Required for OAuth 2.0 (XOAUTH2): the mailbox (username) and the app registration."
                    )
            if not cleaned.get("oauth_client_secret") and not cleaned.get("oauth_client_certificate"):
                self.add_error(
                    "oauth_client_secret",
                    "Required for OAuth 2.0 (XOAUTH2): a client secret or a client certificate.",
                )
        if cleaned.get("client_key") and not cleaned.get("client_cert") and "client_key" not in self.errors:
            self.add_error("client_key", "A client key needs its client certificate.")
        return cleaned


class SendTestForm(forms.Form):
    to = forms.EmailField(label="Send a test message to")

    def clean_to(self) -> str:
        address = self.cleaned_data["to"]
        problem = email_address_problem(address)
        if problem:
            raise forms.ValidationError(problem)
        return address


@admin.register(SmtpConfiguration)
class SmtpConfigurationAdmin(admin.ModelAdmin):
    form = SmtpConfigurationForm
    fieldsets = (
        ("Server", {"fields": ("host", "port", "security", "timeout_seconds", "data_timeout_seconds")}),
        (
            "Identity and TLS trust",
            {"fields": ("local_hostname", "ca_file", "client_cert", "client_key")},
        ),
        ("Authentication", {"fields": ("auth_method", "username", "password", "clear_password")}),
        (
            "OAuth 2.0 (XOAUTH2, Microsoft 365)",
            {
                "fields": (
                    "oauth_tenant_id",
                    "oauth_client_id",
                    "oauth_client_secret",
                    "clear_oauth_client_secret",
                    "oauth_client_certificate",
                    "oauth_authority",
                )
            },
        ),
        ("Messages", {"fields": ("from_address",)}),
        (
            "Email retry timing (used while no delivery policy for email is stored)",
            {"fields": ("max_retries", "retry_interval_seconds")},
        ),
    )

    def save_model(self, request: HttpRequest, obj: SmtpConfiguration, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if obj.username and obj.security == SmtpConfiguration.Security.NONE:
            self.message_user(request, PLAINTEXT_AUTH_WARNING, messages.WARNING)

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
