"""Configuration as code: import/export of SMTP, delivery policies, notification lists and sites
(docs/operations.md).

Import upserts by natural key (list name case-insensitively, site_id), replaces a list's
recipients with the file's (per channel: a channel key the entry leaves out keeps that
channel's targets), and leaves entries the file does not mention alone. The whole
file is validated before anything is written, and written in one transaction, so a bad
file changes nothing. Export never writes secrets (the SMTP password, the OAuth client secret,
the SMS auth token and webhook signing secrets are left out, and so are Teams and Apprise
URLs, which are credentials themselves).

Every secret may be given as ``{"env": "NAME"}`` (notifications.config_secrets), and a stored
secret is kept only for the destination it was entered for (notifications.secret_binding): a
file that moves a destination without the secret is refused.
"""

import copy
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from notifications.channels_config import (
    TARGET_KEYS,
    ChannelsImportError,
    channels_export,
    channels_import,
    list_targets_export,
    list_targets_import,
    validate_channels,
    validate_list_targets,
)
from notifications.config_secrets import config_secret_resolve
from notifications.email_address import email_address_problem
from notifications.escalation import escalation_problems, lists_escalation_stored
from notifications.list_names import list_name_key, list_name_normalize, list_name_problem, notification_lists_by_name
from notifications.models import AckRequiredFrom, EmailRecipient, NotificationList, SmtpConfiguration
from notifications.operations import smtp_setting_problem
from notifications.policies import delivery_policies_all, delivery_policy_store, delivery_policy_validate
from notifications.secret_binding import secret_bind, secret_kept_problem
from notifications.vocabulary import ADAPTER_PATHS
from sites.models import Site
from sites.rate_limits import site_rate_problems

SMTP_FIELDS = {
    "host": str,
    "port": int,
    "security": str,
    "username": str,
    "password": str,
    "from_address": str,
    "timeout_seconds": int,
    "greeting_timeout_seconds": int,
    "data_timeout_seconds": int,
    "max_retries": int,
    "retry_interval_seconds": int,
    "local_hostname": str,
    "ca_file": str,
    "client_cert": str,
    "client_key": str,
    "auth_method": str,
    "oauth_tenant_id": str,
    "oauth_client_id": str,
    "oauth_client_secret": str,
    "oauth_client_certificate": str,
    "oauth_authority": str,
}
# Secrets: imported when given (an absent or empty one keeps the stored one), never exported.
SMTP_SECRETS = ("password", "oauth_client_secret")
# Credentials bound to the destination (notifications.secret_binding): the secrets, and the
# OAuth client certificate's path (not a secret, so exported; absent keeps the stored one).
SMTP_CREDENTIALS = (*SMTP_SECRETS, "oauth_client_certificate")
SMTP_REQUIRED = ("host", "from_address")
# A list's suppression settings (docs/suppression.md): whole seconds or counts; the flood window
# at least 1 second.
LIST_SUPPRESSION_FIELDS = {"dedup_window_seconds": 0, "flood_threshold": 0, "flood_window_seconds": 1}
LIST_FIELDS = {
    "name",
    "description",
    "recipient_mode",
    "resend_after_local_delivery",
    "ack_required_from",
    "escalation",
    "repeat_last_every_seconds",
    "email",
    *TARGET_KEYS,
    *LIST_SUPPRESSION_FIELDS,
}
# The channel each key of a list entry holds targets for.
CHANNEL_OF_KEY = {"email": "email", "teams": "teams", "webhooks": "webhook", "sms": "sms", "apprise": "apprise"}
SITE_FIELDS = {"site_id", "name", "active", "rate_limit", "rate_burst"}
SECTIONS = ("smtp", "channels", "policies", "lists", "sites")


