"""Retention purge (docs/operations.md): terminal rows older than the retention window go, in batches.

Age is measured by ``created_at``. Each batch is its own short transaction that locks only the
rows it deletes (``SKIP LOCKED`` on PostgreSQL, so it never waits for a dispatcher or an
operator), and re-checks the status under that lock: a row an operator just moved back to
Pending is never deleted. Non-terminal rows are never purged, however old.

The purge yields to live traffic: after each batch it rests in proportion to the time the
batch took, so that it works only OUTBOX_PURGE_DUTY_CYCLE of the time (a fifth by default).
Sites posting while it runs then rarely meet a batch at work. A time budget (the worker's
task) stops it between batches, with ``more`` set when expired rows may remain.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from notifications import db
from notifications.counts import counts_fold
from notifications.models import DeliveryAttempt, Notification


@dataclass
class PurgeReport:
    cutoff: datetime
    deleted: int = 0
    batches: int = 0
    dry_run: bool = False
    more: bool = False  # stopped by its time budget after a full batch: expired rows may remain
    seconds: float = 0.0  # from the first batch to the end, rests included

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        text = f"{verb} {self.deleted} terminal notifications created before {self.cutoff:%Y-%m-%d %H:%M:%S} UTC"
        if not self.dry_run:
            text += f" in {self.seconds:.1f} s"
        return text + ("; more remain (time budget reached)" if self.more else "")


def notifications_purge(
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
    duty_cycle: float | None = None,
    time_budget: float | None = None,
    progress: Callable[[PurgeReport], None] | None = None,
) -> PurgeReport:
    """Delete terminal notifications (and their attempts) created before ``now`` minus
    OUTBOX_RETENTION_DAYS, ``batch_size`` rows per transaction (default
    OUTBOX_PURGE_BATCH_SIZE), working ``duty_cycle`` of the time (default
    OUTBOX_PURGE_DUTY_CYCLE; 1: no rest). With ``time_budget`` seconds, no batch starts that
    would end past it; at least one always runs. ``progress(report)`` is called after each
    batch. With ``dry_run`` only counts. Returns a :class:`PurgeReport`."""
    now = now or timezone.now()
    batch_size = batch_size or settings.OUTBOX_PURGE_BATCH_SIZE
    duty_cycle = duty_cycle or settings.OUTBOX_PURGE_DUTY_CYCLE
    if not 0 < duty_cycle <= 1:
        raise ValueError(f"the purge's duty cycle must be in (0, 1], got {duty_cycle!r}")
    report = PurgeReport(cutoff=now - timedelta(days=settings.OUTBOX_RETENTION_DAYS), dry_run=dry_run)
    expired = Notification.objects.filter(status__in=Notification.TERMINAL, created_at__lt=report.cutoff)
    if dry_run:
        report.deleted = expired.count()
        return report
    started = time.monotonic()
    while True:
        batch_started = time.monotonic()
        if connection.vendor == "postgresql":
            taken, deleted = db.expired_batch_delete(
                statuses=Notification.TERMINAL, created_before=report.cutoff, limit=batch_size
            )
        else:
            taken, deleted = _batch_delete(expired, batch_size)
        worked = time.monotonic() - batch_started
        report.deleted += deleted
        report.batches += 1 if taken else 0
        report.seconds = time.monotonic() - started
        if taken and progress:
            progress(report)
        if taken < batch_size:
            break
        rest = worked * (1 / duty_cycle - 1)
        if time_budget is not None and report.seconds + rest + worked > time_budget:
            report.more = True
            break
        time.sleep(rest)
    report.seconds = time.monotonic() - started
    counts_fold()  # the deletions, summed per key (notifications.counts)
    return report


def _batch_delete(expired: QuerySet[Notification], batch_size: int) -> tuple[int, int]:
    """The oldest ``batch_size`` of ``expired`` deleted with their attempts (and, by Django's
    cascade, their provider messages) in one transaction: ``(rows taken, rows deleted)``."""
    with transaction.atomic():
        pks = list(db.lock_skipping_locked(expired.order_by("created_at")).values_list("pk", flat=True)[:batch_size])
        if not pks:
            return 0, 0
        DeliveryAttempt.objects.filter(notification_id__in=pks).delete()
        deleted, _ = Notification.objects.filter(pk__in=pks, status__in=Notification.TERMINAL).only("pk").delete()
    return len(pks), deleted
