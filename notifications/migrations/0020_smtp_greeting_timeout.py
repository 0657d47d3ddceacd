"""The SMTP configuration's greeting timeout: how long to wait for the server's 220 after
connecting (30 s by default; it was a fixed 5 s for the greeting's first byte)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0019_secret_bindings'),
    ]

    operations = [
        migrations.AddField(
            model_name='smtpconfiguration',
            name='greeting_timeout_seconds',
            field=models.PositiveIntegerField(default=30, help_text="How long to wait for the server's greeting (its 220) after connecting. Relays that delay it on purpose (Postfix's postscreen, sendmail's greet_pause) need more than a few seconds; RFC 5321 allows 5 minutes. Also bounded by the claim's lease (OUTBOX_LEASE_SECONDS).", validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AddConstraint(
            model_name='smtpconfiguration',
            constraint=models.CheckConstraint(condition=models.Q(('greeting_timeout_seconds__gte', 1)), name='smtp_greeting_timeout_positive'),
        ),
    ]
