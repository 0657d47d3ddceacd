"""System checks of the notifications app (registered in ``NotificationsConfig.ready``)."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError

from notifications.channel_targets import channel_configuration_problems
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    SmsTarget,
    SmtpConfiguration,
    TeamsTarget,
    WebhookTarget,
)
from notifications.schedules import schedules_missing
from notifications.secrets import SecretDecryptionError


def check_secrets_decryptable(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.E001 (database tag, so run by migrate and `check --database default`):
    the stored SMTP password decrypts with the configured keys. Returns the errors found."""
    try:
        SmtpConfiguration.objects.values_list("password", "oauth_client_secret").first()
    except SecretDecryptionError as exc:
        return [Error(str(exc), id="outbox.E001")]
    except DatabaseError:
        pass  # no database or table yet (before migrate): nothing stored to check
    return []


def check_schedules_present(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.W001 (database tag): the worker's schedules exist. Without the
    dispatch sweep nothing recovers expired leases or lost triggers. Returns the warnings."""
    try:
        missing = schedules_missing()
    except DatabaseError:
        return []  # no database or tables yet (before migrate): migrate will create them
    if not missing:
        return []
    return [
        Warning(
            f"The worker's schedules are missing: {', '.join(missing)}.",
            hint="Run `python manage.py migrate` (it creates them) or `python manage.py setup_schedules`.",
            id="outbox.W001",
        )
    ]


def check_plaintext_auth(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.W003 (database tag): the SMTP configuration does not send a
    username and password over an unencrypted connection (security=none). Returns the warning."""
    try:
        config = (
            SmtpConfiguration.objects.only("username", "security").filter(pk=SmtpConfiguration.SINGLETON_PK).first()
        )
    except DatabaseError:
        return []
    if config is None or not config.username or config.security != SmtpConfiguration.Security.NONE:
        return []
    return [
        Warning(
            "The SMTP configuration authenticates with security=none: the username and password (or token) cross "
            "the network unencrypted.",
            hint="Set security to starttls or tls in the SMTP configuration (docs/relays.md), unless the relay "
            "runs on this host.",
            id="outbox.W003",
        )
    ]


def check_attachment_limit(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.W002: attachments as large as OUTBOX_MAX_ATTACHMENT_BYTES fit in a
    request of OUTBOX_MAX_BODY_BYTES once base64-encoded (a third larger). Returns the warning
    when they do not: such attachments would be refused with 413 before their limit applies."""
    encoded = -(-settings.OUTBOX_MAX_ATTACHMENT_BYTES // 3) * 4
    if encoded <= settings.OUTBOX_MAX_BODY_BYTES:
        return []
    return [
        Warning(
            f"OUTBOX_MAX_ATTACHMENT_BYTES ({settings.OUTBOX_MAX_ATTACHMENT_BYTES:,}) is {encoded:,} bytes as base64, "
            f"more than a request may carry (OUTBOX_MAX_BODY_BYTES, {settings.OUTBOX_MAX_BODY_BYTES:,}).",
            hint="Raise OUTBOX_MAX_BODY_BYTES to at least 4/3 of the attachment limit plus the rest of a "
            "notification, or lower OUTBOX_MAX_ATTACHMENT_BYTES.",
            id="outbox.W002",
        )
    ]


def check_channels(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System checks of the channels beyond email (database tag): outbox.E011, a stored channel
    secret (webhook secret, Teams or Apprise URL, SMS auth token) does not decrypt with the
    configured keys; outbox.W011, lists hold SMS targets but the sms channel has no complete
    configuration, so every SMS notification would park. Returns what was found."""
    found: list[CheckMessage] = []
    try:
        for model, field in (
            (WebhookTarget, "secret"),
            (TeamsTarget, "url"),
            (AppriseTarget, "url"),
            (ChannelConfiguration, "auth_token"),
        ):
            list(model.objects.values_list(field, flat=True))
    except SecretDecryptionError as exc:
        found.append(Error(str(exc), id="outbox.E011"))
    except DatabaseError:
        return []  # no database or tables yet (before migrate)
    try:
        has_numbers = SmsTarget.objects.exists()
        config = ChannelConfiguration.objects.filter(channel="sms").first() if has_numbers else None
    except (DatabaseError, SecretDecryptionError):
        return found
    if has_numbers:
        values = (
            {}
            if config is None
            else {
                name: getattr(config, name)
                for name in ("channel", "provider", "account_sid", "auth_token", "from_number", "api_base")
            }
        )
        problems = channel_configuration_problems({**values, "channel": "sms"})
        if problems:
            found.append(
                Warning(
                    "Notification lists hold SMS targets but the sms channel is not configured: "
                    + "; ".join(f"{name}: {problem}" for name, problem in problems.items()),
                    hint="Configure it in the console (Channel configuration) or the configuration file's "
                    "channels.sms (docs/channels.md); until then SMS notifications park.",
                    id="outbox.W011",
                )
            )
    return found
