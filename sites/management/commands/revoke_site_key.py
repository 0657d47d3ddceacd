from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sites.services import SiteKeyError, site_key_revoke


class Command(BaseCommand):
    help = "Revoke a site API key by its prefix (the part before the dot). Cannot be undone."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="Key prefix, e.g. 'AbCd1234' from 'AbCd1234.xxxx'.")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        prefix = prefix.partition(".")[0]
        try:
            api_key = site_key_revoke(prefix=prefix)
        except SiteKeyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Revoked key {api_key.prefix} of site {api_key.site.site_id}.")
