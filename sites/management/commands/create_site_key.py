from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from sites.services import SiteKeyError, site_get, site_key_issue


class Command(BaseCommand):
    help = "Issue a new API key for a site. The key is printed once, as the last line of output."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("site_id")
        parser.add_argument("--name", default="", help="A label for the key (e.g. 'rotation 2026-11').")
        parser.add_argument("--expires-in-days", type=int, default=None, help="Expire the key after N days.")

    def handle(self, *args: Any, site_id: str, name: str, expires_in_days: int | None, **options: Any) -> None:
        try:
            site = site_get(site_id=site_id)
        except SiteKeyError as exc:
            raise CommandError(str(exc)) from None
        if expires_in_days is not None and expires_in_days <= 0:
            raise CommandError("--expires-in-days must be a positive number of days.")
        expiry = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
        api_key, key = site_key_issue(site=site, name=name, expiry_date=expiry)
        self.stderr.write(
            f"Issued key {api_key.prefix} for site {site.site_id}"
            + (f", expires {expiry:%Y-%m-%d %H:%M} UTC" if expiry else "")
            + ". Store it now: it cannot be shown again."
        )
        self.stdout.write(key)
