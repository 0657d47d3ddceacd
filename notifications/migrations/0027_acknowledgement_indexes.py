"""SMS replies find the messages recently sent to one number (notifications.sms_replies): an index
of provider messages by provider, target and time; the time-to-acknowledge KPI reads the
notifications acknowledged lately: a partial index of acknowledged rows. Both built
concurrently on PostgreSQL."""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    # CONCURRENTLY cannot run inside a transaction; the table holds one row per SMS sent.
    atomic = False

    dependencies = [
        ("notifications", "0026_notification_database_defaults"),
    ]

    operations = [
        AddIndexConcurrentlyWherePossible(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("acknowledged_at__isnull", False)),
                fields=["acknowledged_at"],
                name="notif_acknowledged_idx",
            ),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name="providermessage",
            index=models.Index(fields=["provider", "target_ref", "created_at"], name="provider_message_target_idx"),
        ),
    ]
