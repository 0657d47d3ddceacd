from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from sites.models import StaffAPIKey


def _when(moment: Any) -> str:
    return "never" if moment is None else f"{moment:%Y-%m-%d %H:%M}"


class Command(BaseCommand):
    help = "List staff API keys (never the keys themselves): prefix, user, name, state, expiry, last use."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", help="Only this user's keys.")

    def handle(self, *args: Any, user: str | None, **options: Any) -> None:
        keys = StaffAPIKey.objects.select_related("user").order_by("user__username", "-created")
        if user:
            keys = keys.filter(user__username=user)
        now = timezone.now()
        rows = [
            (
                key.prefix,
                key.user.get_username(),
                key.name,
                "revoked" if key.revoked else "expired" if key.expiry_date <= now else "live",
                _when(key.expiry_date),
                _when(key.last_used_at),
            )
            for key in keys
        ]
        if not rows:
            self.stdout.write("No staff keys.")
            return
        header = ("prefix", "user", "name", "state", "expires (UTC)", "last used (UTC)")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())
