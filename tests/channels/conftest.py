"""Fixtures for the channels beyond email: real HTTP receivers on loopback and a list holding
targets for them."""

import pytest

from notifications.models import ChannelConfiguration, NotificationList
from tests.support.receivers import TeamsReceiver, TwilioFake, WebhookReceiver

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
AUTH_TOKEN = "twilio-auth-token-for-tests"


@pytest.fixture
def teams_receiver():
    with TeamsReceiver() as receiver:
        yield receiver


@pytest.fixture
def webhook_receiver():
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def twilio():
    with TwilioFake(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as fake:
        yield fake


@pytest.fixture
def channel_list(db):
    return NotificationList.objects.create(name="Channels")


def configure_channel(channel, **values):
    ChannelConfiguration.objects.update_or_create(channel=channel, defaults=values)


def configure_sms(twilio, **overrides):
    values = {
        "provider": "twilio",
        "account_sid": ACCOUNT_SID,
        "auth_token": AUTH_TOKEN,
        "from_number": "+15005550006",
        "api_base": twilio.api_base,
        "timeout_seconds": 2,
    }
    values.update(overrides)
    configure_channel("sms", **values)


def make_due(notification):
    """Bring a Retrying row's next attempt forward to now (instead of waiting for it)."""
    from django.utils import timezone

    type(notification).objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
