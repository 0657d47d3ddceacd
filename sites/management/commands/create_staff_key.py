from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from sites.services import STAFF_KEY_DEFAULT_DAYS, StaffKeyError, staff_key_issue


class Command(BaseCommand):
    help = (
        "Issue a staff API key (Authorization: Token <key>) to a staff user. The key is printed once, "
        "as the last line of output."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--name", required=True, help="What uses the key, e.g. 'monitoring' (at most 50 characters)."
        )
        parser.add_argument(
            "--expires-in-days",
            type=int,
            default=STAFF_KEY_DEFAULT_DAYS,
            help=f"Expire the key after N days (default {STAFF_KEY_DEFAULT_DAYS}).",
        )

    def handle(self, *args: Any, username: str, name: str, expires_in_days: int, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if expires_in_days <= 0:
            raise CommandError("--expires-in-days must be a positive number of days.")
        expiry = timezone.now() + timedelta(days=expires_in_days)
        try:
            staff_key, key = staff_key_issue(user=user, name=name, expiry_date=expiry)
        except StaffKeyError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"Issued staff key {staff_key.prefix} ({staff_key.name}) to {username}, expires "
            f"{expiry:%Y-%m-%d %H:%M} UTC. Store it now: it cannot be shown again."
        )
        self.stdout.write(key)
