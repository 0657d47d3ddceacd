"""manage.py purge_notifications — delete terminal notifications older than the retention
window (OUTBOX_RETENTION_DAYS), in batches. --dry-run only counts."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from notifications.purge import PurgeReport, notifications_purge


class Command(BaseCommand):
    help = "Delete terminal notifications older than OUTBOX_RETENTION_DAYS (in batches)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows deleted per transaction.")

    def handle(self, *args: Any, dry_run: bool, batch_size: int | None, **options: Any) -> None:
        def progress(report: PurgeReport) -> None:
            self.stdout.write(f"  batch {report.batches}: {report.deleted} deleted so far")

        report = notifications_purge(dry_run=dry_run, batch_size=batch_size, progress=progress)
        self.stdout.write(str(report))
