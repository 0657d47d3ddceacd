"""Immediate forwarding: ``send()`` wakes a sleeping forwarder, in this process or from another
one; the forwarder's loop also heartbeats and executes central's commands. The forwarders here
sleep an hour between sweeps, so only a wake-up (or a command) explains a forward."""

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from sites.agent import SiteOutbox, StopSignal
from sites.agent.wakeup import WakeListener, wake_forwarder, wakeup_file
from tests.agent.conftest import send_many
from tests.agent.fake_central import GOOD_KEY, Reply

REPO = Path(__file__).resolve().parents[2]
HOUR = 3600.0


class RunningForwarder:
    """``outbox.run_forever`` in a thread, stopped on exit."""

    def __init__(self, outbox, stop=None):
        self.outbox = outbox
        self.stop = stop or threading.Event()
        self.thread = threading.Thread(target=outbox.run_forever, args=(self.stop,), kwargs={"progress": None})

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def forwarder_outbox(make_outbox, **options):
    options.setdefault("sweep_interval", HOUR)
    options.setdefault("heartbeat_interval", HOUR)
    return make_outbox(clock=None, **options)


def wait_published(buffer_path):
    published = wakeup_file(str(buffer_path))
    for _ in range(500):
        if os.path.exists(published):
            return
        threading.Event().wait(0.01)
    raise AssertionError("the forwarder did not publish its wake-up port")


def test_a_send_in_the_same_process_is_forwarded_without_waiting_for_the_sweep(make_outbox, central, buffer_path):
    outbox = forwarder_outbox(make_outbox)
    with RunningForwarder(outbox):
        central.wait_for_site_requests(lambda requests: len(requests) >= 1)  # first sweep and heartbeat done
        (notification_id,) = send_many(outbox, 1)
        central.wait_for_requests(1)
    assert central.posted_ids() == [notification_id]


def test_a_send_from_another_object_or_process_wakes_the_running_forwarder(make_outbox, central, buffer_path):
    outbox = forwarder_outbox(make_outbox)
    with RunningForwarder(outbox, StopSignal()):
        wait_published(buffer_path)
        with SiteOutbox(buffer_path, None, None) as sender:  # a script that only sends
            first = sender.notify("Operators").send("Pump 1 tripped", "overload")
        central.wait_for_requests(1)
        env = {**os.environ, "PYTHONPATH": str(REPO), "OUTBOX_AGENT_DB": str(buffer_path)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        sent = subprocess.run(
            [sys.executable, "-m", "sites.agent", "send", "--list", "Operators", "--subject", "s", "--body", "b"],
            cwd=str(REPO),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        central.wait_for_requests(2)
    assert central.posted_ids() == [first, sent.stdout.strip()]


def test_the_wakeup_file_is_removed_when_the_forwarder_stops(make_outbox, central, buffer_path):
    outbox = forwarder_outbox(make_outbox)
    with RunningForwarder(outbox):
        wait_published(buffer_path)
    assert not os.path.exists(wakeup_file(str(buffer_path)))
    assert wake_forwarder(str(buffer_path)) is False


def test_a_stale_wakeup_file_costs_a_send_nothing(buffer_path):
    listener = WakeListener(str(buffer_path))
    listener.publish()
    listener.socket.close()  # the forwarder died without cleaning up
    with SiteOutbox(buffer_path, None, None) as sender:
        sender.notify("Operators").send("Pump 1 tripped", "overload")
        assert sender.stats()["buffered"] == 1


def test_the_forwarder_heartbeats_at_start_and_on_its_interval(make_outbox, central):
    outbox = forwarder_outbox(make_outbox, heartbeat_interval=0.05)
    with RunningForwarder(outbox):
        central.wait_for_site_requests(lambda requests: len(requests) >= 3)
    assert all(body["buffered"] == 0 for body in central.heartbeats())


def test_a_retry_command_in_a_heartbeat_answer_is_forwarded_at_once(make_outbox, central):
    outbox = make_outbox()
    (notification_id,) = send_many(outbox, 1)
    central.then(Reply(400, {"error": "invalid", "detail": "Invalid input.", "errors": {"type": ["Unknown"]}}))
    outbox.forward_once()
    outbox.close()
    retry = {"id": str(uuid.uuid4()), "action": "retry", "notification_id": notification_id, "reason": ""}
    central.commands.append(retry)

    forwarder = forwarder_outbox(make_outbox)
    with RunningForwarder(forwarder):
        central.wait_for_requests(2)
        central.wait_for_site_requests(lambda requests: retry["id"] in central.acks)
    assert central.posted_ids() == [notification_id, notification_id]
    assert central.acks[retry["id"]]["result"] == "done"


def test_a_negative_heartbeat_interval_is_refused(buffer_path, central):
    with pytest.raises(ValueError, match="heartbeat_interval >= 0"):
        SiteOutbox(buffer_path, central.url, GOOD_KEY, heartbeat_interval=-1)
