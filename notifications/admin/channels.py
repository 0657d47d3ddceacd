"""List targets of the channels beyond email (inlines on a notification list) and the
per-channel configuration. Every field is checked by notifications.channel_targets, the same
checks the configuration file and delivery use. Secrets (webhook signing secrets, Teams and
Apprise URLs, the SMS auth token) are write-only: stored encrypted, shown masked or not at all.
A secret kept (left blank) is only ever kept for the destination it was entered for
(notifications.secret_binding): a webhook's new URL or the SMS channel's new API base URL or
account needs the secret typed again."""

from typing import Any

from django import forms
from django.contrib import admin

from notifications.admin.common import SecretsUndecryptableExplained, typed_secrets_kept
from notifications.channel_targets import (
    apprise_url_problem,
    channel_configuration_problems,
    http_url_problem,
    phone_number_problem,
    url_masked,
    webhook_secret_problem,
)
from notifications.models import AppriseTarget, ChannelConfiguration, SmsTarget, TeamsTarget, WebhookTarget
from notifications.secret_binding import secret_bind, secret_kept_problem, teams_url_digest


def _field_check(form: forms.ModelForm, name: str, problem: str | None) -> None:
    if problem:
        form.add_error(name, problem)


class WriteOnlyUrlForm(forms.ModelForm):
    """A target whose URL is a secret (it carries a signature or credentials): never shown,
    kept when left blank, checked by ``url_problem`` when given."""

    required_message = "A URL is required."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["url"] = ""
        typed_secrets_kept(self)

    def url_problem(self, url: str) -> str | None:
        raise NotImplementedError

    def clean_url(self) -> str:
        url = (self.cleaned_data.get("url") or "").strip()
        if not url:
            model = self._meta.model
            stored = model.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
            if stored is None:
                raise forms.ValidationError(self.required_message)
            return str(stored.url)
        problem = self.url_problem(url)
        if problem:
            raise forms.ValidationError(problem)
        return url


class TeamsTargetForm(WriteOnlyUrlForm):
    url = forms.CharField(
        required=False,
        max_length=2000,
        label="Workflows URL",
        widget=forms.PasswordInput(render_value=False, attrs={"size": 60, "autocomplete": "off"}),
        help_text="Write-only (its query carries the workflow's signature). Leave blank to keep the stored URL.",
    )
    required_message = "A Workflows URL is required."

    class Meta:
        model = TeamsTarget
        fields = ("url",)

    def url_problem(self, url: str) -> str | None:
        return http_url_problem(url, what="The Workflows URL", echo=False)


class TeamsTargetFormSet(forms.BaseInlineFormSet):
    """A list holds a Workflows URL at most once. The database keeps that by the URL's digest
    (the stored URLs are encrypted), a column the form does not have: checked here, so that a
    duplicate is a field error rather than a database error."""

    def clean(self) -> None:
        super().clean()
        seen: set[str] = set()
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or form.cleaned_data.get("DELETE") or not form.cleaned_data.get("url"):
                continue
            digest = teams_url_digest(form.cleaned_data["url"])
            if digest in seen:
                form.add_error("url", "This Workflows URL is already a target of this list.")
            seen.add(digest)


class TeamsTargetInline(admin.TabularInline):
    model = TeamsTarget
    form = TeamsTargetForm
    formset = TeamsTargetFormSet
    extra = 0
    fields = ("masked", "url")
    readonly_fields = ("masked",)
    verbose_name_plural = "Teams targets (Workflows webhook URLs)"

    @admin.display(description="stored URL (masked)")
    def masked(self, obj: TeamsTarget) -> str:
        return url_masked(obj.url) if obj.url else "—"


class WebhookTargetForm(forms.ModelForm):
    url = forms.CharField(max_length=2000, label="URL", widget=forms.TextInput(attrs={"size": 60}))
    secret = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text='Write-only: "whsec_" + base64 of 24+ random bytes. Leave blank to keep the stored secret.',
    )

    class Meta:
        model = WebhookTarget
        fields = ("url", "secret")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["secret"] = ""
        typed_secrets_kept(self)
        self.entered = False  # a secret was typed into the form (bound to the URL on save)

    def clean_url(self) -> str:
        url = self.cleaned_data["url"].strip()
        problem = http_url_problem(url)
        if problem:
            raise forms.ValidationError(problem)
        return url

    def clean_secret(self) -> str:
        secret = self.cleaned_data.get("secret") or ""
        if secret:
            problem = webhook_secret_problem(secret)
            if problem:
                raise forms.ValidationError(problem)
        return secret

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self.entered = bool(cleaned.get("secret"))
        if self.entered or "secret" in self.errors:
            return cleaned
        stored = WebhookTarget.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
        if stored is None or not stored.secret:
            self.add_error("secret", "A signing secret is required for a new webhook target.")
            return cleaned
        problem = secret_kept_problem(stored=stored, secret="secret", changes=cleaned)
        if problem:
            self.add_error("secret", problem)
        cleaned["secret"] = stored.secret
        return cleaned

    def save(self, commit: bool = True) -> WebhookTarget:
        """The target, its secret bound to its URL when the secret was typed into the form."""
        target: WebhookTarget = super().save(commit=False)
        if self.entered:
            secret_bind(instance=target, secret="secret")
        if commit:
            target.save()
            self.save_m2m()
        return target