class ConfigFileError(Exception):
    """The file is invalid; ``problems`` lists every problem, each naming its entry."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _validate_smtp(smtp: Any, problems: list[str]) -> None:
    if not isinstance(smtp, dict):
        problems.append("smtp: must be an object.")
        return
    for name in SMTP_SECRETS:
        if name in smtp:
            config_secret_resolve(smtp, name, where=f"smtp.{name}", problems=problems)
    for name in sorted(set(smtp) - set(SMTP_FIELDS)):
        problems.append(f"smtp.{name}: unknown field.")
    for name in SMTP_REQUIRED:
        if not smtp.get(name):
            problems.append(f"smtp.{name}: is required.")
    for name, kind in SMTP_FIELDS.items():
        if name in smtp and (not isinstance(smtp[name], kind) or isinstance(smtp[name], bool)):
            problems.append(f"smtp.{name}: must be {'an integer' if kind is int else 'a string'}.")
    _validate_smtp_values(smtp, problems)
    _validate_smtp_settings(smtp, problems)


def _validate_smtp_values(smtp: dict[str, Any], problems: list[str]) -> None:
    """The SMTP configuration's security, port, times, counts and From address are usable."""
    if isinstance(smtp.get("security"), str) and smtp["security"] not in SmtpConfiguration.Security.values:
        allowed = ", ".join(SmtpConfiguration.Security.values)
        problems.append(f"smtp.security: {smtp['security']!r} is not one of {allowed}.")
    if isinstance(smtp.get("port"), int) and not 1 <= smtp["port"] <= 65535:
        problems.append(f"smtp.port: {smtp['port']} is not between 1 and 65535.")
    for name in ("timeout_seconds", "greeting_timeout_seconds", "data_timeout_seconds", "retry_interval_seconds"):
        if isinstance(smtp.get(name), int) and smtp[name] < 1:
            problems.append(f"smtp.{name}: must be at least 1.")
    if isinstance(smtp.get("max_retries"), int) and smtp["max_retries"] < 0:
        problems.append("smtp.max_retries: must not be negative.")
    if isinstance(smtp.get("from_address"), str) and smtp["from_address"]:
        problem = email_address_problem(smtp["from_address"])
        if problem:
            problems.append(f"smtp.from_address: {problem}")


def _validate_smtp_settings(smtp: dict[str, Any], problems: list[str]) -> None:
    """The authentication method and the host and file settings are usable."""
    if isinstance(smtp.get("auth_method"), str) and smtp["auth_method"] not in SmtpConfiguration.AuthMethod.values:
        allowed = ", ".join(SmtpConfiguration.AuthMethod.values)
        problems.append(f"smtp.auth_method: {smtp['auth_method']!r} is not one of {allowed}.")
    for name in (
        "local_hostname",
        "ca_file",
        "client_cert",
        "client_key",
        "oauth_client_certificate",
        "oauth_authority",
    ):
        if isinstance(smtp.get(name), str) and smtp[name]:
            problem = smtp_setting_problem(name, smtp[name])
            if problem:
                problems.append(f"smtp.{name}: {problem}")


def _validate_policies(policies: Any, problems: list[str]) -> None:
    if not isinstance(policies, dict):
        problems.append("policies: must be an object keyed by channel.")
        return
    for channel, values in policies.items():
        if channel not in ADAPTER_PATHS:
            problems.append(f"policies.{channel}: unknown channel (known: {', '.join(ADAPTER_PATHS)}).")
            continue
        if not isinstance(values, dict):
            problems.append(f"policies.{channel}: must be an object.")
            continue
        for name, problem in delivery_policy_validate(values=values).items():
            problems.append(f"policies.{channel}.{name}: {problem}")


def _list_settings_problems(entry: dict[str, Any], where: str) -> list[str]:
    """What is wrong with a list entry's settings (its description, recipient mode, local
    delivery and acknowledgement choices)."""
    problems = []
    if not isinstance(entry.get("description", ""), str):
        problems.append(f"{where}.description: must be a string.")
    for field, choices, default in (
        ("recipient_mode", NotificationList.RecipientMode.values, NotificationList.RecipientMode.BCC),
        ("ack_required_from", AckRequiredFrom.values, AckRequiredFrom.HIGH),
    ):
        value = entry.get(field, default)
        if not isinstance(value, str) or value not in choices:
            problems.append(f"{where}.{field}: {value!r} is not one of {', '.join(choices)}.")
    if not isinstance(entry.get("resend_after_local_delivery", False), bool):
        problems.append(f"{where}.resend_after_local_delivery: must be true or false.")
    return problems


