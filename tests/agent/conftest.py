"""Fixtures for the site agent's tests. Nothing here touches Django: the agent runs without it,
and these tests run under every Python from 3.8 up with only pytest, cryptography and aiosmtpd installed
(``make test-agent-pythons``)."""

import socket
from datetime import datetime, timedelta, timezone

import pytest

from sites.agent import SiteOutbox
from tests.agent.fake_central import GOOD_KEY, FakeCentral


class FakeClock:
    """A clock the test moves by hand, so retry timing is tested without sleeping."""

    def __init__(self):
        self.now = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def central():
    server = FakeCentral().start()
    yield server
    server.stop()


@pytest.fixture
def relay():
    """A real SMTP server on loopback standing in for the plant's local relay."""
    from tests.agent.local_relay import LocalRelay

    with LocalRelay() as server:
        yield server


def closed_port_url():
    """An http:// URL of a port nobody listens on: central down, connections refused."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{placeholder.getsockname()[1]}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A private CA with a server certificate for 127.0.0.1 and a client certificate."""
    from tests.agent.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def buffer_path(tmp_path):
    return tmp_path / "outbox-buffer.sqlite3"


@pytest.fixture
def make_outbox(buffer_path, central, clock):
    """``make_outbox(**options)``: a SiteOutbox on the test buffer, pointed at the fake central."""
    made = []

    def make(**options):
        options.setdefault("clock", clock)
        options.setdefault("timeout", 5)
        outbox = SiteOutbox(
            buffer_path, options.pop("central_url", central.url), options.pop("api_key", GOOD_KEY), **options
        )
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        outbox.close()


@pytest.fixture
def outbox(make_outbox):
    return make_outbox()


def send_many(outbox, count, list_name="Operators"):
    notifier = outbox.notify(list_name)
    return [
        notifier.send(f"Pump {n} tripped", f"Motor overload #{n}", source_instance_id=f"Pump{n}") for n in range(count)
    ]
