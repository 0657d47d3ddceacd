"""Notifications a site delivered itself (docs/site-agent.md, "Local fallback"): while central
was unreachable, the site's agent sent its urgent rows once through the plant's own relay and
later forwards them with ``delivered_locally_at``. Central records that and does not send them
again, unless their list sets ``resend_after_local_delivery``.

* **Recording.** A new row may arrive with ``delivered_locally_at``. The field is not part of
  the fingerprint, so a replay may add it to a row that does not have it yet, as long as that
  row is not Delivered (:func:`notifications_delivered_locally_record`); later replays change
  nothing. A row Delivered by central meanwhile keeps what it has.
* **Settling.** The dispatcher finishes a claimed row that carries the field as Delivered
  without a delivery attempt (:func:`notifications_settle_delivered_locally`): ``delivered_at``
  is when central recorded it, and ``resolved_targets`` holds one entry (channel ``site``) that
  says so. A row whose list resends is delivered as usual.
* **Rows already on their way.** A row under a live claim when the replay adds the field keeps
  its delivery: the worker already holds it and finishes it as usual, so its recipients may get
  central's copy as well. Should that delivery fail, the next claim settles it. A Parked or
  Discarded row keeps its state with the field recorded; an operator's Retry of it settles it.
"""

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from notifications.list_names import notification_lists_by_name
from notifications.models import Notification
from notifications.trigger import dispatch_request
from notifications.vocabulary import TargetOutcome

logger = logging.getLogger(__name__)

# The channel of the one resolved_targets entry of a row the site delivered itself.
SITE_CHANNEL = "site"


def notifications_delivered_locally_record(*, site_id: str, moments: Mapping[uuid.UUID, datetime]) -> set[uuid.UUID]:
    """Record ``delivered_locally_at`` (``moments``: by notification id) on the rows of site
    ``site_id`` that do not have it yet and are not Delivered; returns the ids that took it.
    Asks for a dispatch once the transaction commits, so that the rows are settled at once."""
    recorded = set()
    for notification_id, moment in moments.items():
        updated = (
            Notification.objects.filter(pk=notification_id, source_site_id=site_id, delivered_locally_at__isnull=True)
            .exclude(status=Notification.Status.DELIVERED)
            .update(delivered_locally_at=moment)
        )
        if updated:
            recorded.add(notification_id)
    if recorded:
        transaction.on_commit(dispatch_request)
    return recorded


def local_delivery_note(*, site_id: str, delivered_locally_at: datetime, list_name: str) -> dict[str, Any]:
    """The ``resolved_targets`` entry of a row settled as delivered at its site."""
    moment = delivered_locally_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return {
        "channel": SITE_CHANNEL,
        "target": f"local relay of site {site_id}",
        "outcome": TargetOutcome.DELIVERED.value,
        "delivered_locally_at": moment,
        "note": (
            f"Delivered by the site's agent through its local relay at {moment}, while central was unreachable; "
            f"not sent again by central (list {list_name!r} does not set resend_after_local_delivery)."
        ),
    }


def notifications_settle_delivered_locally(
    *, worker_id: str, rows: Sequence[Notification], now: datetime
) -> list[Notification]:
    """Finish those of the claimed ``rows`` that carry ``delivered_locally_at`` and whose list
    does not resend such rows: Delivered at ``now``, without an attempt, only while
    ``worker_id`` still holds each in the status it was claimed with. Returns the rows
    finished; the others (no field, a list that resends, a claim lost) are left to deliver.

    A row whose list does not exist is settled too: the site has delivered it, and central
    could not."""
    candidates = [row for row in rows if row.delivered_locally_at is not None]
    if not candidates:
        return []
    lists = notification_lists_by_name(names={row.list_name for row in candidates})
    settled = []
    with transaction.atomic():
        for row in candidates:
            notification_list = lists.get(row.list_name)
            if notification_list is not None and notification_list.resend_after_local_delivery:
                continue
            assert row.delivered_locally_at is not None
            note = local_delivery_note(
                site_id=row.source_site_id, delivered_locally_at=row.delivered_locally_at, list_name=row.list_name
            )
            updated = Notification.objects.filter(pk=row.pk, status=row.status, claimed_by=worker_id).update(
                status=Notification.Status.DELIVERED,
                delivered_at=now,
                next_attempt_at=None,
                claimed_by="",
                claimed_until=None,
                resolved_targets=[note],
                targets_refused=0,
                last_error="",
            )
            if updated:
                settled.append(row)
    for row in settled:
        logger.info(
            "delivered %s locally at site %s; not sent by central",
            row.pk,
            row.source_site_id,
            extra={
                "notification_id": str(row.pk),
                "site": row.source_site_id,
                "channel": row.type,
                "worker": worker_id,
                "outcome": "delivered_locally",
            },
        )
    return settled