def _validate_lists(lists: Any, problems: list[str]) -> None:
    if not isinstance(lists, list):
        problems.append("lists: must be a list.")
        return
    seen: dict[str, int] = {}
    for index, entry in enumerate(lists):
        where = f"lists[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object.")
            continue
        name = entry.get("name")
        if isinstance(name, str) and name.strip():
            where = f"lists[{index}] ({name!r})"
            key = list_name_key(name)
            if key in seen:
                problems.append(f"{where}: duplicate of lists[{seen[key]}] (names are case-insensitive).")
            seen[key] = index
            if len(list_name_normalize(name)) > 200:
                problems.append(f"{where}.name: must be at most 200 characters.")
            problem = list_name_problem(list_name_normalize(name))
            if problem:
                problems.append(f"{where}.name: {problem}")
        else:
            problems.append(f"{where}.name: is required and must be a non-blank string.")
        for field in sorted(set(entry) - LIST_FIELDS):
            problems.append(f"{where}.{field}: unknown field.")
        problems.extend(_list_settings_problems(entry, where))
        _validate_list_suppression(entry, where, problems)
        validate_list_targets(entry, where, problems)
        emails = entry.get("email", [])
        if not isinstance(emails, list):
            problems.append(f"{where}.email: must be a list of addresses.")
            continue
        lowered: set[str] = set()
        for position, address in enumerate(emails):
            problem = email_address_problem(address) if isinstance(address, str) else f"{address!r} is not a string."
            if problem:
                problems.append(f"{where}.email[{position}]: {problem}")
                continue
            if address.lower() in lowered:
                problems.append(f"{where}.email[{position}]: {address!r} is listed twice.")
            lowered.add(address.lower())


def _validate_escalations(lists: list[Any], problems: list[str]) -> None:
    """Problems of the entries' escalation steps, checked against the lists as the import would
    leave them: the stored ones with the file's entries over them (steps and channel targets)."""
    stored = lists_escalation_stored()
    by_key = {list_name_key(name): name for name in stored.steps}
    steps, channels = dict(stored.steps), {name: set(found) for name, found in stored.channels.items()}
    entries = [entry for entry in lists if isinstance(entry, dict) and isinstance(entry.get("name"), str)]
    for entry in entries:
        name = by_key.get(list_name_key(entry["name"]), list_name_normalize(entry["name"]))
        steps[name] = entry.get("escalation", steps.get(name, []))
        found = channels.setdefault(name, set())
        for key, channel in CHANNEL_OF_KEY.items():
            if key in entry:
                found.discard(channel)
                if entry[key]:
                    found.add(channel)
    for index, entry in enumerate(lists):
        if entry not in entries or ("escalation" not in entry and "repeat_last_every_seconds" not in entry):
            continue
        name = by_key.get(list_name_key(entry["name"]), list_name_normalize(entry["name"]))
        where = f"lists[{index}] ({entry['name']!r})"
        for problem in escalation_problems(
            steps=steps[name],
            repeat_last_every_seconds=entry.get("repeat_last_every_seconds", 0),
            list_name=name,
            lists=steps,
            channels_of=channels,
        ):
            field = "repeat_last_every_seconds" if problem.startswith("repeat_last_every_seconds") else "escalation"
            problems.append(f"{where}.{field}: {problem}")
    in_file = {list_name_key(entry["name"]) for entry in entries}
    problems += _stored_escalations_problems(stored.steps, in_file=in_file, steps=steps, channels=channels)


def _stored_escalations_problems(
    stored: dict[str, Any], *, in_file: set[str], steps: dict[str, Any], channels: dict[str, set[str]]
) -> list[str]:
    """Problems the file makes for the steps of stored lists it does not mention (by their name
    keys ``in_file``): a step to a list whose targets for the step's channel the file removes."""
    problems = []
    for name, own in stored.items():
        if list_name_key(name) in in_file or not isinstance(own, list):
            continue
        targets = {
            list_name_key(step["list"]) for step in own if isinstance(step, dict) and isinstance(step.get("list"), str)
        }
        if not targets & in_file:
            continue  # the file changes none of the lists it escalates to
        for problem in escalation_problems(steps=own, list_name=name, lists=steps, channels_of=channels):
            problems.append(f"lists: the list {name!r} (not in this file) would escalate wrongly: {problem}")
    return problems


