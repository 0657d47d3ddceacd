from typing import Any

from django.core.management.base import BaseCommand, CommandError

from notifications.models import SmtpConfiguration
from notifications.secrets import SecretDecryptionError


class Command(BaseCommand):
    help = "Re-encrypt stored secrets (the SMTP password) with the first key of OUTBOX_SECRET_KEYS."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            configs = list(SmtpConfiguration.objects.all())
        except SecretDecryptionError as exc:
            raise CommandError(str(exc)) from None
        for config in configs:
            config.save(update_fields=["password"])
        self.stdout.write(f"Re-encrypted {len(configs)} SMTP configuration secret(s) with the current key.")
