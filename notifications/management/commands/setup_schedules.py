"""manage.py setup_schedules — register the worker's schedules (idempotent). Every `migrate`
already does this; the command is for a database whose schedules were deleted by hand (system
check outbox.W001 says so)."""

from typing import Any

from django.core.management.base import BaseCommand

from notifications.schedules import SCHEDULES, schedules_ensure


class Command(BaseCommand):
    help = "Create or update the django-q2 schedules (dispatch sweep every minute, daily purge)."

    def handle(self, *args: Any, **options: Any) -> None:
        for name, outcome in schedules_ensure().items():
            self.stdout.write(f"{name} ({SCHEDULES[name]['func']}): {outcome}")