def _validate_sites(sites: Any, problems: list[str]) -> None:
    if not isinstance(sites, list):
        problems.append("sites: must be a list.")
        return
    seen: set[str] = set()
    for index, entry in enumerate(sites):
        where = f"sites[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object.")
            continue
        site_id = entry.get("site_id")
        try:
            if not isinstance(site_id, str) or len(site_id) > 64:
                raise ValidationError("bad")
            validate_slug(site_id)
        except ValidationError:
            problems.append(f"{where}.site_id: {site_id!r} must be a slug (letters, digits, - and _), ≤ 64 chars.")
        else:
            where = f"sites[{index}] ({site_id!r})"
            if site_id in seen:
                problems.append(f"{where}: listed twice.")
            seen.add(site_id)
        for field in sorted(set(entry) - SITE_FIELDS):
            problems.append(f"{where}.{field}: unknown field.")
        if "name" in entry and (not isinstance(entry["name"], str) or len(entry["name"]) > 200):
            problems.append(f"{where}.name: must be a string of at most 200 characters.")
        if "active" in entry and not isinstance(entry["active"], bool):
            problems.append(f"{where}.active: must be true or false.")
        limits = site_rate_problems(rate_limit=entry.get("rate_limit"), rate_burst=entry.get("rate_burst"))
        problems += [f"{where}.{field}: {problem}" for field, problem in limits.items()]


def configuration_validate(*, data: Any) -> list[str]:
    """Every problem in ``data`` (a parsed file), each naming its entry; empty when valid."""
    return _resolved(data)[1]


def _resolved(data: Any) -> tuple[Any, list[str]]:
    """A copy of ``data`` with its ``{"env": "NAME"}`` secrets resolved, and every problem of
    it (the secrets that do not resolve among them)."""
    problems: list[str] = []
    if not isinstance(data, dict):
        return data, [f"The file must contain a JSON object with keys {', '.join(SECTIONS)}."]
    data = copy.deepcopy(data)
    for key in sorted(set(data) - set(SECTIONS)):
        problems.append(f"{key}: unknown section (expected {', '.join(SECTIONS)}).")
    if "smtp" in data and data["smtp"] is not None:
        _validate_smtp(data["smtp"], problems)
    if "channels" in data:
        validate_channels(data["channels"], problems)
    if "policies" in data:
        _validate_policies(data["policies"], problems)
    if "lists" in data:
        _validate_lists(data["lists"], problems)
        if isinstance(data["lists"], list):
            _validate_escalations(data["lists"], problems)
    if "sites" in data:
        _validate_sites(data["sites"], problems)
    if isinstance(data.get("smtp"), dict):
        _validate_smtp_kept(data["smtp"], problems)
    return data, problems


def _validate_smtp_kept(smtp: dict[str, Any], problems: list[str]) -> None:
    """Problems of the stored SMTP credentials the file would keep (it leaves them out) for a
    destination they were not entered for. A field with a problem already (a reference to the
    environment that did not resolve) gets no second one."""
    stored = SmtpConfiguration.current()
    for name in SMTP_CREDENTIALS:
        kept = not smtp.get(name) if name in SMTP_SECRETS else name not in smtp
        reported = any(problem.startswith(f"smtp.{name}:") for problem in problems)
        problem = secret_kept_problem(stored=stored, secret=name, changes=smtp) if kept and not reported else None
        if problem:
            problems.append(f"smtp.{name}: {problem}")


@transaction.atomic
def configuration_import(*, data: Any) -> dict[str, Any]:
    """Apply a configuration file; returns a summary of what changed. Raises ConfigFileError
    (and changes nothing) when the file is invalid."""
    data, problems = _resolved(data)
    if problems:
        raise ConfigFileError(problems)
    summary: dict[str, Any] = {
        "smtp": None,
        "channels": [],
        "policies_created": 0,
        "policies_updated": 0,
        "lists_created": 0,
        "lists_updated": 0,
        "sites_created": 0,
        "sites_updated": 0,
    }

    smtp = data.get("smtp")
    if smtp:
        summary["smtp"] = _smtp_import(smtp)

    if data.get("channels"):
        summary["channels"] = channels_import(data["channels"])

    for channel, values in data.get("policies", {}).items():
        _, created = delivery_policy_store(channel=channel, values=values)
        summary["policies_created" if created else "policies_updated"] += 1

    existing = notification_lists_by_name(names=[entry["name"] for entry in data.get("lists", [])])
    for entry in data.get("lists", []):
        created = _list_import(entry, existing.get(entry["name"]))
        summary["lists_created" if created else "lists_updated"] += 1

    for entry in data.get("sites", []):
        created = _site_import(entry)
        summary["sites_created" if created else "sites_updated"] += 1
    return summary


