"""The notification lists' tools in the console: who a notification to a list would reach on each
channel, a test notification to a list (created through the ingest path, as a site's would be),
and many recipient addresses pasted at once."""

import uuid
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from notifications.adapters import adapter_for
from notifications.ingest import notification_validate, notifications_ingest
from notifications.models import EmailRecipient, NotificationList
from notifications.vocabulary import ADAPTER_PATHS

# Test notifications are ingested as from this pseudo-site, with this script name: the outbox
# page finds them by either, and they are never mistaken for a real site's alarm.
CONSOLE_SITE_ID = "console"
TEST_SCRIPT = "console-test"
TEST_SUBJECT_PREFIX = "[TEST] "
PASTE_MAX_LINES = 1000


@dataclass(frozen=True)
class ChannelRecipients:
    """Who a notification of ``channel`` to the list would be delivered to."""

    channel: str
    targets: list[str]
    recipient_mode: str | None


def list_recipients_preview(*, notification_list: NotificationList) -> list[ChannelRecipients]:
    """For email and each other channel the list holds targets for, the targets its adapter
    resolves for this list's name — the same resolution delivery uses. Targets are shown as
    delivery records them (secrets masked)."""
    preview = []
    for channel in sorted(ADAPTER_PATHS):
        resolved = adapter_for(channel).resolve_targets(list_names={notification_list.name})
        targets = resolved.get(notification_list.name)
        if targets is None:
            # Names match ignoring case; take the list's entry whatever its key's case.
            targets = next(iter(resolved.values()), [])
        if not targets and channel != "email":
            continue  # a channel this list does not use
        preview.append(
            ChannelRecipients(
                channel=channel,
                targets=[str(target) for target in targets],
                recipient_mode=getattr(targets, "recipient_mode", None),
            )
        )
    return preview


class TestNotificationError(Exception):
    """The test notification was refused; the message says why, in words."""


def list_send_test(
    *, notification_list: NotificationList, channel: str, subject: str, body: str, username: str
) -> uuid.UUID:
    """Create one test notification to ``notification_list`` through ingest's own validation and
    insert (site ``console``, script ``console-test``, subject starting "[TEST] "). The
    dispatcher delivers it like any other. Returns its id."""
    subject = subject.strip()
    data: dict[str, Any] = {
        "notification_id": str(uuid.uuid4()),
        "type": channel,
        "list_name": notification_list.name,
        "subject": subject if subject.startswith(TEST_SUBJECT_PREFIX) else TEST_SUBJECT_PREFIX + subject,
        "body": body,
        "source_instance_id": f"console user {username}"[:200],
        "source_script": TEST_SCRIPT,
    }
    valid, rejection = notification_validate(data, site_id=CONSOLE_SITE_ID)
    if rejection is not None:
        problems = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in rejection.errors.items())
        raise TestNotificationError(f"The test notification was refused ({problems}).")
    assert valid is not None
    [outcome] = notifications_ingest(site_id=CONSOLE_SITE_ID, inputs=[valid])
    if outcome.result != "created":
        raise TestNotificationError(f"The test notification was not stored ({outcome.result}); try again.")
    return valid.notification_id


def addresses_parse(text: str) -> tuple[list[str], list[str]]:
    """``(addresses, problems)`` from pasted text, one address per line (commas and semicolons
    also separate); blank lines are skipped, repeats kept once (ignoring case). Each problem
    names its line."""
    addresses: list[str] = []
    problems: list[str] = []
    seen: set[str] = set()
    lines = text.splitlines()
    if len(lines) > PASTE_MAX_LINES:
        return [], [f"Paste at most {PASTE_MAX_LINES} lines at a time ({len(lines)} were pasted)."]
    for number, line in enumerate(lines, start=1):
        for part in line.replace(";", ",").split(","):
            address = part.strip().strip("<>").strip()
            if not address:
                continue
            try:
                validate_email(address)
            except ValidationError:
                problems.append(f"Line {number}: “{address[:80]}” is not an email address.")
                continue
            if len(address) > EmailRecipient._meta.get_field("email").max_length:  # type: ignore[operator]
                problems.append(f"Line {number}: “{address[:80]}…” is too long for an address.")
                continue
            if address.lower() not in seen:
                seen.add(address.lower())
                addresses.append(address)
    return addresses, problems


def list_add_addresses(*, notification_list: NotificationList, addresses: list[str]) -> tuple[list[str], list[str]]:
    """Add the addresses not yet in the list (ignoring case); ``(added, already_there)``."""
    present = {email.lower() for email in notification_list.email_recipients.values_list("email", flat=True)}
    added = [address for address in addresses if address.lower() not in present]
    already = [address for address in addresses if address.lower() in present]
    EmailRecipient.objects.bulk_create(
        [EmailRecipient(notification_list=notification_list, email=address) for address in added]
    )
    return added, already
