"""The configuration file's parts for the channels beyond email (docs/channels.md): a list's
``teams``, ``webhooks``, ``sms`` and ``apprise`` targets and the top-level ``channels``
settings. Validation reports every problem naming its entry; import replaces a list's targets
of each channel key the entry has (a key left out keeps that channel's targets); export writes
no secret.

Secrets on import: a webhook given without ``secret`` keeps the secret stored for the same URL
in that list, and ``channels.sms`` without ``auth_token`` keeps the stored token — so an
exported file imports again unchanged. Apprise URLs are not exported at all (they hold the
services' credentials); a file without ``apprise`` keeps a list's Apprise targets.
"""

from typing import Any

from notifications.channel_targets import (
    apprise_url_problem,
    channel_configuration_problems,
    http_url_problem,
    phone_number_problem,
    webhook_secret_problem,
)
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    NotificationList,
    SmsTarget,
    TeamsTarget,
    WebhookTarget,
)

TARGET_KEYS = ("teams", "webhooks", "sms", "apprise")
CHANNEL_FIELDS: dict[str, dict[str, type]] = {
    "teams": {"timeout_seconds": int},
    "webhook": {"timeout_seconds": int},
    "apprise": {"timeout_seconds": int},
    "sms": {
        "provider": str,
        "account_sid": str,
        "auth_token": str,
        "from_number": str,
        "api_base": str,
        "timeout_seconds": int,
        "max_segments": int,
    },
}


class ChannelsImportError(Exception):
    """A problem only the stored state reveals (a webhook without a secret to keep)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def validate_list_targets(entry: dict[str, Any], where: str, problems: list[str]) -> None:
    """Problems of one list entry's channel targets."""
    for key, check in (("teams", http_url_problem), ("sms", phone_number_problem), ("apprise", apprise_url_problem)):
        if key not in entry:
            continue
        values = entry[key]
        if not isinstance(values, list):
            problems.append(f"{where}.{key}: must be a list.")
            continue
        seen: set[str] = set()
        for position, value in enumerate(values):
            problem = check(value)
            shown = "(an Apprise URL)" if key == "apprise" else repr(value)[:80]
            if problem:
                problems.append(f"{where}.{key}[{position}]: {problem}")
            elif value in seen:
                problems.append(f"{where}.{key}[{position}]: {shown} is listed twice.")
            if isinstance(value, str):
                seen.add(value)
    if "webhooks" in entry:
        hooks = entry["webhooks"]
        if not isinstance(hooks, list):
            problems.append(f"{where}.webhooks: must be a list of {{url, secret}} objects.")
            return
        urls: set[str] = set()
        for position, hook in enumerate(hooks):
            at = f"{where}.webhooks[{position}]"
            if not isinstance(hook, dict):
                problems.append(f"{at}: must be an object with url and secret.")
                continue
            for name in sorted(set(hook) - {"url", "secret"}):
                problems.append(f"{at}.{name}: unknown field.")
            problem = http_url_problem(hook.get("url"))
            if problem:
                problems.append(f"{at}.url: {problem}")
            elif hook["url"] in urls:
                problems.append(f"{at}.url: {hook['url'][:80]!r} is listed twice.")
            else:
                urls.add(hook["url"])
            if "secret" in hook and hook["secret"] not in ("", None):
                problem = webhook_secret_problem(hook["secret"])
                if problem:
                    problems.append(f"{at}.secret: {problem}")


def validate_channels(channels: Any, problems: list[str]) -> None:
    """Problems of the top-level ``channels`` object."""
    if not isinstance(channels, dict):
        problems.append("channels: must be an object keyed by channel.")
        return
    for channel, values in channels.items():
        if channel not in CHANNEL_FIELDS:
            problems.append(f"channels.{channel}: unknown channel (known: {', '.join(CHANNEL_FIELDS)}).")
            continue
        if not isinstance(values, dict):
            problems.append(f"channels.{channel}: must be an object.")
            continue
        typed_ok = _channel_fields_check(channel, values, problems)
        if channel == "sms" and typed_ok:
            stored = ChannelConfiguration.objects.filter(channel="sms").first()
            merged = {
                "channel": "sms",
                "api_base": ChannelConfiguration.TWILIO_API_BASE,
                "auth_token": stored.auth_token if stored else "",
                **{key: value for key, value in values.items() if value != "" or key != "auth_token"},
            }
            for name, problem in channel_configuration_problems(merged).items():
                problems.append(f"channels.sms.{name}: {problem}")


