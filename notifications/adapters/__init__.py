"""Delivery adapters, one module per notification type, and the registry that names them.

The registry maps a notification ``type`` to the dotted path of its adapter class. It holds
paths, not classes, so models can derive their choices without importing adapter code.
"""

from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from notifications.adapters.base import Adapter

ADAPTER_PATHS = {
    "email": "notifications.adapters.email.EmailAdapter",
    "teams": "notifications.adapters.teams.TeamsAdapter",
    "webhook": "notifications.adapters.webhook.WebhookAdapter",
    "sms": "notifications.adapters.sms.SmsAdapter",
    "apprise": "notifications.adapters.apprise.AppriseAdapter",
}

TYPE_CHOICES = [(name, name) for name in ADAPTER_PATHS]

_loaded: dict[str, "Adapter"] = {}


def adapter_for(type_name: str) -> "Adapter":
    """The adapter instance for ``type_name``; KeyError if no adapter is registered."""
    if type_name not in _loaded:
        _loaded[type_name] = import_string(ADAPTER_PATHS[type_name])()
    return _loaded[type_name]
