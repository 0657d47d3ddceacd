"""manage.py purge_notifications — delete terminal notifications older than the retention
window (OUTBOX_RETENTION_DAYS), in batches. --dry-run only counts."""

from django.core.management.base import BaseCommand

from notifications.purge import notifications_purge


class Command(BaseCommand):
    help = "Delete terminal notifications older than OUTBOX_RETENTION_DAYS (in batches)."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows deleted per transaction.")

    def handle(self, *args, dry_run, batch_size, **options):
        def progress(report):
            self.stdout.write(f"  batch {report.batches}: {report.deleted} deleted so far")

        report = notifications_purge(dry_run=dry_run, batch_size=batch_size, progress=progress)
        self.stdout.write(str(report))
