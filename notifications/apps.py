from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_delete, post_migrate, post_save


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notification outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_q.signals import post_spawn  # defines django-q2's models: importable once apps load

        from notifications.checks import (
            check_attachment_limit,
            check_channels,
            check_deploy_settings,
            check_escalations,
            check_plaintext_auth,
            check_schedules_present,
            check_secrets_decryptable,
            check_workers_running,
        )
        from notifications.metrics_files import metrics_files_compact_at_start
        from notifications.models import ChannelConfiguration, DeliveryPolicy, NotificationList, SmtpConfiguration
        from notifications.operations import (
            LIST_TARGET_CHANNELS,
            channel_settings_changed,
            list_targets_changed,
            smtp_configuration_changed,
        )
        from notifications.schedules import schedules_after_migrate
        from notifications.workers import worker_process_spawned

        checks.register(check_secrets_decryptable, checks.Tags.database)
        checks.register(check_schedules_present, checks.Tags.database)
        checks.register(check_plaintext_auth, checks.Tags.database)
        checks.register(check_attachment_limit)
        checks.register(check_channels, checks.Tags.database)
        checks.register(check_workers_running, checks.Tags.database)
        checks.register(check_escalations, checks.Tags.database)
        checks.register(check_deploy_settings, checks.Tags.security, deploy=True)
        # After every migrate: the worker's schedules exist without a deployment step.
        post_migrate.connect(schedules_after_migrate, sender=self, dispatch_uid="outbox-schedules")
        # Each django-q2 task process records itself as it starts (the worker heartbeat).
        post_spawn.connect(worker_process_spawned, dispatch_uid="outbox-worker-spawned")
        # A changed configuration (a fixed password, another relay, a policy, a list's targets)
        # is probed at once and dispatched (notifications.operations.channel_configuration_changed).
        post_save.connect(smtp_configuration_changed, sender=SmtpConfiguration, dispatch_uid="outbox-smtp-changed")
        for model in (ChannelConfiguration, DeliveryPolicy):
            for signal in (post_save, post_delete):
                signal.connect(channel_settings_changed, sender=model, dispatch_uid=f"outbox-{model.__name__}-changed")
        for target in (NotificationList, *LIST_TARGET_CHANNELS):
            post_save.connect(list_targets_changed, sender=target, dispatch_uid=f"outbox-{target.__name__}-changed")
        from notifications.models import MaintenanceWindow, Silence
        from notifications.suppression import suppression_rules_forget

        for rules_model in (Silence, MaintenanceWindow, NotificationList):
            for signal in (post_save, post_delete):
                signal.connect(
                    suppression_rules_forget, sender=rules_model, dispatch_uid=f"outbox-{rules_model.__name__}-rules"
                )
        # Every process start: the metrics files of processes of this host that ended since join
        # the archive, so the directory holds the live processes' files and one archive.
        metrics_files_compact_at_start()
