"""The SMTP configuration (a singleton) and its "Send test email", which sends through the email
adapter exactly as delivery does (notifications.operations.smtp_configuration_send_test).

The change form also tests the values typed into it before they are saved: "Check connection"
(connect, TLS, log in; nothing sent) and "Send test email", through the same adapter code. The
configuration cannot be deleted: without it every email would park."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.core.validators import MaxValueValidator, MinValueValidator
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from notifications.admin.common import SecretsUndecryptableExplained, missing_object_redirect, typed_secrets_kept
from notifications.email_address import email_address_problem
from notifications.models import SmtpConfiguration
from notifications.operations import (
    SmtpTestResult,
    smtp_configuration_connect_test,
    smtp_configuration_send_test,
    smtp_setting_problem,
)
from notifications.secret_binding import secret_bind, secret_kept_problem

PLAINTEXT_AUTH_WARNING = (
    "The SMTP configuration sends a username and password with security=none: they cross the network "
    "unencrypted. Use security=starttls or tls unless the relay is on this host."
)

# The database's check constraints, as field errors in words (shown before the database would
# refuse the row with only the constraint's name).
FIELD_BOUNDS = {
    "port": (
        1,
        65535,
        "The port must be a number from 1 to 65535 (usually 587 for STARTTLS, 465 for implicit TLS, 25 for plain SMTP).",
    ),
    "timeout_seconds": (1, None, "The timeout must be at least 1 second."),
    "greeting_timeout_seconds": (1, None, "The greeting timeout must be at least 1 second."),
}
# The write-only credentials (blank keeps the stored one) and their "remove" boxes. Each is bound
# to the destination it was entered for (notifications.secret_binding).
CREDENTIALS = {
    "password": "clear_password",
    "oauth_client_secret": "clear_oauth_client_secret",
    "oauth_client_certificate": "clear_oauth_client_certificate",
}
TEST_CONNECT = "_smtp_test_connect"
TEST_SEND = "_smtp_test_send"
TEST_TO = "smtp_test_to"


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
    oauth_client_certificate = forms.CharField(
        label="OAuth client certificate",
        required=False,
        max_length=500,
        widget=forms.TextInput(attrs={"size": 60, "autocomplete": "off"}),
        help_text="Instead of a client secret: absolute path of a PEM file with the app registration's certificate "
        "and its (unencrypted, RSA) private key. Write-only like the secret (the access token it obtains goes to "
        "the server): leave blank to keep the stored path.",
    )
    clear_oauth_client_certificate = forms.BooleanField(
        required=False, label="Remove the stored OAuth client certificate path"
    )

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
            "greeting_timeout_seconds",
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
        typed_secrets_kept(self)
        self.entered: list[str] = []  # the credentials typed into this form (bound on save)
        self.fields["auth_method"].required = False  # absent: password, as before the field existed
        stored_config = self.instance if self.instance.pk else None
        for name, what in (
            ("password", "password"),
            ("oauth_client_secret", "client secret"),
            ("oauth_client_certificate", "client certificate path"),
        ):
            self.initial[name] = ""
            has = stored_config is not None and getattr(stored_config, name)
            stored = f"A {what} is stored." if has else f"No {what} is stored."
            self.fields[name].help_text = f"{stored} {self.fields[name].help_text}"
        for name, (low, high, message) in FIELD_BOUNDS.items():
            field = self.fields.get(name)
            if field is not None:
                _bound(field, low, high, message)

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
        cleaned["auth_method"] = cleaned.get("auth_method") or SmtpConfiguration.AuthMethod.PASSWORD
        self._clean_credentials(cleaned)
        if cleaned.get("auth_method") == SmtpConfiguration.AuthMethod.XOAUTH2:
            self._check_xoauth2(cleaned)
        if cleaned.get("client_key") and not cleaned.get("client_cert") and "client_key" not in self.errors:
            self.add_error("client_key", "A client key needs its client certificate.")
        return cleaned

    def _clean_credentials(self, cleaned: dict[str, Any]) -> None:
        """Each credential: removed when its box is ticked, entered when typed, else kept — but
        only if the destination it is bound to did not change (notifications.secret_binding)."""
        stored = SmtpConfiguration.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
        self.entered = []
        for name, clear in CREDENTIALS.items():
            if cleaned.get(clear):
                cleaned[name] = ""
            elif cleaned.get(name):
                self.entered.append(name)
            elif name not in self.errors:
                problem = secret_kept_problem(stored=stored, secret=name, changes=cleaned)
                if problem:
                    self.add_error(name, problem)
                cleaned[name] = getattr(stored, name) if stored is not None else ""

    def _check_xoauth2(self, cleaned: dict[str, Any]) -> None:
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

    def save(self, commit: bool = True) -> SmtpConfiguration:
        """The configuration with the form's values, each credential typed into the form bound to
        the destination it is saved (or tested) with."""
        config: SmtpConfiguration = super().save(commit=False)
        for name in self.entered:
            secret_bind(instance=config, secret=name)
        if commit:
            config.save()
            self.save_m2m()
        return config


def _bound(field: forms.Field, low: int, high: int | None, message: str) -> None:
    """Replace ``field``'s numeric bounds by ``low``…``high`` with one error ``message``."""
    kept = [v for v in field.validators if not isinstance(v, MinValueValidator | MaxValueValidator)]
    field.validators = [*kept, MinValueValidator(low, message=message)]
    field.widget.attrs["min"] = low
    if high is not None:
        field.validators.append(MaxValueValidator(high, message=message))
        field.widget.attrs["max"] = high


