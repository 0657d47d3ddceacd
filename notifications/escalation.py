"""Escalation (docs/escalation.md): a notification that asks for acknowledgement and is neither
acknowledged nor cleared some time after central created it goes on, as a child notification,
to the next list of its own list's steps, by that step's channel.

* A list's ``escalation`` is an ordered list of steps ``{"after_seconds", "list", "type"}``;
  each step's ``after_seconds`` counts from when central **created** the notification (not from
  its delivery), so escalation is also the failover path: a notification that cannot be
  delivered at all (relay down, channel open, parked) still reaches the next step's list.
  ``repeat_last_every_seconds`` repeats the last step that often until someone acknowledges.
* The parent holds when its next step is due (``escalation_due_at``; None: no step left, or
  stopped) and, once its escalation started, ``escalation_step`` 0. Ingest sets the first due
  time (:func:`notifications_escalation_start`); the dispatch pass creates the children that are
  due (:func:`notifications_escalate_due`) and the waiting worker wakes for the earliest due
  time (:func:`escalations_next_due`), so a step is taken within seconds of its time.
* A child is a new notification (``escalation_of`` = the parent's id, ``escalation_step`` = n,
  the same site, priority and source, subject ``[Escalation n] …``) that always asks for
  acknowledgement and never starts its own list's escalation. Each step is taken exactly once:
  the parent is locked while its child is created and its next due time set, in one
  transaction, and a unique constraint holds one child per parent and step.
* Acknowledging or clearing stops the steps (the acknowledgement sets ``escalation_due_at`` to
  None; the pass also drops the due time of any row it finds acknowledged, cleared or in one of
  :data:`ESCALATION_STOPPING_STATUSES`).
"""

import hashlib
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max, Q

from notifications import db
from notifications.acknowledgement import ListSettings, asks_ack
from notifications.clock import database_now
from notifications.list_names import list_name_key, notification_lists_by_name
from notifications.models import Notification, NotificationList

logger = logging.getLogger(__name__)

# A row in one of these statuses never escalates: its due time is dropped when it falls due.
# (Discarding also drops it at once: notifications.operations.)
ESCALATION_STOPPING_STATUSES: tuple[str, ...] = (Notification.Status.DISCARDED, Notification.Status.SUPPRESSED)
# Parents escalated per transaction: a batch holds its parents locked for about one insert and
# one update of this many rows.
ESCALATION_BATCH = 200
SUBJECT_PREFIX = "[Escalation {step}] "
SUBJECT_LIMIT = Notification._meta.get_field("subject").max_length or 255
STEP_KEYS = frozenset({"after_seconds", "list", "type"})
# What of a parent its step reads (the rest, attempts' outcomes among them, stays in the table).
PARENT_FIELDS = (
    "notification_id",
    "type",
    "list_name",
    "subject",
    "body",
    "type_data",
    "priority",
    "source_site_id",
    "source_instance_id",
    "source_script",
    "site_enqueued_at",
    "created_at",
    "escalation_due_at",
)


@dataclass(frozen=True)
class EscalationStep:
    """Step ``number`` (from 1) of a list's escalation: after ``after_seconds`` from creation,
    to ``list_name`` by ``type``."""

    number: int
    after_seconds: int
    list_name: str
    type: str


def escalation_steps(notification_list: NotificationList | ListSettings | None) -> list[EscalationStep]:
    """The list's escalation steps, numbered from 1, in order; malformed entries (the admin and
    the configuration file refuse them) end the steps there rather than guess."""
    steps: list[EscalationStep] = []
    entries = getattr(notification_list, "escalation", None)
    for number, entry in enumerate(entries if isinstance(entries, list) else [], start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("after_seconds"), int):
            break
        steps.append(
            EscalationStep(
                number=number,
                after_seconds=entry["after_seconds"],
                list_name=str(entry.get("list", "")),
                type=str(entry.get("type", "")),
            )
        )
    return steps


def escalation_step(notification_list: NotificationList | ListSettings | None, number: int) -> EscalationStep | None:
    """Step ``number`` of the list's escalation: one of its steps, or past the last one its last
    step repeated (when the list repeats it), else None."""
    steps = escalation_steps(notification_list)
    if not steps or number < 1:
        return None
    if number <= len(steps):
        return steps[number - 1]
    if not getattr(notification_list, "repeat_last_every_seconds", 0):
        return None
    last = steps[-1]
    return EscalationStep(number=number, after_seconds=last.after_seconds, list_name=last.list_name, type=last.type)


