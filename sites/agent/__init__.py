"""The site agent: a durable local buffer plus a store-and-forward forwarder to central.

Pure standard library — no Django, no third-party package — on Python 3.8 to 3.13 and SQLite
3.26 or later, on Linux and Windows, so a site can run it next to its scripts::

    from sites.agent import SiteOutbox

    outbox = SiteOutbox("/var/lib/outbox/buffer.sqlite3", "https://outbox.example.com", api_key)
    notification_id = outbox.notify("Operators").send("Pump 3 tripped", "Motor overload at 10:02")

See docs/site-agent.md.
"""

__version__ = "0.4.0"

from sites.agent.central import CentralUnreachable  # after __version__: the cli imports it
from sites.agent.contract import PRIORITIES, InvalidNotification
from sites.agent.fallback import FallbackConfigError
from sites.agent.forwarder import CredentialRejected, ForwardResult
from sites.agent.outbox import (
    FINAL_STATUSES,
    STATUS_FORWARDING,
    STATUS_PARKED_AT_SITE,
    AgentNotConfigured,
    SiteOutbox,
)
from sites.agent.stopping import StopSignal

__all__ = [
    "FINAL_STATUSES",
    "PRIORITIES",
    "STATUS_FORWARDING",
    "STATUS_PARKED_AT_SITE",
    "AgentNotConfigured",
    "CentralUnreachable",
    "CredentialRejected",
    "FallbackConfigError",
    "ForwardResult",
    "InvalidNotification",
    "SiteOutbox",
    "StopSignal",
    "__version__",
]
