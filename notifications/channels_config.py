"""The configuration file's parts for the channels beyond email (docs/channels.md): a list's
``teams``, ``webhooks``, ``sms`` and ``apprise`` targets and the top-level ``channels``
settings. Validation reports every problem naming its entry; import replaces a list's targets
of each channel key the entry has (a key left out keeps that channel's targets); export writes
no secret.

Secrets on import: a webhook given without ``secret`` keeps the secret stored for the same URL
in that list, and ``channels.sms`` without ``auth_token`` keeps the stored token as long as
``api_base`` and ``account_sid`` stay as they are (notifications.secret_binding) — so an
exported file imports again unchanged. Teams and Apprise URLs are not exported at all (the URL
is the credential); a file without ``teams`` or ``apprise`` keeps a list's targets of that
channel. Every secret may be given as ``{"env": "NAME"}`` (notifications.config_secrets).
"""

from collections.abc import Callable
from typing import Any

from notifications.channel_targets import (
    apprise_url_problem,
    channel_configuration_problems,
    http_url_problem,
    phone_number_problem,
    url_masked,
    webhook_secret_problem,
)
from notifications.config_secrets import config_secret_resolve
from notifications.models import (
    AppriseTarget,
    ChannelConfiguration,
    NotificationList,
    SmsTarget,
    TeamsTarget,
    WebhookTarget,
)
from notifications.secret_binding import secret_bind, secret_kept_problem

TARGET_KEYS = ("teams", "webhooks", "sms", "apprise")
# Target keys whose entries are secrets (the URL is the credential): never echoed, never exported.
SECRET_TARGET_KEYS = ("teams", "apprise")
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
    """Problems of one list entry's channel targets. Resolves the entry's secrets given as
    ``{"env": "NAME"}`` in place."""
    for key, check in (
        ("teams", lambda url: http_url_problem(url, what="The Workflows URL", echo=False)),
        ("sms", phone_number_problem),
        ("apprise", apprise_url_problem),
    ):
        if key in entry:
            _validate_plain_targets(entry[key], key=key, check=check, where=where, problems=problems)
    if "webhooks" in entry:
        hooks = entry["webhooks"]
        if not isinstance(hooks, list):
            problems.append(f"{where}.webhooks: must be a list of {{url, secret}} objects.")
            return
        urls: set[str] = set()
        for position, hook in enumerate(hooks):
            _validate_webhook(hook, at=f"{where}.webhooks[{position}]", urls=urls, problems=problems)


def _validate_plain_targets(
    values: Any, *, key: str, check: Callable[[Any], str | None], where: str, problems: list[str]
) -> None:
    """Problems of one channel's list of targets (URLs or numbers), each checked by ``check``."""
    if not isinstance(values, list):
        problems.append(f"{where}.{key}: must be a list.")
        return
    seen: set[str] = set()
    for position, value in enumerate(values):
        at = f"{where}.{key}[{position}]"
        if key in SECRET_TARGET_KEYS:
            if not config_secret_resolve(values, position, where=at, problems=problems):
                continue
            value = values[position]
        problem = check(value)
        if problem:
            problems.append(f"{at}: {problem}")
        elif value in seen:
            problems.append(f"{at}: {_shown(key, value)} is listed twice.")
        if isinstance(value, str):
            seen.add(value)


def _validate_webhook(hook: Any, *, at: str, urls: set[str], problems: list[str]) -> None:
    """Problems of one webhook entry (``{url, secret}``); ``urls`` are the entry's URLs so far."""
    if not isinstance(hook, dict):
        problems.append(f"{at}: must be an object with url and secret.")
        return
    for name in sorted(set(hook) - {"url", "secret"}):
        problems.append(f"{at}.{name}: unknown field.")
    problem = http_url_problem(hook.get("url"))
    if problem:
        problems.append(f"{at}.url: {problem}")
    elif hook["url"] in urls:
        problems.append(f"{at}.url: {hook['url'][:80]!r} is listed twice.")
    else:
        urls.add(hook["url"])
    resolved = "secret" in hook and config_secret_resolve(hook, "secret", where=f"{at}.secret", problems=problems)
    if resolved and hook["secret"] not in ("", None):
        problem = webhook_secret_problem(hook["secret"])
        if problem:
            problems.append(f"{at}.secret: {problem}")


def _shown(key: str, value: Any) -> str:
    """A target as problems may quote it: a Teams URL masked, an Apprise URL not at all."""
    if key == "apprise":
        return "(an Apprise URL)"
    if key == "teams":
        return url_masked(value)
    return repr(value)[:80]


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
        # False: a reference to the environment did not resolve (reported; the token is not checked further).
        token_resolved = channel != "sms" or "auth_token" not in values
        token_resolved = token_resolved or config_secret_resolve(
            values, "auth_token", where="channels.sms.auth_token", problems=problems
        )
        typed_ok = _channel_fields_check(channel, values, problems)
        if channel == "sms" and typed_ok:
            stored = ChannelConfiguration.objects.filter(channel="sms").first()
            if not values.get("auth_token") and token_resolved:
                problem = secret_kept_problem(stored=stored, secret="auth_token", changes=values)
                if problem:
                    problems.append(f"channels.sms.auth_token: {problem}")
            merged = {
                "channel": "sms",
                "api_base": ChannelConfiguration.TWILIO_API_BASE,
                "auth_token": stored.auth_token if stored else "",
                **{key: value for key, value in values.items() if value != "" or key != "auth_token"},
            }
            for name, problem in channel_configuration_problems(merged).items():
                if name != "auth_token" or token_resolved:
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
                continue  # left out by export: keep the stored token (validation checked it may be kept)
            setattr(config, name, value)
        if values.get("auth_token"):
            secret_bind(instance=config, secret="auth_token")
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
        for url in entry["teams"]:
            # One by one: save() encrypts the URL and computes its digest.
            TeamsTarget.objects.create(notification_list=notification_list, url=url)
    if "webhooks" in entry:
        stored = list(notification_list.webhook_targets.all())
        kept: dict[str, str] = {}
        problems = []
        for position, hook in enumerate(entry["webhooks"]):
            if hook.get("secret"):
                continue
            # A stored target is matched by its URL; the helper says whether its secret may stay.
            same = next((target for target in stored if target.url == hook["url"]), None)
            at = f"{where}.webhooks[{position}].secret"
            if same is None or not same.secret:
                problems.append(
                    f"{at}: {hook['url'][:80]!r} has no secret in the file and none is stored for that URL (a stored "
                    "signing secret is only ever sent to the URL it was entered for)."
                )
                continue
            problem = secret_kept_problem(stored=same, secret="secret", changes={"url": hook["url"]})
            if problem:
                problems.append(f"{at}: {problem}")
            else:
                kept[hook["url"]] = same.secret
        if problems:
            raise ChannelsImportError(problems)
        notification_list.webhook_targets.all().delete()
        for hook in entry["webhooks"]:
            # One by one: save() encrypts the secret and binds it to the URL.
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
    """The list's targets in the file's shape, without secrets (no Teams or Apprise URLs, no
    webhook secrets); channels without targets are left out."""
    exported: dict[str, Any] = {}
    hooks = [{"url": target.url} for target in notification_list.webhook_targets.all()]
    sms = [target.phone_number for target in notification_list.sms_targets.all()]
    if hooks:
        exported["webhooks"] = hooks
    if sms:
        exported["sms"] = sms
    return exported
