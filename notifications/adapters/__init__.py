"""Delivery adapters, one module per notification type.

Which adapter delivers which type is the registry in notifications.vocabulary (dotted paths,
so that models derive their choices from it without importing adapter code); this package
loads them.
"""

from django.utils.module_loading import import_string

from notifications.adapters.base import Adapter
from notifications.vocabulary import ADAPTER_PATHS

_loaded: dict[str, Adapter] = {}


def adapter_for(type_name: str) -> Adapter:
    """The adapter instance for ``type_name``; KeyError if no adapter is registered."""
    if type_name not in _loaded:
        _loaded[type_name] = import_string(ADAPTER_PATHS[type_name])()
    return _loaded[type_name]
