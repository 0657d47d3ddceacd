"""System checks of the notifications app (registered in ``NotificationsConfig.ready``)."""

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError

from notifications.channel_targets import channel_configuration_problems
from notifications.escalation import escalation_problems, lists_escalation_stored
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
from notifications.workers import WORKER_SILENT_SECONDS, workers_silence


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


def check_workers_running(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.W004 (database tag): a worker process has run within the last
    WORKER_SILENT_SECONDS (the sweep runs a task every minute while any worker runs). Without
    one nothing is delivered. Run only when databases are checked (``check --database``,
    ``migrate``): other commands — ``qcluster`` itself at its start — are not told that no
    worker runs. Returns the warning."""
    if not kwargs.get("databases"):
        return []
    try:
        silence = workers_silence()
    except DatabaseError:
        return []  # no database or table yet (before migrate)
    if silence is None:
        return []
    return [
        Warning(
            str(silence),
            hint=(
                f"Start the workers (`python manage.py qcluster`, the outbox-worker service) and check their logs; "
                f"this warning clears once one has run a task in the last {WORKER_SILENT_SECONDS // 60} minutes."
            ),
            id="outbox.W004",
        )
    ]


def check_escalations(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System check outbox.W030 (database tag): every list's escalation steps can be taken —
    each step's list exists and has targets for the step's channel. The forms and the
    configuration file check this when steps are saved; a list renamed, deleted or left without
    those targets later breaks a step, whose children then park. Returns one warning per list."""
    try:
        stored = lists_escalation_stored()
    except DatabaseError:
        return []  # no database or table yet (before migrate)
    found: list[CheckMessage] = []
    for name, steps in sorted(stored.steps.items()):
        if not steps:
            continue
        problems = escalation_problems(steps=steps, list_name=name, lists=stored.steps, channels_of=stored.channels)
        if problems:
            found.append(
                Warning(
                    f"The escalation of the list {name!r} cannot be taken as configured: {' '.join(problems)}",
                    hint="Correct its steps on the list's page (or in the configuration file), or give the step's "
                    "list targets for its channel; until then the notifications of those steps park.",
                    id="outbox.W030",
                )
            )
    return found


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


# The mark of every secret left as shipped in deploy/systemd/outbox.env.example.
PLACEHOLDER = "change-me"
METRICS_TOKEN_MIN_LENGTH = 32


def _shipped_placeholders() -> dict[str, str]:
    """The secret settings whose value still carries the example file's placeholder, by the name
    of their environment variable."""
    broker_password = urlparse(settings.Q_BROKER_URL).password if settings.Q_BROKER_URL else None
    values: dict[str, str] = {
        "SECRET_KEY": settings.SECRET_KEY,
        "OUTBOX_METRICS_TOKEN": settings.OUTBOX_METRICS_TOKEN,
        "DATABASE_URL": str(settings.DATABASES["default"].get("PASSWORD") or ""),
        "Q_BROKER_URL": broker_password or "",
        "OUTBOX_SECRET_KEYS": " ".join(settings.OUTBOX_SECRET_KEYS),
    }
    return {name: value for name, value in values.items() if PLACEHOLDER in value.lower()}


def check_deploy_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """System checks of ``manage.py check --deploy`` beyond Django's own (which cover DEBUG, the
    secret key's strength, HTTPS, cookies and HSTS):

    * outbox.E020 — OUTBOX_BENCH_RAW_VIEW is on: an unauthenticated insert view meant for the
      ingest benchmark only;
    * outbox.E021 — a secret still holds the placeholder of deploy/systemd/outbox.env.example;
    * outbox.W020 — OUTBOX_METRICS_TOKEN is shorter than 32 characters;
    * outbox.W021 — the failed-authentication limit of the API is switched off;
    * outbox.W022 — SECRET_KEY is not set (each host would generate a key of its own).

    Returns what was found."""
    found: list[CheckMessage] = []
    if settings.OUTBOX_BENCH_RAW_VIEW:
        found.append(
            Error(
                "OUTBOX_BENCH_RAW_VIEW is on: /bench/raw-insert/ inserts notifications with no authentication "
                "and no validation.",
                hint="It exists for the ingest benchmark only; remove OUTBOX_BENCH_RAW_VIEW from the environment.",
                id="outbox.E020",
            )
        )
    for name in _shipped_placeholders():
        found.append(
            Error(
                f"{name} still holds the placeholder secret of the example environment file (CHANGE-ME).",
                hint="Replace it with a secret of its own, e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(50))'` (docs/deployment.md).",
                id="outbox.E021",
            )
        )
    token = settings.OUTBOX_METRICS_TOKEN
    if token and PLACEHOLDER not in token.lower() and len(token) < METRICS_TOKEN_MIN_LENGTH:
        found.append(
            Warning(
                f"OUTBOX_METRICS_TOKEN is {len(token)} characters long: short enough to guess.",
                hint=f"Use at least {METRICS_TOKEN_MIN_LENGTH} random characters "
                "(`python -c 'import secrets; print(secrets.token_urlsafe(32))'`).",
                id="outbox.W020",
            )
        )
    if settings.OUTBOX_AUTH_FAILURE_RATE <= 0:
        found.append(
            Warning(
                "OUTBOX_AUTH_FAILURE_RATE is 0: failed API authentications are not limited, so API keys and "
                "staff keys can be guessed as fast as the server answers.",
                hint="Remove OUTBOX_AUTH_FAILURE_RATE from the environment (default 10 per minute).",
                id="outbox.W021",
            )
        )
    if settings.SECRET_KEY_GENERATED:
        found.append(
            Warning(
                "SECRET_KEY is not set: this host generated a key of its own (var/secret_key).",
                hint="Set SECRET_KEY to the same secret on every web and worker host; sessions, signed links and "
                "encrypted secrets depend on it.",
                id="outbox.W022",
            )
        )
    return found
