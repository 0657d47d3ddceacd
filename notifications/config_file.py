"""Configuration as code: import/export of SMTP, notification lists and sites (DESIGN §7).

Import upserts by natural key (list name case-insensitively, site_id), replaces a list's
recipients with the file's, and leaves entries the file does not mention alone. The whole
file is validated before anything is written, and written in one transaction, so a bad
file changes nothing. Export never writes secrets (the SMTP password is left out).
"""

from django.core.exceptions import ValidationError
from django.core.validators import validate_email, validate_slug
from django.db import transaction

from notifications.models import EmailRecipient, NotificationList, SmtpConfiguration
from sites.models import Site

SMTP_FIELDS = {
    "host": str, "port": int, "security": str, "username": str, "password": str,
    "from_address": str, "timeout_seconds": int, "max_retries": int, "retry_interval_seconds": int,
}  # fmt: skip
SMTP_REQUIRED = ("host", "from_address")
LIST_FIELDS = {"name", "description", "email"}
SITE_FIELDS = {"site_id", "name", "active"}


class ConfigFileError(Exception):
    """The file is invalid; ``problems`` lists every problem, each naming its entry."""

    def __init__(self, problems):
        self.problems = problems
        super().__init__("\n".join(problems))


def _validate_smtp(smtp, problems):
    if not isinstance(smtp, dict):
        problems.append("smtp: must be an object.")
        return
    for name in sorted(set(smtp) - set(SMTP_FIELDS)):
        problems.append(f"smtp.{name}: unknown field.")
    for name in SMTP_REQUIRED:
        if not smtp.get(name):
            problems.append(f"smtp.{name}: is required.")
    for name, kind in SMTP_FIELDS.items():
        if name in smtp and (not isinstance(smtp[name], kind) or isinstance(smtp[name], bool)):
            problems.append(f"smtp.{name}: must be {'an integer' if kind is int else 'a string'}.")
    if isinstance(smtp.get("security"), str) and smtp["security"] not in SmtpConfiguration.Security.values:
        allowed = ", ".join(SmtpConfiguration.Security.values)
        problems.append(f"smtp.security: {smtp['security']!r} is not one of {allowed}.")
    if isinstance(smtp.get("port"), int) and not 1 <= smtp["port"] <= 65535:
        problems.append(f"smtp.port: {smtp['port']} is not between 1 and 65535.")
    for name in ("timeout_seconds", "retry_interval_seconds"):
        if isinstance(smtp.get(name), int) and smtp[name] < 1:
            problems.append(f"smtp.{name}: must be at least 1.")
    if isinstance(smtp.get("max_retries"), int) and smtp["max_retries"] < 0:
        problems.append("smtp.max_retries: must not be negative.")
    if isinstance(smtp.get("from_address"), str) and smtp["from_address"]:
        try:
            validate_email(smtp["from_address"])
        except ValidationError:
            problems.append(f"smtp.from_address: {smtp['from_address']!r} is not a valid email address.")


def _validate_lists(lists, problems):
    if not isinstance(lists, list):
        problems.append("lists: must be a list.")
        return
    seen = {}
    for index, entry in enumerate(lists):
        where = f"lists[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object.")
            continue
        name = entry.get("name")
        if isinstance(name, str) and name.strip():
            where = f"lists[{index}] ({name!r})"
            if name.lower() in seen:
                problems.append(f"{where}: duplicate of lists[{seen[name.lower()]}] (names are case-insensitive).")
            seen[name.lower()] = index
            if len(name) > 200:
                problems.append(f"{where}.name: must be at most 200 characters.")
        else:
            problems.append(f"{where}.name: is required and must be a non-blank string.")
        for field in sorted(set(entry) - LIST_FIELDS):
            problems.append(f"{where}.{field}: unknown field.")
        if not isinstance(entry.get("description", ""), str):
            problems.append(f"{where}.description: must be a string.")
        emails = entry.get("email", [])
        if not isinstance(emails, list):
            problems.append(f"{where}.email: must be a list of addresses.")
            continue
        lowered = set()
        for position, address in enumerate(emails):
            try:
                if not isinstance(address, str):
                    raise ValidationError("not a string")
                validate_email(address)
            except ValidationError:
                problems.append(f"{where}.email[{position}]: {address!r} is not a valid email address.")
                continue
            if address.lower() in lowered:
                problems.append(f"{where}.email[{position}]: {address!r} is listed twice.")
            lowered.add(address.lower())


