"""Acknowledgement and clearing of notifications (docs/acknowledgement.md).

*Acknowledged*: a person has seen the notification (by the link in the message, an SMS reply,
the Teams card, the console, the staff API, or the site's own HMI). *Cleared*: the alarm
returned to normal at the plant. Either one stops escalation; only the first of each counts.

A notification and its escalation children (rows whose ``escalation_of`` names it) are one
*family*: acknowledging or clearing any member records it on every member not yet
acknowledged (cleared) and stops the parent's escalation (``escalation_due_at`` set to NULL).
Each call is one transaction: the parent's row is locked first, then its children, so an
escalation step being created at the same moment either sees the acknowledgement or is seen
by it.

Whether a notification asks for acknowledgement at all (``asks_ack``) is decided when central
creates it (ingest), from its list's ``ack_required_from`` (:func:`asks_ack`, with the lists'
settings of :func:`list_settings_by_key`: a list's change applies to notifications created from
a few seconds later).
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import OperationalError, connection, transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal, receiver

from notifications.channel_targets import text_site_masked
from notifications.db import database_now
from notifications.list_names import list_name_key
from notifications.metrics import time_to_ack_observe
from notifications.models import (
    AcknowledgedVia,
    AckRequiredFrom,
    Notification,
    NotificationList,
    NotificationPriority,
)

MAX_NOTE_LENGTH = 2000
MAX_BY_LENGTH = 200
DEFAULT_ACK_REQUIRED_FROM = AckRequiredFrom.HIGH

# Sent once the transaction that acknowledged a family has committed, with ``notification``:
# the family's parent as it now is (so the site that raised it can be told).
notification_acknowledged = Signal()


@dataclass(frozen=True)
class AckOutcome:
    """What :func:`acknowledge` or :func:`clear` did. ``notification``: the given row afterwards
    (None: no such notification, or not the calling site's). ``changed``: this call recorded
    it; False when it already was acknowledged (cleared) — the row says by whom and when."""

    notification: Notification | None
    changed: bool = False


def asks_ack(*, priority: int, ack_required_from: str | None) -> bool:
    """Whether a notification of ``priority`` to a list with ``ack_required_from`` asks for
    acknowledgement (a list that is not configured counts as the default, ``high``)."""
    if ack_required_from == AckRequiredFrom.NONE:
        return False
    # The other values are the names of the lowest priority that asks.
    lowest = NotificationPriority.named(ack_required_from or DEFAULT_ACK_REQUIRED_FROM)
    return priority >= (NotificationPriority.HIGH if lowest is None else lowest)


class ListSettings(NamedTuple):
    """What ingest decides from a list when it creates a notification: whether it asks for
    acknowledgement (``ack_required_from``) and its escalation (notifications.escalation)."""

    ack_required_from: str
    escalation: Any
    repeat_last_every_seconds: int


# Each list's settings by its name's comparison key, as read at a time (monotonic). Ingest
# needs them for every notification, and reading the lists on every post costs as much as the
# insert itself (measured: 2.6 ms a single-post ingest without the read, 7.5 ms with it, 30
# lists, PostgreSQL on loopback); so they are read at most every LIST_SETTINGS_CACHE_SECONDS
# per process, and at once after this process saved or deleted a list.
LIST_SETTINGS_CACHE_SECONDS = 5.0
_list_settings: tuple[float, dict[str, ListSettings]] | None = None
_list_settings_lock = threading.Lock()


def list_settings_by_key() -> dict[str, ListSettings]:
    """``{list_name_key(name): ListSettings}`` of every list (the first list of a key, as
    notifications.list_names resolves names), at most LIST_SETTINGS_CACHE_SECONDS old."""
    global _list_settings
    with _list_settings_lock:
        if _list_settings is not None and time.monotonic() - _list_settings[0] < LIST_SETTINGS_CACHE_SECONDS:
            return _list_settings[1]
        by_key: dict[str, ListSettings] = {}
        rows = NotificationList.objects.order_by("pk").values_list(
            "name", "ack_required_from", "escalation", "repeat_last_every_seconds"
        )
        for name, asked_from, escalation, repeat in rows:
            by_key.setdefault(list_name_key(name), ListSettings(asked_from, escalation, repeat))
        _list_settings = (time.monotonic(), by_key)
        return by_key


@receiver([post_save, post_delete], sender=NotificationList)
def list_settings_forget(**kwargs: Any) -> None:
    """A list was saved or deleted in this process: read the lists' settings afresh."""
    global _list_settings
    with _list_settings_lock:
        _list_settings = None


def _family_locked(notification_id: Any, *, site_id: str | None) -> tuple[Notification | None, list[Notification]]:
    """The given row and its whole family, locked parent first (the caller holds a transaction).
    (None, []) when there is no such row or it is not ``site_id``'s."""
    given = Notification.objects.filter(pk=notification_id)
    if site_id is not None:
        given = given.filter(source_site_id=site_id)
    row = given.only("notification_id", "escalation_of").first()
    if row is None:
        return None, []
    root = row.escalation_of or row.notification_id
    parent = list(Notification.objects.select_for_update().filter(pk=root))
    children = list(Notification.objects.select_for_update().filter(escalation_of=root).order_by("pk"))
    family = parent + children
    given_row = next((member for member in family if member.pk == row.pk), None)
    return given_row, family


DEADLOCK = "40P01"
DEADLOCK_TRIES = 3


def _retrying_deadlocks(work: Callable[[], AckOutcome]) -> AckOutcome:
    """``work()`` (one transaction), run again when PostgreSQL chose it as the victim of a
    deadlock: a dispatcher finishing a batch that holds a parent and its step in another order
    than this family's lock may meet it. Inside an outer transaction it is run once (a deadlock
    aborts the outer one too)."""
    for attempt in range(1, DEADLOCK_TRIES + 1):
        try:
            return work()
        except OperationalError as error:
            deadlock = getattr(error.__cause__, "sqlstate", None) == DEADLOCK
            if not deadlock or attempt == DEADLOCK_TRIES or connection.in_atomic_block:
                raise
    raise AssertionError("unreachable")


def _history(user: Any, rows: list[Notification], message: str) -> None:
    """An admin history entry for ``rows`` when a console or staff-API user acted; the row's own
    fields are the record of every other acknowledgement."""
    if rows and user is not None and getattr(user, "is_authenticated", False):
        LogEntry.objects.log_actions(user_id=user.pk, queryset=rows, action_flag=CHANGE, change_message=message)


def acknowledge(
    notification_id: Any,
    *,
    via: str,
    by: str,
    note: str = "",
    site_id: str | None = None,
    user: Any = None,
) -> AckOutcome:
    """Acknowledge a notification (and its family, see the module): ``via`` one of
    AcknowledgedVia, ``by`` who (a name, an address, a number, a user name or the site), an
    optional ``note``. The first acknowledgement stands: a later one changes nothing and the
    outcome's row says who and when. ``site_id``: only that site's notifications are found.
    ``user``: the console or staff user, for the admin history. ValueError for an unknown
    ``via`` or an empty ``by``."""
    if via not in AcknowledgedVia.values:
        raise ValueError(f"unknown acknowledgement route {via!r}")
    by = (by or "").strip()[:MAX_BY_LENGTH]
    if not by:
        raise ValueError("Who acknowledged it is required.")
    note = (note or "").strip()[:MAX_NOTE_LENGTH]
    return _retrying_deadlocks(
        lambda: _family_acknowledge(notification_id, via=via, by=by, note=note, site_id=site_id, user=user)
    )


def _family_acknowledge(
    notification_id: Any, *, via: str, by: str, note: str, site_id: str | None, user: Any
) -> AckOutcome:
    with transaction.atomic():
        given, family = _family_locked(notification_id, site_id=site_id)
        if given is None:
            return AckOutcome(notification=None)
        if given.acknowledged_at is not None:
            return AckOutcome(notification=given)
        now = database_now()
        fresh = [member for member in family if member.acknowledged_at is None]
        Notification.objects.filter(pk__in=[member.pk for member in fresh]).update(
            acknowledged_at=now, acknowledged_by=by, acknowledged_via=via, acknowledged_note=note
        )
        Notification.objects.filter(pk=family[0].pk, escalation_of__isnull=True).update(escalation_due_at=None)
        for member in fresh:
            member.acknowledged_at, member.acknowledged_by = now, by
            member.acknowledged_via, member.acknowledged_note = via, note
        family[0].escalation_due_at = None
        _history(user, fresh, f"Acknowledged via {via} by {by}" + (f": {note}" if note else ""))
        parent = family[0]
        if parent in fresh:  # counted and announced once per family, when its parent is acknowledged
            seconds = (now - parent.created_at).total_seconds()
            transaction.on_commit(lambda: _acknowledged(parent, seconds))
    return AckOutcome(notification=given, changed=True)


def _acknowledged(parent: Notification, seconds: float) -> None:
    """After the commit: count the time to acknowledge, tell the receivers of the signal."""
    time_to_ack_observe(seconds)
    notification_acknowledged.send(sender=Notification, notification=parent)


def clear(notification_id: Any, *, note: str = "", site_id: str | None = None, user: Any = None) -> AckOutcome:
    """Record that the alarm returned to normal at the plant, on the notification's family (see
    the module). Stops escalation; is not an acknowledgement. The first clearing stands.
    ``site_id``: only that site's notifications are found."""
    note = (note or "").strip()[:MAX_NOTE_LENGTH]
    return _retrying_deadlocks(lambda: _family_clear(notification_id, note=note, site_id=site_id, user=user))


def _family_clear(notification_id: Any, *, note: str, site_id: str | None, user: Any) -> AckOutcome:
    with transaction.atomic():
        given, family = _family_locked(notification_id, site_id=site_id)
        if given is None:
            return AckOutcome(notification=None)
        if given.cleared_at is not None:
            return AckOutcome(notification=given)
        now = database_now()
        fresh = [member for member in family if member.cleared_at is None]
        Notification.objects.filter(pk__in=[member.pk for member in fresh]).update(cleared_at=now, cleared_note=note)
        Notification.objects.filter(pk=family[0].pk, escalation_of__isnull=True).update(escalation_due_at=None)
        for member in fresh:
            member.cleared_at, member.cleared_note = now, note
        family[0].escalation_due_at = None
        _history(user, fresh, "Cleared (returned to normal at the site)" + (f": {note}" if note else ""))
    return AckOutcome(notification=given, changed=True)


def acknowledged_by_site_masked(*, acknowledged_by: str, acknowledged_via: str) -> str:
    """``acknowledged_by`` as a site (or its agent) sees it, masked like targets: an address as
    ``o***@example.com``, a number as ``+49***456``; a person's or user's name as its first
    letter and ``***``. What the site itself said (via ``site``) is shown as it was given."""
    if not acknowledged_by or acknowledged_via == AcknowledgedVia.SITE:
        return acknowledged_by
    masked = text_site_masked(acknowledged_by)
    if masked != acknowledged_by:
        return masked
    return acknowledged_by[0] + "***"


def acknowledgement_record(notification: Any, *, staff: bool) -> dict[str, Any]:
    """The status record's acknowledgement and clearing fields (null until then). For a site
    (``staff`` false) who acknowledged is masked (:func:`acknowledged_by_site_masked`), and so
    are addresses and numbers in the note."""
    by = getattr(notification, "acknowledged_by", "") or ""
    via = getattr(notification, "acknowledged_via", "") or ""
    acknowledged_at: datetime | None = getattr(notification, "acknowledged_at", None)
    cleared_at: datetime | None = getattr(notification, "cleared_at", None)
    return {
        "asks_ack": bool(getattr(notification, "asks_ack", False)),
        "acknowledged_at": _iso(acknowledged_at),
        "acknowledged_by": (by if staff else acknowledged_by_site_masked(acknowledged_by=by, acknowledged_via=via))
        if acknowledged_at
        else None,
        "acknowledged_via": via if acknowledged_at else None,
        "acknowledged_note": _note(getattr(notification, "acknowledged_note", ""), staff=staff)
        if acknowledged_at
        else None,
        "cleared_at": _iso(cleared_at),
        "cleared_note": (getattr(notification, "cleared_note", "") or "") if cleared_at else None,
    }


def _note(note: str | None, *, staff: bool) -> str:
    """A note as the status record shows it: for a site, with addresses and numbers masked."""
    return (note or "") if staff else text_site_masked(note or "")


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None
