"""The receivers of the channel tests and the SMTP server of the dispatch tests, for the
acknowledgement tests."""

from tests.channels.conftest import teams_receiver, twilio
from tests.dispatch.conftest import smtp_config, smtp_server

__all__ = ["smtp_config", "smtp_server", "teams_receiver", "twilio"]
