"""The notification lists' tools in the console: who a notification to a list would reach on each
channel, a test notification to a list (created through the ingest path, as a site's would be),
and many recipient addresses pasted at once."""

import uuid
from dataclasses import dataclass
from email.utils import getaddresses
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
    also separate); blank lines are skipped, repeats kept once (ignoring case). What a mail
    program copies is understood: ``Robert Ito <r.ito@example.com>`` and Outlook's
    ``Ito, Robert <r.ito@example.com>; Dubois, Pierre <…>`` give the addresses (the names are
    not kept). Each problem names its line."""
    addresses: list[str] = []
    problems: list[str] = []
    seen: set[str] = set()
    lines = text.splitlines()
    if len(lines) > PASTE_MAX_LINES:
        return [], [f"Paste at most {PASTE_MAX_LINES} lines at a time ({len(lines)} were pasted)."]
    for number, line in enumerate(lines, start=1):
        for address in _line_addresses(line):
            problem = _pasted_address_problem(address)
            if problem:
                where = f" (in “{line.strip()[:80]}”)" if address != line.strip() else ""
                problems.append(f"Line {number}: {problem[:-1]}{where}.")
            elif address.lower() not in seen:
                seen.add(address.lower())
                addresses.append(address)
    return addresses, problems


def address_pasted(text: str) -> str:
    """The one address in ``text`` as a mail program copies it ("Robert Ito <r.ito@…>"), or
    ``text`` itself stripped when it is not that (the caller's validation then says why)."""
    found = _line_addresses(text)
    return found[0] if len(found) == 1 else text.strip()


def _line_addresses(line: str) -> list[str]:
    """The addresses of one pasted line, by the mail header rules (email.utils.getaddresses).
    An unquoted "Last, First <address>" parses as a bare "Last" and then "First <address>": a
    bare word without "@" right before a named address is that name's first half, not an
    address. A line of bare addresses is split as typed, so that a problem quotes it whole."""
    if "<" not in line and '"' not in line:
        return [part.strip() for part in line.replace(";", ",").split(",") if part.strip()]
    entries = getaddresses([line.replace(";", ",")])
    found = []
    for index, (name, address) in enumerate(entries):
        address = address.strip()
        if not address:
            continue
        following = entries[index + 1] if index + 1 < len(entries) else ("", "")
        if not name and "@" not in address and following[0] and following[1]:
            continue
        found.append(address)
    return found


def _pasted_address_problem(address: str) -> str | None:
    try:
        validate_email(address)
    except ValidationError:
        return f"“{address[:80]}” is not an email address."
    if len(address) > EmailRecipient._meta.get_field("email").max_length:  # type: ignore[operator]
        return f"“{address[:80]}…” is too long for an address."
    return None


def list_add_addresses(*, notification_list: NotificationList, addresses: list[str]) -> tuple[list[str], list[str]]:
    """Add the addresses not yet in the list (ignoring case); ``(added, already_there)``."""
    present = {email.lower() for email in notification_list.email_recipients.values_list("email", flat=True)}
    added = [address for address in addresses if address.lower() not in present]
    already = [address for address in addresses if address.lower() in present]
    EmailRecipient.objects.bulk_create(
        [EmailRecipient(notification_list=notification_list, email=address) for address in added]
    )
    return added, already
