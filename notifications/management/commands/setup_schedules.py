"""manage.py setup_schedules — register the worker's schedules (idempotent; run on every
deployment and by `make run`)."""

from django.core.management.base import BaseCommand

from notifications.tasks import SCHEDULES, schedules_ensure


class Command(BaseCommand):
    help = "Create or update the django-q2 schedules (dispatch sweep every minute, daily purge)."

    def handle(self, *args, **options):
        for name, outcome in schedules_ensure().items():
            self.stdout.write(f"{name} ({SCHEDULES[name]['func']}): {outcome}")
