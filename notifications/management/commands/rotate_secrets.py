from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from notifications.models import AppriseTarget, ChannelConfiguration, SmtpConfiguration, TeamsTarget, WebhookTarget
from notifications.secrets import SecretDecryptionError

# Every model with encrypted columns, and those columns.
ENCRYPTED = (
    (SmtpConfiguration, ["password", "oauth_client_secret"], "SMTP configuration"),
    (ChannelConfiguration, ["auth_token"], "channel configuration"),
    (WebhookTarget, ["secret"], "webhook target"),
    (TeamsTarget, ["url"], "Teams target"),
    (AppriseTarget, ["url"], "Apprise target"),
)


class Command(BaseCommand):
    help = (
        "Re-encrypt stored secrets (the SMTP password and OAuth client secret, the SMS auth token, webhook "
        "signing secrets, Teams and Apprise URLs) with the first key of OUTBOX_SECRET_KEYS."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        counts = []
        try:
            with transaction.atomic():
                for model, fields, name in ENCRYPTED:
                    rows = list(model.objects.all())
                    for row in rows:
                        row.save(update_fields=fields)
                    counts.append((len(rows), name))
        except SecretDecryptionError as exc:
            raise CommandError(str(exc)) from None
        smtp = counts[0][0]
        self.stdout.write(f"Re-encrypted {smtp} SMTP configuration secret(s) with the current key.")
        others = ", ".join(f"{count} {name}(s)" for count, name in counts[1:])
        self.stdout.write(f"Also re-encrypted: {others}.")