def _validate_sites(sites, problems):
    if not isinstance(sites, list):
        problems.append("sites: must be a list.")
        return
    seen = set()
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


def configuration_validate(*, data):
    """Every problem in ``data`` (a parsed file), each naming its entry; empty when valid."""
    problems = []
    if not isinstance(data, dict):
        return ["The file must contain a JSON object with keys smtp, lists, sites."]
    for key in sorted(set(data) - {"smtp", "lists", "sites"}):
        problems.append(f"{key}: unknown section (expected smtp, lists, sites).")
    if "smtp" in data and data["smtp"] is not None:
        _validate_smtp(data["smtp"], problems)
    if "lists" in data:
        _validate_lists(data["lists"], problems)
    if "sites" in data:
        _validate_sites(data["sites"], problems)
    return problems


@transaction.atomic
def configuration_import(*, data):
    """Apply a configuration file; returns a summary of what changed. Raises ConfigFileError
    (and changes nothing) when the file is invalid."""
    problems = configuration_validate(data=data)
    if problems:
        raise ConfigFileError(problems)
    summary = {"smtp": None, "lists_created": 0, "lists_updated": 0, "sites_created": 0, "sites_updated": 0}

    smtp = data.get("smtp")
    if smtp:
        config = SmtpConfiguration.current() or SmtpConfiguration()
        summary["smtp"] = "updated" if config.pk else "created"
        for name in SMTP_FIELDS:
            if name == "password":
                # Export leaves the password out; an absent or empty one keeps the stored secret.
                if smtp.get("password"):
                    config.password = smtp["password"]
            elif name in smtp:
                setattr(config, name, smtp[name])
        config.save()

    for entry in data.get("lists", []):
        notification_list = NotificationList.objects.filter(name__iexact=entry["name"]).first()
        if notification_list is None:
            notification_list = NotificationList(name=entry["name"])
            summary["lists_created"] += 1
        else:
            summary["lists_updated"] += 1
        notification_list.name = entry["name"]
        notification_list.description = entry.get("description", notification_list.description)
        notification_list.save()
        notification_list.email_recipients.all().delete()
        EmailRecipient.objects.bulk_create(
            EmailRecipient(notification_list=notification_list, email=address) for address in entry.get("email", [])
        )

    for entry in data.get("sites", []):
        site = Site.objects.filter(site_id=entry["site_id"]).first()
        if site is None:
            site = Site(site_id=entry["site_id"], name=entry.get("name") or entry["site_id"])
            summary["sites_created"] += 1
        else:
            summary["sites_updated"] += 1
        site.name = entry.get("name", site.name) or site.site_id
        site.active = entry.get("active", site.active)
        site.save()
    return summary


def configuration_export():
    """The current configuration in the file's shape, without secrets."""
    data = {"smtp": None, "lists": [], "sites": []}
    config = SmtpConfiguration.current()
    if config is not None:
        data["smtp"] = {name: getattr(config, name) for name in SMTP_FIELDS if name != "password"}
    for notification_list in NotificationList.objects.prefetch_related("email_recipients"):
        data["lists"].append(
            {
                "name": notification_list.name,
                "description": notification_list.description,
                "email": [recipient.email for recipient in notification_list.email_recipients.all()],
            }
        )
    for site in Site.objects.all():
        data["sites"].append({"site_id": site.site_id, "name": site.name, "active": site.active})
    return data