def _channel_fields_check(channel: str, values: dict[str, Any], problems: list[str]) -> bool:
    """Add the problems of one channel's fields (unknown, of the wrong type, out of range) to
    ``problems``; True when every field has its type."""
    fields = CHANNEL_FIELDS[channel]
    for name in sorted(set(values) - set(fields)):
        problems.append(f"channels.{channel}.{name}: unknown field.")
    typed_ok = True
    for name, kind in fields.items():
        if name in values and (not isinstance(values[name], kind) or isinstance(values[name], bool)):
            problems.append(f"channels.{channel}.{name}: must be {'an integer' if kind is int else 'a string'}.")
            typed_ok = False
    if isinstance(values.get("timeout_seconds"), int) and values["timeout_seconds"] < 1:
        problems.append(f"channels.{channel}.timeout_seconds: must be at least 1.")
    if isinstance(values.get("max_segments"), int) and not 1 <= values["max_segments"] <= 10:
        problems.append(f"channels.{channel}.max_segments: must be between 1 and 10.")
    return typed_ok


def channels_import(channels: dict[str, Any]) -> list[str]:
    """Create or update each channel's settings (validated); returns the channels written."""
    written = []
    for channel, values in channels.items():
        config = ChannelConfiguration.objects.filter(channel=channel).first() or ChannelConfiguration(channel=channel)
        for name, value in values.items():
            if name == "auth_token" and not value:
                continue  # left out by export: keep the stored token
            setattr(config, name, value)
        config.save()
        written.append(channel)
    return written


def channels_export() -> dict[str, Any]:
    """Every stored channel's settings, without the SMS auth token."""
    exported: dict[str, Any] = {}
    for config in ChannelConfiguration.objects.all():
        exported[config.channel] = {
            name: getattr(config, name) for name in CHANNEL_FIELDS[config.channel] if name != "auth_token"
        }
    return exported


def list_targets_import(*, notification_list: NotificationList, entry: dict[str, Any], where: str) -> None:
    """Replace the list's targets of every channel key ``entry`` has."""
    if "teams" in entry:
        notification_list.teams_targets.all().delete()
        TeamsTarget.objects.bulk_create(
            TeamsTarget(notification_list=notification_list, url=url) for url in entry["teams"]
        )
    if "webhooks" in entry:
        kept = {hook.url: hook.secret for hook in notification_list.webhook_targets.all()}
        missing = [hook["url"] for hook in entry["webhooks"] if not hook.get("secret") and not kept.get(hook["url"])]
        if missing:
            raise ChannelsImportError(
                [f"{where}.webhooks: {url[:80]!r} has no secret in the file and none is stored." for url in missing]
            )
        notification_list.webhook_targets.all().delete()
        for hook in entry["webhooks"]:
            # One by one: the secret is encrypted on save (bulk_create would encrypt too, but
            # keeping the one path is simpler to trust).
            WebhookTarget.objects.create(
                notification_list=notification_list, url=hook["url"], secret=hook.get("secret") or kept[hook["url"]]
            )
    if "sms" in entry:
        notification_list.sms_targets.all().delete()
        SmsTarget.objects.bulk_create(
            SmsTarget(notification_list=notification_list, phone_number=number) for number in entry["sms"]
        )
    if "apprise" in entry:
        notification_list.apprise_targets.all().delete()
        for url in entry["apprise"]:
            AppriseTarget.objects.create(notification_list=notification_list, url=url)


def list_targets_export(notification_list: NotificationList) -> dict[str, Any]:
    """The list's targets in the file's shape, without secrets (no Apprise URLs, no webhook
    secrets); channels without targets are left out."""
    exported: dict[str, Any] = {}
    teams = [target.url for target in notification_list.teams_targets.all()]
    hooks = [{"url": target.url} for target in notification_list.webhook_targets.all()]
    sms = [target.phone_number for target in notification_list.sms_targets.all()]
    if teams:
        exported["teams"] = teams
    if hooks:
        exported["webhooks"] = hooks
    if sms:
        exported["sms"] = sms
    return exported
