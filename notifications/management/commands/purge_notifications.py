"""manage.py purge_notifications — delete terminal notifications older than the retention
window (OUTBOX_RETENTION_DAYS), in batches, resting between them (OUTBOX_PURGE_DUTY_CYCLE).
--dry-run only counts."""

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from notifications.purge import PurgeReport, notifications_purge

PROGRESS_SECONDS = 5.0  # at most one progress line this often


class Command(BaseCommand):
    help = "Delete terminal notifications older than OUTBOX_RETENTION_DAYS (in batches)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--batch-size", type=_positive_int, default=None, help="Rows deleted per transaction.")
        parser.add_argument(
            "--duty-cycle",
            type=_duty_cycle,
            default=None,
            help="Share of the time spent deleting, above 0 and at most 1 (default OUTBOX_PURGE_DUTY_CYCLE); "
            "after each batch the purge rests in proportion. 1: no rest, for a maintenance window.",
        )

    def handle(
        self, *args: Any, dry_run: bool, batch_size: int | None, duty_cycle: float | None, **options: Any
    ) -> None:
        printed_at: float | None = None

        def progress(report: PurgeReport) -> None:
            # The first batch, then at most one line every PROGRESS_SECONDS: a large purge
            # has thousands of batches.
            nonlocal printed_at
            if printed_at is None or report.seconds - printed_at >= PROGRESS_SECONDS:
                printed_at = report.seconds
                self.stdout.write(f"  batch {report.batches}: {report.deleted} deleted so far ({report.seconds:.1f} s)")

        report = notifications_purge(dry_run=dry_run, batch_size=batch_size, duty_cycle=duty_cycle, progress=progress)
        self.stdout.write(str(report))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of rows, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of rows, got {text}")
    return value


def _duty_cycle(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value
