"""A real SMTP server on 127.0.0.1 (aiosmtpd) standing in for a plant's local relay, for the
local fallback's tests. Runs under every Python the agent supports (tests/support/smtp.py needs
3.11).

    with LocalRelay() as relay:            # accepts every message
        relay.refuse_with = "451 4.3.0 try later"   # answers the message's end with this instead
        relay.hold()                       # receives the message's end, then answers nothing until release()
        relay.holding.wait(10)             # a message's end has arrived and is being held
        relay.release()
        relay.messages                     # every message accepted (or held), in order
        relay.ids()                        # Counter of their X-Notification-Id values

``data_calls`` counts every message whose end reached the relay, whatever it answered: the
number of local copies a recipient could have got.
"""

import asyncio
import collections
import socket
import threading
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default as default_policy
from typing import List

from aiosmtpd.controller import Controller


def free_port():
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        return placeholder.getsockname()[1]


class LocalRelay:
    def __init__(self, port=None):
        self.port = port or free_port()
        self.messages: List[EmailMessage] = []
        self.data_calls = 0
        self.refuse_with = None
        self.holding = threading.Event()
        self._held = threading.Event()
        self._released = threading.Event()
        self._received = threading.Condition()
        relay = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                message = message_from_bytes(envelope.content, policy=default_policy)
                with relay._received:
                    relay.data_calls += 1
                    relay.messages.append(message)
                    relay._received.notify_all()
                if relay._held.is_set():
                    relay.holding.set()
                    # Wait off the event loop, so other connections are still served.
                    await asyncio.get_event_loop().run_in_executor(None, relay._released.wait, 60)
                if relay.refuse_with:
                    with relay._received:
                        relay.messages.remove(message)
                    return relay.refuse_with
                return "250 2.0.0 queued"

        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self):
        self._controller.start()
        return self

    def __exit__(self, *exc_info):
        self._released.set()
        self._controller.stop()

    def hold(self):
        """From now on a message's end is received but not answered until :meth:`release`."""
        self._held.set()

    def release(self):
        self._released.set()

    def wait_for(self, count, timeout=10):
        with self._received:
            if not self._received.wait_for(lambda: len(self.messages) >= count, timeout):
                raise AssertionError(f"the relay received {len(self.messages)} messages, expected {count}")

    def ids(self):
        return collections.Counter(message["X-Notification-Id"] for message in self.messages)

    def settings(self, **overrides):
        """A ``fallback`` configuration pointing at this relay."""
        smtp = {
            "host": "127.0.0.1",
            "port": self.port,
            "security": "none",
            "from_address": "outbox-agent@plant-a.example.com",
            "to": ["control-room@plant-a.example.com"],
            "timeout_seconds": 5,
        }
        smtp.update(overrides.pop("smtp", {}))
        return {"after_seconds": 300, "min_priority": "high", "smtp": smtp, **overrides}