def _testing_form(base: type[forms.ModelForm], model_admin: "SmtpConfigurationAdmin", request: HttpRequest) -> type:
    """``base`` for a POST of the change form's test buttons: valid values are tested through
    the email adapter and never saved (is_valid() answers False so the admin shows the form
    again with the typed values and the test's answer)."""

    class TestingForm(base):  # type: ignore[valid-type,misc]
        def is_valid(self) -> bool:
            if super().is_valid():
                model_admin.test_unsaved(request, self.save(commit=False))
            else:
                model_admin.message_user(request, "Correct the errors below, then test again.", messages.ERROR)
            return False

    return TestingForm


class SendTestForm(forms.Form):
    to = forms.EmailField(label="Send a test message to")

    def clean_to(self) -> str:
        address = self.cleaned_data["to"]
        problem = email_address_problem(address)
        if problem:
            raise forms.ValidationError(problem)
        return address


@admin.register(SmtpConfiguration)
class SmtpConfigurationAdmin(SecretsUndecryptableExplained):
    form = SmtpConfigurationForm
    fieldsets = (
        (
            "Server",
            {
                "fields": (
                    "host",
                    "port",
                    "security",
                    "timeout_seconds",
                    "greeting_timeout_seconds",
                    "data_timeout_seconds",
                )
            },
        ),
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
                    "clear_oauth_client_certificate",
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

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Without the configuration every email would park: it can be changed, never deleted.
        return False

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        if request.method == "POST" and (TEST_CONNECT in request.POST or TEST_SEND in request.POST):
            return _testing_form(form, self, request)
        return form

    def test_unsaved(self, request: HttpRequest, config: SmtpConfiguration) -> None:
        """Run the test the button asked for on ``config`` (unsaved form values); say the result."""
        if TEST_SEND in request.POST:
            to = request.POST.get(TEST_TO, "").strip()
            try:
                forms.EmailField().clean(to)
            except forms.ValidationError:
                shown = f"“{to}”" if to else "nothing"
                self.message_user(
                    request,
                    f"Enter the address to send the test message to ({shown} is not an email address).",
                    messages.ERROR,
                )
                return
            result = smtp_configuration_send_test(config=config, to=to)
            outcome = "accepted the test message" if result.ok else "did not accept the test message"
        else:
            result = smtp_configuration_connect_test(config=config)
            outcome = "accepted the connection" + (" and login" if config.username else "") if result.ok else "refused"
        self._say(request, config, outcome, result)

    def _say(self, request: HttpRequest, config: SmtpConfiguration, outcome: str, result: SmtpTestResult) -> None:
        level = messages.SUCCESS if result.ok else messages.ERROR
        self.message_user(request, f"{config.host}:{config.port} {outcome} (values not saved): {result.reply}", level)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A singleton: once configured there is only something to change.
        return super().has_add_permission(request) and not SmtpConfiguration.objects.exists()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The singleton's page instead of a list of one (the configuration is read there, so a
        # secret no key decrypts is explained, not a server error).
        if self.has_view_or_change_permission(request) and SmtpConfiguration.objects.exists():
            return HttpResponseRedirect(
                reverse("admin:notifications_smtpconfiguration_change", args=[SmtpConfiguration.SINGLETON_PK])
            )
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
