"""The long tail of services (Slack, Telegram, ntfy, Discord, …) through Apprise URLs
(docs/channels.md).

Each target is one Apprise URL, notified on its own so that it has its own outcome. Apprise
reports a status, not the service's answer, so the mapping is coarse: success → delivered;
a timeout → timeout; a failure → provider error (transient: Apprise cannot tell a bad token
from an outage, so the channel's policy decides how long to keep trying); a URL Apprise cannot
load → refused (configuration).
"""

import apprise

from notifications.adapters.base import FailureClass
from notifications.adapters.http import TargetOutcome, TargetsAdapter, TargetsSession
from notifications.channel_targets import Target
from notifications.models import Notification


class AppriseSession(TargetsSession):
    channel = "apprise"

    def send_one(self, notification: Notification, target: Target) -> TargetOutcome:
        plugin = apprise.Apprise.instantiate(target.address, suppress_exceptions=True)
        if plugin is None:
            # Permanent: Apprise cannot load this URL; only an administrator can fix it.
            return TargetOutcome("refused", "Apprise cannot load this URL.", FailureClass.CONFIGURATION)
        # Apprise's own timeouts: connect and read, per request.
        plugin.socket_connect_timeout = self.timeout
        plugin.socket_read_timeout = self.timeout
        sender = apprise.Apprise()
        sender.add(plugin)
        result = sender.notify(
            body=notification.body or notification.subject, title=notification.subject, timeout=self.timeout * 2
        )
        status = getattr(result, "status", None)
        if status == apprise.AppriseResultStatus.SUCCESS or result is True:
            return TargetOutcome("delivered", "accepted by the service")
        if status == apprise.AppriseResultStatus.TIMEOUT:
            return TargetOutcome("deferred", "The service did not answer in time.", FailureClass.TIMEOUT)
        if status == apprise.AppriseResultStatus.NOMATCH:
            return TargetOutcome("refused", "Apprise attempted no service for this URL.", FailureClass.CONFIGURATION)
        return TargetOutcome(
            "deferred",
            "The service refused or failed the notification (see the worker log).",
            FailureClass.PROVIDER_ERROR,
        )


class AppriseAdapter(TargetsAdapter):
    channel = "apprise"
    session_class = AppriseSession