# --- starting: at ingest --------------------------------------------------------------------------


def escalation_first_after(*, priority: int, list_settings: ListSettings | None) -> int | None:
    """Seconds after its creation that a new notification of ``priority`` to a list with these
    settings (notifications.acknowledgement.list_settings_by_key; None: no such list) takes its
    first escalation step; None when it does not escalate (it does not ask for acknowledgement,
    or its list has no steps)."""
    if list_settings is None or not asks_ack(priority=priority, ack_required_from=list_settings.ack_required_from):
        return None
    first = escalation_step(list_settings, 1)
    return None if first is None else first.after_seconds


def notifications_escalation_start(*, created: Mapping[Any, tuple[datetime, int]]) -> int:
    """Start the escalation of notifications just created: ``{notification_id: (created_at,
    first step's after_seconds)}``. Sets each one's first due time (and ``escalation_step`` 0:
    a parent whose escalation started). Run in the transaction that inserted them, so that a
    notification is never committed without its due time. Returns how many rows it set."""
    by_due: dict[datetime, list[Any]] = {}
    for notification_id, (created_at, after_seconds) in created.items():
        by_due.setdefault(created_at + timedelta(seconds=after_seconds), []).append(notification_id)
    changed = 0
    for due, ids in by_due.items():
        changed += Notification.objects.filter(pk__in=ids).update(escalation_due_at=due, escalation_step=0)
    return changed


# --- the due pass: in the worker --------------------------------------------------------------------


def _stopped_q() -> Q:
    return (
        Q(acknowledged_at__isnull=False)
        | Q(cleared_at__isnull=False)
        | Q(status__in=ESCALATION_STOPPING_STATUSES)
        | Q(escalation_of__isnull=False)  # a child never escalates
    )


def escalations_next_due(*, now: datetime | None = None) -> datetime | None:
    """The earliest due time of a step (one read of the due-time index); None when no step
    waits. A row that should not escalate any more counts until a pass drops its due time.
    (``now`` is the signature of the wake time's sources; a step already due is due now.)"""
    return (
        Notification.objects.filter(escalation_due_at__isnull=False)
        .order_by("escalation_due_at")
        .values_list("escalation_due_at", flat=True)
        .first()
    )


@dataclass
class EscalationReport:
    """What a due pass did: children created, parents whose steps ended or stopped."""

    created: int = 0
    stopped: int = 0

    def __str__(self) -> str:
        return f"escalated {self.created}" + (f", {self.stopped} stopped" if self.stopped else "")


def notifications_escalate_due(*, now: datetime | None = None, batch_size: int = ESCALATION_BATCH) -> EscalationReport:
    """Take every escalation step due at ``now`` (default: the database clock): for each parent
    due, neither acknowledged nor cleared nor stopped, create its next child and set its next
    due time (the next step's, the repeat's, or None), in batches of ``batch_size`` parents, one
    transaction each. Parents locked by another worker are left to it. The due times of rows
    that should not escalate any more are dropped. Returns an :class:`EscalationReport`."""
    now = now or database_now()
    report = EscalationReport()
    report.stopped = (
        Notification.objects.filter(escalation_due_at__lte=now).filter(_stopped_q()).update(escalation_due_at=None)
    )
    while True:
        created, taken = _escalate_batch(now=now, batch_size=batch_size)
        report.created += created
        report.stopped += taken - created
        if taken < batch_size:
            return report


def _escalate_batch(*, now: datetime, batch_size: int) -> tuple[int, int]:
    """One batch: returns (children created, parents taken)."""
    with transaction.atomic():
        parents = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(escalation_due_at__lte=now)
            .exclude(_stopped_q())
            .order_by("escalation_due_at")
            .only(*PARENT_FIELDS)[:batch_size]
        )
        if not parents:
            return 0, 0
        lists = notification_lists_by_name(names={parent.list_name for parent in parents})
        done = dict(
            Notification.objects.filter(escalation_of__in=[parent.pk for parent in parents])
            .values("escalation_of")
            .annotate(last=Max("escalation_step"))
            .values_list("escalation_of", "last")
        )
        children: list[dict[str, Any]] = []
        next_due: dict[Any, list[Any]] = {}  # the parents by their next due time (None: no step left)
        for parent in parents:
            notification_list = lists.get(parent.list_name)
            step = escalation_step(notification_list, done.get(parent.pk, 0) + 1)
            if step is not None:
                children.append(_child(parent, step=step))
            due = None if step is None else _next_due(parent, notification_list, after=step, now=now)
            next_due.setdefault(due, []).append(parent.pk)
        # The project's one-statement insert (ingest's): Django's bulk_create and bulk_update
        # cost about 5 ms a parent in Python, measured with 1,000 steps due at once
        # (docs/performance.md). Children take the statement's time as created_at.
        db.insert_ignoring_conflicts(Notification, children, stamped=("created_at", "next_attempt_at"))
        for due, ids in next_due.items():
            Notification.objects.filter(pk__in=ids).update(escalation_due_at=due)
    for child in children:
        logger.info(
            "escalation step %s of %s: %s to %s by %s",
            child["escalation_step"],
            child["escalation_of"],
            child["notification_id"],
            child["list_name"],
            child["type"],
            extra={"notification_id": str(child["notification_id"]), "channel": child["type"], "outcome": "escalated"},
        )
    return len(children), len(parents)


