"""The dispatch tests' fixtures (a real SMTP server on loopback and its configuration)."""

from tests.dispatch.conftest import smtp_config, smtp_server

__all__ = ["smtp_config", "smtp_server"]
