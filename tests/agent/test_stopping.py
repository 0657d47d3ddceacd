"""Stopping the forwarder: a stop requested by a signal or another thread wakes the sleeper at
once, whenever it arrives, and the forwarder process exits cleanly after the current request."""

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sites.agent.stopping import StopSignal, stop_signals
from tests.agent.fake_central import Hang

REPO = Path(__file__).resolve().parents[2]
WAKE_LIMIT = 10  # seconds: a failure bound, far above the instant wake-up expected

posix_only = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="sends POSIX signals to a child process")


def test_set_from_another_thread_wakes_a_waiter():
    with StopSignal() as stop:
        waker = threading.Thread(target=stop.set, args=("test",))
        waker.start()
        assert stop.wait(WAKE_LIMIT) is True
        waker.join()
        assert stop.reason == "test"


def test_wait_returns_false_when_nothing_stops_it():
    with StopSignal() as stop:
        assert stop.wait(0.01) is False
        assert stop.is_set() is False


def test_a_stop_set_before_waiting_is_not_lost():
    with StopSignal() as stop:
        stop.set()
        assert stop.wait(WAKE_LIMIT) is True


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_a_signal_arriving_at_any_moment_wakes_the_waiter_every_time():
    # The race the old design lost: the signal lands while the main thread is between checking
    # the flag and going to sleep, or inside the wait's own locking. Random delays put it there.
    main = threading.main_thread().ident
    generator = random.Random(18)
    for _ in range(200):
        with StopSignal() as stop, stop.on_signals():
            delay = generator.choice([0, 0, 0.0001, 0.0005, 0.002])
            timer = threading.Timer(delay, signal.pthread_kill, args=(main, signal.SIGTERM))
            timer.start()
            woke = stop.wait(WAKE_LIMIT)
            timer.join()
        assert woke is True
        assert stop.reason == "SIGTERM"


def test_handlers_are_restored_afterwards():
    before = signal.getsignal(signal.SIGINT)
    with StopSignal() as stop, stop.on_signals() as handled:
        assert signal.getsignal(signal.SIGINT) is not before
        assert "SIGINT" in handled.values()
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_no_handler_is_installed_and_set_still_works():
    outcome: dict = {}

    def run():
        with StopSignal() as stop, stop.on_signals() as handled:
            outcome["handled"] = handled
            stop.set()
            outcome["woke"] = stop.wait(WAKE_LIMIT)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert outcome == {"handled": {}, "woke": True}


def test_only_signals_the_platform_has_are_used():
    assert set(stop_signals().values()) <= {"SIGTERM", "SIGINT", "SIGBREAK"}
    assert "SIGINT" in stop_signals().values()


# --- the forwarder process ------------------------------------------------------------------------


def forwarder(central_url, buffer_path, *extra):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update({"OUTBOX_AGENT_DB": str(buffer_path), "OUTBOX_CENTRAL_URL": central_url, "OUTBOX_SITE_KEY": "x"})
    return subprocess.Popen(
        [sys.executable, "-m", "sites.agent", "forward", *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@posix_only
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_wait_between_sweeps_stops_the_forwarder_at_once(central, buffer_path, signum):
    process = forwarder(central.url, buffer_path, "--sweep-interval", "3600")
    try:
        assert process.stdout.readline().startswith("forwarding ")
        process.send_signal(signum)
        out, err = process.communicate(timeout=WAKE_LIMIT)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.rstrip().endswith(f"{signal.Signals(signum).name} received: finished the current request; stopped")


@posix_only
def test_a_signal_during_a_request_lets_the_request_finish_then_stops(central, buffer_path):
    from sites.agent import SiteOutbox

    with SiteOutbox(buffer_path, None, None) as outbox:
        outbox.notify("Operators").send("Pump 3 tripped", "overload")
    central.then(Hang())  # the request hangs until the forwarder's timeout
    process = forwarder(central.url, buffer_path, "--sweep-interval", "3600", "--timeout", "1")
    try:
        central.wait_for_requests(1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAKE_LIMIT)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "retrying 1" in out  # the request ran to its timeout and was counted
    assert out.rstrip().endswith("SIGTERM received: finished the current request; stopped")
