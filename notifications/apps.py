from django.apps import AppConfig
from django.core import checks


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notification outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from notifications.secrets import check_secrets_decryptable

        checks.register(check_secrets_decryptable, checks.Tags.database)