class WebhookTargetInline(admin.TabularInline):
    model = WebhookTarget
    form = WebhookTargetForm
    extra = 0
    verbose_name_plural = "Webhook targets (signed with Standard Webhooks)"


class SmsTargetForm(forms.ModelForm):
    class Meta:
        model = SmsTarget
        fields = ("phone_number",)

    def clean_phone_number(self) -> str:
        number = "".join(self.cleaned_data["phone_number"].split())
        problem = phone_number_problem(number)
        if problem:
            raise forms.ValidationError(problem)
        return number


class SmsTargetInline(admin.TabularInline):
    model = SmsTarget
    form = SmsTargetForm
    extra = 0
    verbose_name_plural = "SMS targets (E.164 phone numbers)"


class AppriseTargetForm(WriteOnlyUrlForm):
    url = forms.CharField(
        required=False,
        label="Apprise URL",
        widget=forms.PasswordInput(render_value=False, attrs={"size": 60, "autocomplete": "off"}),
        help_text="Write-only (it usually holds the service's credentials). Leave blank to keep the stored URL.",
    )
    required_message = "An Apprise URL is required."

    class Meta:
        model = AppriseTarget
        fields = ("url",)

    def url_problem(self, url: str) -> str | None:
        return apprise_url_problem(url)


class AppriseTargetInline(admin.TabularInline):
    model = AppriseTarget
    form = AppriseTargetForm
    extra = 0
    fields = ("display", "url")
    readonly_fields = ("display",)
    verbose_name_plural = "Apprise targets (Slack, Telegram, ntfy, …)"


CHANNEL_INLINES = [TeamsTargetInline, WebhookTargetInline, SmsTargetInline, AppriseTargetInline]


class ChannelConfigurationForm(forms.ModelForm):
    api_base = forms.CharField(
        max_length=500,
        required=False,
        label="API base URL",
        initial=ChannelConfiguration.TWILIO_API_BASE,
        help_text="Where the provider's REST API is; change only for a test double or a regional edge.",
    )
    auth_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave blank to keep the stored token.",
    )

    class Meta:
        model = ChannelConfiguration
        fields = (
            "channel",
            "timeout_seconds",
            "provider",
            "account_sid",
            "auth_token",
            "from_number",
            "api_base",
            "max_segments",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["auth_token"] = ""
        typed_secrets_kept(self)
        self.entered = False  # a token was typed into the form (bound on save)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self.entered = bool(cleaned.get("auth_token"))
        if not self.entered and self.instance.pk:
            stored = ChannelConfiguration.objects.filter(pk=self.instance.pk).first()
            problem = secret_kept_problem(stored=stored, secret="auth_token", changes=cleaned)
            if problem:
                self.add_error("auth_token", problem)
            cleaned["auth_token"] = stored.auth_token if stored is not None else ""
        problems = channel_configuration_problems(cleaned)
        for name, problem in problems.items():
            if name in self.fields and name not in self.errors:
                self.add_error(name, problem)
        return cleaned

    def save(self, commit: bool = True) -> ChannelConfiguration:
        """The configuration, its auth token bound to the API base URL and account when the token
        was typed into the form."""
        config: ChannelConfiguration = super().save(commit=False)
        if self.entered:
            secret_bind(instance=config, secret="auth_token")
        if commit:
            config.save()
            self.save_m2m()
        return config


@admin.register(ChannelConfiguration)
class ChannelConfigurationAdmin(SecretsUndecryptableExplained):
    form = ChannelConfigurationForm
    list_display = ("channel", "timeout_seconds", "provider", "account_sid", "from_number", "api_base_display")

    @admin.display(description="API base URL")
    def api_base_display(self, obj: ChannelConfiguration) -> str:
        return url_masked(obj.api_base) if obj.channel == ChannelConfiguration.Channel.SMS else "—"