def _next_due(
    parent: Notification, notification_list: NotificationList | None, *, after: EscalationStep, now: datetime
) -> datetime | None:
    """When the step after ``after`` is due: a next step counts from the parent's creation; a
    repeat from the step it repeats (from now if that is already past: a worker that was
    stopped for long does not make up every repeat it missed)."""
    following = escalation_step(notification_list, after.number + 1)
    if following is None:
        return None
    if following.number <= len(escalation_steps(notification_list)):
        return parent.created_at + timedelta(seconds=following.after_seconds)
    repeat = timedelta(seconds=getattr(notification_list, "repeat_last_every_seconds", 0))
    due = (parent.escalation_due_at or now) + repeat
    return due if due > now else now + repeat


def _child(parent: Notification, *, step: EscalationStep) -> dict[str, Any]:
    """Step ``step`` of ``parent``: the columns of a new Pending notification (the others take
    their defaults; its creation and first due time are the insert's)."""
    return {
        "notification_id": uuid.uuid4(),
        "type": step.type,
        "list_name": step.list_name,
        "subject": (SUBJECT_PREFIX.format(step=step.number) + parent.subject)[:SUBJECT_LIMIT],
        "body": parent.body,
        # type_data belongs to a channel: a child on another channel starts without it.
        "type_data": parent.type_data if step.type == parent.type else {},
        "priority": parent.priority,
        "source_site_id": parent.source_site_id,
        "source_instance_id": parent.source_instance_id,
        "source_script": parent.source_script,
        "site_enqueued_at": parent.site_enqueued_at,
        "fingerprint": hashlib.sha256(f"escalation\x00{parent.pk}\x00{step.number}".encode()).hexdigest(),
        "asks_ack": True,
        "escalation_of": parent.pk,
        "escalation_step": step.number,
    }


# --- reading -----------------------------------------------------------------------------------------


def notification_escalations(notification: Any) -> list[dict[str, Any]]:
    """A parent's children for its status record, in step order: ``{step, notification_id,
    list_name, type, status, created_at}`` (created_at a datetime). Empty (without a query) for
    a notification whose escalation never started."""
    if getattr(notification, "escalation_step", None) != 0:
        return []
    children = Notification.objects.filter(escalation_of=notification.pk).order_by("escalation_step")
    return [
        {
            "step": child.escalation_step,
            "notification_id": str(child.pk),
            "list_name": child.list_name,
            "type": child.type,
            "status": child.status,
            "created_at": child.created_at,
        }
        for child in children.only("pk", "escalation_step", "list_name", "type", "status", "created_at")
    ]


# --- validation: the admin and the configuration file -----------------------------------------------

# Where each channel's targets of a list are (the related name on NotificationList).
CHANNEL_TARGETS = {
    "email": "email_recipients",
    "teams": "teams_targets",
    "webhook": "webhook_targets",
    "sms": "sms_targets",
    "apprise": "apprise_targets",
}


@dataclass(frozen=True)
class ListsEscalation:
    """Every list's escalation steps and the channels it has targets for, by list name: what
    :func:`escalation_problems` checks a list's steps against."""

    steps: dict[str, Any]
    channels: dict[str, set[str]]


def lists_escalation_stored() -> ListsEscalation:
    """The stored lists' steps and channels with targets (a query per channel)."""
    names = dict(NotificationList.objects.values_list("pk", "name"))
    steps = dict(NotificationList.objects.values_list("name", "escalation"))
    channels: dict[str, set[str]] = {name: set() for name in names.values()}
    for channel, related in CHANNEL_TARGETS.items():
        model = NotificationList._meta.get_field(related).related_model
        for list_pk in model.objects.values_list("notification_list_id", flat=True).distinct():  # type: ignore[union-attr]
            channels[names[list_pk]].add(channel)
    return ListsEscalation(steps=steps, channels=channels)