def _smtp_import(smtp: dict[str, Any]) -> str:
    """Write the file's SMTP configuration (validated, credentials kept only where
    :func:`_validate_smtp_kept` allowed it); "created" or "updated"."""
    config = SmtpConfiguration.current() or SmtpConfiguration()
    written = "updated" if config.pk else "created"
    for name in SMTP_FIELDS:
        if name in SMTP_SECRETS:
            # Export leaves the secrets out; an absent or empty one keeps the stored secret.
            if smtp.get(name):
                setattr(config, name, smtp[name])
        elif name in smtp:
            setattr(config, name, smtp[name])
    for name in SMTP_CREDENTIALS:
        if smtp.get(name):
            secret_bind(instance=config, secret=name)  # given in the file: entered for these values
    config.save()
    return written


def _validate_list_suppression(entry: dict[str, Any], where: str, problems: list[str]) -> None:
    for name, least in LIST_SUPPRESSION_FIELDS.items():
        if name not in entry:
            continue
        value = entry[name]
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 2**31 - 1:
            problems.append(f"{where}.{name}: must be a whole number of at least {least}.")


def _list_import(entry: dict[str, Any], notification_list: NotificationList | None) -> bool:
    """Write one list entry (validated) over ``notification_list`` (None: a new list); its
    recipients become the entry's. True when the list was created."""
    name = list_name_normalize(entry["name"])
    created = notification_list is None
    if notification_list is None:
        notification_list = NotificationList(name=name)
    notification_list.name = name
    notification_list.description = entry.get("description", notification_list.description)
    notification_list.recipient_mode = entry.get("recipient_mode", notification_list.recipient_mode)
    notification_list.resend_after_local_delivery = entry.get(
        "resend_after_local_delivery", notification_list.resend_after_local_delivery
    )
    for field in ("ack_required_from", "escalation", "repeat_last_every_seconds", *LIST_SUPPRESSION_FIELDS):
        setattr(notification_list, field, entry.get(field, getattr(notification_list, field)))
    notification_list.save()
    notification_list.email_recipients.all().delete()
    EmailRecipient.objects.bulk_create(
        EmailRecipient(notification_list=notification_list, email=address) for address in entry.get("email", [])
    )
    try:
        list_targets_import(notification_list=notification_list, entry=entry, where=f"lists ({name!r})")
    except ChannelsImportError as exc:
        raise ConfigFileError(exc.problems) from None
    return created


def _site_import(entry: dict[str, Any]) -> bool:
    """Write one site entry (validated); True when the site was created."""
    site = Site.objects.filter(site_id=entry["site_id"]).first()
    created = site is None
    if site is None:
        site = Site(site_id=entry["site_id"], name=entry.get("name") or entry["site_id"])
    site.name = entry.get("name", site.name) or site.site_id
    site.active = entry.get("active", site.active)
    site.rate_limit = entry.get("rate_limit", site.rate_limit)
    site.rate_burst = entry.get("rate_burst", site.rate_burst)
    site.save()
    return created


def configuration_export() -> dict[str, Any]:
    """The current configuration in the file's shape, without secrets."""
    data: dict[str, Any] = {"smtp": None, "policies": {}, "lists": [], "sites": []}
    channels = channels_export()
    if channels:
        data["channels"] = channels
    config = SmtpConfiguration.current()
    if config is not None:
        data["smtp"] = {name: getattr(config, name) for name in SMTP_FIELDS if name not in SMTP_SECRETS}
    # Every channel's effective policy, stored or default: importing the file reproduces it.
    data["policies"] = {channel: policy.as_dict() for channel, policy in delivery_policies_all().items()}
    for notification_list in NotificationList.objects.prefetch_related(
        "email_recipients", "webhook_targets", "sms_targets"
    ):
        data["lists"].append(
            {
                "name": notification_list.name,
                "description": notification_list.description,
                "recipient_mode": notification_list.recipient_mode,
                "resend_after_local_delivery": notification_list.resend_after_local_delivery,
                "ack_required_from": notification_list.ack_required_from,
                "escalation": notification_list.escalation,
                "repeat_last_every_seconds": notification_list.repeat_last_every_seconds,
                **{field: getattr(notification_list, field) for field in LIST_SUPPRESSION_FIELDS},
                "email": [recipient.email for recipient in notification_list.email_recipients.all()],
                **list_targets_export(notification_list),
            }
        )
    for site in Site.objects.all():
        entry: dict[str, Any] = {"site_id": site.site_id, "name": site.name, "active": site.active}
        # A site's own limits only where it has them: the installation's apply to the others.
        entry.update(
            {name: getattr(site, name) for name in ("rate_limit", "rate_burst") if getattr(site, name) is not None}
        )
        data["sites"].append(entry)
    return data
