from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sites.services import StaffKeyError, staff_key_revoke


class Command(BaseCommand):
    help = "Revoke a staff API key by its prefix (the part before the dot). Cannot be undone."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "prefix", help="Key prefix, e.g. 'AbCd1234' from 'AbCd1234.xxxx' (list_staff_keys shows them)."
        )

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        try:
            staff_key = staff_key_revoke(prefix=prefix.partition(".")[0][:8])
        except StaffKeyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Revoked staff key {staff_key.prefix} ({staff_key.name}) of {staff_key.user.get_username()}."
        )