def escalation_problems(
    *,
    steps: Any,
    repeat_last_every_seconds: Any = 0,
    list_name: str,
    lists: Mapping[str, Any],
    channels_of: Mapping[str, Iterable[str]],
) -> list[str]:
    """Why ``steps`` cannot be the escalation of the list ``list_name``, in words (empty: they
    can). ``lists``: every list's escalation steps by name, as they will be (this one's
    included); ``channels_of``: the channels each list has targets for, by name. Checked: the
    shape of each step, ``after_seconds`` above 0 and increasing, an existing list, a channel
    that list has targets for, and no loop through the steps' own lists' escalations."""
    if not isinstance(steps, list):
        return [
            'Escalation must be a list of steps such as [{"after_seconds": 300, "list": "Shift-Leads", "type": "sms"}].'
        ]
    problems: list[str] = []
    known = {list_name_key(name) for name in lists}
    channel_keys = {list_name_key(name): set(channels) for name, channels in channels_of.items()}
    previous = 0
    for number, step in enumerate(steps, start=1):
        problems += _step_problems(step, where=f"Step {number}", previous=previous, known=known, channels=channel_keys)
        if isinstance(step, dict) and isinstance(step.get("after_seconds"), int):
            previous = max(previous, step["after_seconds"])
    if not isinstance(repeat_last_every_seconds, int) or repeat_last_every_seconds < 0:
        problems.append("repeat_last_every_seconds must be a whole number of seconds, 0 (never) or more.")
    elif repeat_last_every_seconds and not steps:
        problems.append("repeat_last_every_seconds repeats the last escalation step: there is none.")
    if not problems:
        loop = escalation_loop(start=list_name, lists={**lists, list_name: steps})
        if loop:
            problems.append("Escalation would loop back to this list: " + " → ".join(loop) + ".")
    return problems


def _step_problems(
    step: Any, *, where: str, previous: int, known: set[str], channels: dict[str, set[str]]
) -> list[str]:
    """Why one step cannot be: its shape, its ``after_seconds`` (above 0, above ``previous``),
    its list (one of ``known``, by key) and its channel (one its list has targets for)."""
    if not isinstance(step, dict) or set(step) != STEP_KEYS:
        return [f'{where} must have exactly "after_seconds", "list" and "type".']
    problems = []
    after, target, channel = step["after_seconds"], step["list"], step["type"]
    if not isinstance(after, int) or isinstance(after, bool) or after <= 0:
        problems.append(f"{where}: after_seconds must be a whole number of seconds above 0.")
    elif after <= previous:
        problems.append(
            f"{where}: after_seconds ({after}) must be more than the step before ({previous}): "
            "every step counts from when the notification was created."
        )
    if not isinstance(target, str) or list_name_key(target) not in known:
        problems.append(f"{where}: there is no list named {target!r}.")
    elif not isinstance(channel, str) or channel not in channels.get(list_name_key(target), set()):
        has = ", ".join(sorted(channels.get(list_name_key(target), set()))) or "none"
        problems.append(f"{where}: the list {target!r} has no targets for the channel {channel!r} (it has: {has}).")
    return problems


def escalation_loop(*, start: str, lists: Mapping[str, Any]) -> list[str]:
    """A path of list names from ``start`` back to itself through the lists' escalation steps
    (``lists``: each list's steps by name), or [] when there is none. Children never escalate,
    so such a loop could not run; it is refused all the same, as a configuration that says
    something it cannot do."""
    by_key = {list_name_key(name): (name, steps) for name, steps in lists.items()}
    start_key = list_name_key(start)

    def targets(key: str) -> list[str]:
        steps = by_key.get(key, ("", []))[1]
        if not isinstance(steps, list):
            return []
        return [
            list_name_key(step["list"])
            for step in steps
            if isinstance(step, dict) and isinstance(step.get("list"), str)
        ]

    path = [start_key]
    seen: set[str] = set()

    def walk(key: str) -> bool:
        for target in targets(key):
            if target == start_key:
                path.append(target)
                return True
            if target in seen:
                continue
            seen.add(target)
            path.append(target)
            if walk(target):
                return True
            path.pop()
        return False

    if not walk(start_key):
        return []
    return [by_key.get(key, (key, None))[0] or key for key in path]
