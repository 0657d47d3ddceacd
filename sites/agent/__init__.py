"""The site agent: a durable local buffer plus a store-and-forward forwarder to central.

Pure standard library — no Django — so a site can run it next to its scripts::

    from sites.agent import SiteOutbox

    outbox = SiteOutbox("/var/lib/outbox/buffer.sqlite3", "https://outbox.example.com", api_key)
    notification_id = outbox.notify("Operators").send("Pump 3 tripped", "Motor overload at 10:02")

See docs/site-agent.md.
"""

from sites.agent.central import CentralUnreachable
from sites.agent.forwarder import CredentialRejected, ForwardResult
from sites.agent.outbox import STATUS_FORWARDING, STATUS_PARKED_AT_SITE, AgentNotConfigured, SiteOutbox

__all__ = [
    "AgentNotConfigured",
    "CentralUnreachable",
    "CredentialRejected",
    "ForwardResult",
    "STATUS_FORWARDING",
    "STATUS_PARKED_AT_SITE",
    "SiteOutbox",
]
