"""The local fallback: when central has been unreachable for ``after_seconds``, urgent buffered
notifications go once through the plant's relay — a real SMTP server on loopback (aiosmtpd,
tests/agent/local_relay.py) — stay buffered, and reach central later with
``delivered_locally_at``. At most one local copy per notification, even when the agent is
SIGKILLed while the relay holds the message's end or two forwarders share the buffer."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sites.agent import CredentialRejected, FallbackConfigError, SiteOutbox, doctor
from sites.agent.cli import main
from tests.agent.conftest import closed_port_url, send_many
from tests.agent.fake_central import GOOD_KEY, Reply, Reset

REPO = Path(__file__).resolve().parents[2]


def trip(outbox, subject="Boiler trip", priority="critical"):
    return outbox.notify("Operators").send(subject, "Drum pressure 182 bar", priority=priority, source_instance_id="B1")


@pytest.fixture
def down_outbox(make_outbox, relay):
    """A site whose central is down (connections reset) with a fallback to the local relay."""

    def make(**options):
        options.setdefault("fallback", relay.settings())
        options.setdefault("site_id", "plant-a")
        return make_outbox(**options)

    return make


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, words",
    [
        ({"after_secs": 10}, "fallback: unknown setting 'after_secs'"),
        ({"after_seconds": -1}, "fallback.after_seconds must be at least 0"),
        ({"after_seconds": "300"}, "fallback.after_seconds must be a number of seconds"),
        ({"min_priority": "urgent"}, "fallback.min_priority must be one of critical, high, normal, low"),
        ({"smtp": None}, "fallback.smtp is required"),
        ({"smtp": {"host": ""}}, "fallback.smtp.host must be a host name or address"),
        ({"smtp": {"security": "ssl"}}, "fallback.smtp.security must be one of none, starttls, tls"),
        ({"smtp": {"port": 0}}, "fallback.smtp.port must be a port number"),
        ({"smtp": {"port": "25"}}, "fallback.smtp.port must be a port number"),
        ({"smtp": {"to": []}}, "fallback.smtp.to must be a non-empty list"),
        ({"smtp": {"to": ["control room"]}}, "fallback.smtp.to[0] is not an email address"),
        ({"smtp": {"from_address": ""}}, "fallback.smtp.from_address is not an email address"),
        ({"smtp": {"username": "agent"}}, "username and fallback.smtp.password go together"),
        ({"smtp": {"timeout_seconds": 0}}, "fallback.smtp.timeout_seconds must be more than 0"),
        ({"smtp": {"ca_file": "/nonexistent/ca.pem", "security": "starttls"}}, "cannot be loaded"),
        ({"smtp": {"mailhost": "x"}}, "fallback.smtp: unknown setting 'mailhost'"),
    ],
)
def test_a_wrong_fallback_setting_is_refused_at_construction_naming_it(buffer_path, relay, change, words):
    settings = relay.settings()
    smtp = change.pop("smtp", {})
    if smtp is None:
        settings.pop("smtp")
    else:
        settings["smtp"].update(smtp)
    settings.update(change)

    with pytest.raises(FallbackConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SiteOutbox(buffer_path, None, None, fallback=settings)


def test_a_password_is_never_sent_in_clear_to_a_relay_on_another_host(buffer_path, relay):
    settings = relay.settings(smtp={"host": "mail.plant-a.example.com", "username": "agent", "password": "s3cret"})

    with pytest.raises(FallbackConfigError, match="would cross the network in clear"):
        SiteOutbox(buffer_path, None, None, fallback=settings)


# --- when it delivers -----------------------------------------------------------------------------


def test_a_critical_row_reaches_the_relay_after_after_seconds_and_one_sweep_and_a_normal_one_does_not(
    down_outbox, central, relay, clock
):
    outbox = down_outbox()
    central.always = Reset()  # central is down
    critical = trip(outbox)
    (normal,) = send_many(outbox, 1)

    outbox.forward_once()
    clock.advance(299)
    outbox.forward_once()
    assert outbox.deliver_locally_once().active is False
    clock.advance(1)
    outbox.forward_once()
    result = outbox.deliver_locally_once()

    assert (result.active, result.delivered) == (True, 1)
    assert relay.ids() == {critical: 1}
    (message,) = relay.messages
    assert message["Subject"] == "[sent locally by site plant-a] Boiler trip"
    assert message["X-Notification-Id"] == critical
    assert message["From"] == "outbox-agent@plant-a.example.com"
    assert message["To"] == "control-room@plant-a.example.com"
    text = message.get_content()
    assert f"Central ({central.url}) has been unreachable from site plant-a since 2026-11-21T10:00:00.000000Z" in text
    assert "Drum pressure 182 bar" in text and "Source: B1" in text
    status = outbox.status(critical)
    assert (status["status"], status["delivered_locally_at"]) == ("Forwarding", "2026-11-21T10:05:00.000000Z")
    assert status["local_delivery"]["state"] == "delivered"
    assert outbox.status(normal)["local_delivery"] is None

    clock.advance(3600)
    outbox.forward_once()
    outbox.deliver_locally_once()
    assert relay.ids() == {critical: 1}  # once


def test_the_forwarder_hands_a_critical_row_to_the_relay_once_central_has_been_down_after_seconds(make_outbox, relay):
    outbox = make_outbox(
        central_url=closed_port_url(),
        fallback=relay.settings(after_seconds=0.3),
        sweep_interval=0.05,
        retry_interval=0.05,
        heartbeat_interval=0,
        clock=None,
    )
    stop = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop,))
    started = time.monotonic()
    forwarder.start()
    try:
        critical = trip(outbox)
        send_many(outbox, 1)
        relay.wait_for(1)
        waited = time.monotonic() - started
        stop.set()
    finally:
        stop.set()
        forwarder.join(10)

    assert not forwarder.is_alive()
    assert waited >= 0.3
    assert relay.ids() == {critical: 1}


def test_high_rows_go_too_when_min_priority_is_high_and_low_never(down_outbox, central, relay, clock):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0))
    central.always = Reset()
    high = trip(outbox, "High level", priority="high")
    trip(outbox, "Low level", priority="low")

    outbox.forward_once()
    outbox.deliver_locally_once()

    assert relay.ids() == {high: 1}


def test_a_429_is_not_an_outage_so_nothing_goes_to_the_relay(down_outbox, central, relay, clock):
    outbox = down_outbox(fallback=relay.settings(after_seconds=60))
    central.budgets["critical"] = 0
    trip(outbox)

    for _ in range(5):
        outbox.forward_once()
        clock.advance(60)
        assert outbox.deliver_locally_once().active is False

    assert relay.messages == []


def test_a_refused_key_counts_as_central_unreachable_for_the_fallback(down_outbox, central, relay, clock):
    outbox = down_outbox(fallback=relay.settings(after_seconds=60))
    central.always = Reply(401, {"error": "authentication_failed", "detail": "Invalid API key."})
    critical = trip(outbox)

    for _ in range(2):
        with pytest.raises(CredentialRejected):
            outbox.forward_once()
        clock.advance(60)
    outbox.deliver_locally_once()

    assert relay.ids() == {critical: 1}


# --- when central is back ----------------------------------------------------------------------------


def test_when_central_is_back_the_row_is_forwarded_with_delivered_locally_at(down_outbox, central, relay, clock):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0))
    central.always = Reset()
    critical = trip(outbox)
    (normal,) = send_many(outbox, 1)
    outbox.forward_once()
    outbox.deliver_locally_once()

    central.always = None
    clock.advance(30)
    assert outbox.forward_once().forwarded == 2

    assert central.stored[critical]["delivered_locally_at"] == "2026-11-21T10:00:00.000000Z"
    assert central.stored[critical]["priority"] == "critical"
    assert "delivered_locally_at" not in central.stored[normal]
    assert outbox.stats() == {"buffered": 0, "parked": 0}
    assert relay.ids() == {critical: 1}


def test_a_row_central_already_had_is_replayed_with_delivered_locally_at(down_outbox, central, relay, clock):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0))
    critical = trip(outbox)

    def committed_but_answer_lost(received):
        central._ingest(received.body)
        return Reset()

    central.then(committed_but_answer_lost)
    central.always = Reset()
    outbox.forward_once()
    outbox.deliver_locally_once()
    central.always = None
    clock.advance(30)

    assert outbox.forward_once().forwarded == 1

    assert central.stored[critical]["delivered_locally_at"] == "2026-11-21T10:00:00.000000Z"


# --- at most one local copy ----------------------------------------------------------------------------

FORWARDER = """
import sys, threading
from sites.agent import SiteOutbox
outbox = SiteOutbox(sys.argv[1], sys.argv[2], "site-key", fallback={fallback}, site_id="plant-a",
                    sweep_interval=0.05, retry_interval=0.05, heartbeat_interval=0)
print("running", flush=True)
outbox.run_forever(threading.Event())
"""


def agent_forwarder(buffer_path, relay):
    code = FORWARDER.format(fallback=repr(relay.settings(after_seconds=0)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(buffer_path), closed_port_url()],
        cwd=str(REPO),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "running"
    return process


def test_an_agent_killed_while_the_relay_holds_the_message_end_sends_no_second_copy_after_restart(buffer_path, relay):
    with SiteOutbox(buffer_path, None, None) as sender:
        first = trip(sender)
    relay.hold()  # the relay takes the final dot and answers nothing
    process = agent_forwarder(buffer_path, relay)
    try:
        assert relay.holding.wait(20), "the message's end never reached the relay"
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        process.kill()
    relay.release()

    restarted = agent_forwarder(buffer_path, relay)
    try:
        with SiteOutbox(buffer_path, None, None) as sender:
            second = trip(sender, "Second boiler trip")
            relay.wait_for(2)  # the restarted agent delivers what is new …
            third = trip(sender, "Third boiler trip")
            relay.wait_for(3)  # … pass after pass
            status = sender.status(first)
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(10)
        restarted.kill()

    assert relay.ids() == {first: 1, second: 1, third: 1}  # never the first one again
    assert relay.data_calls == 3
    assert status is not None and status["local_delivery"]["state"] in ("ending", "unknown")
    assert status["delivered_locally_at"] is None  # central will deliver it too: not told it was delivered here


def test_a_relay_that_never_answers_the_message_end_leaves_the_row_unknown_and_never_resends_it(
    down_outbox, central, relay, clock
):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0, smtp={"timeout_seconds": 0.5}))
    central.always = Reset()
    critical = trip(outbox)
    relay.hold()
    outbox.forward_once()

    result = outbox.deliver_locally_once()
    relay.release()
    clock.advance(3600)
    outbox.deliver_locally_once()
    central.always = None
    outbox.forward_once()

    assert result.unknown == 1
    assert relay.data_calls == 1
    assert "delivered_locally_at" not in central.stored[critical]  # central delivers it as well


def test_two_forwarders_on_one_buffer_never_both_send_a_row_locally(buffer_path, central, relay, clock):
    central.always = Reset()
    options = {"fallback": relay.settings(after_seconds=0), "clock": clock, "site_id": "plant-a"}
    with SiteOutbox(buffer_path, central.url, GOOD_KEY, **options) as first, SiteOutbox(
        buffer_path, central.url, GOOD_KEY, **options
    ) as second:
        critical = trip(first)
        first.forward_once()
        relay.hold()
        passes = [threading.Thread(target=agent.deliver_locally_once) for agent in (first, second)]
        passes[0].start()
        assert relay.holding.wait(10)
        passes[1].start()  # the row is claimed and its end is at the relay: nothing for this one
        passes[1].join(10)
        relay.release()
        passes[0].join(10)

    assert relay.ids() == {critical: 1} and relay.data_calls == 1


# --- a failing relay ------------------------------------------------------------------------------------


def test_a_relay_refusing_is_retried_on_the_interval_and_shows_in_status_doctor_and_heartbeat(
    down_outbox, central, relay, clock
):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0), retry_interval=30)
    central.always = Reset()
    relay.refuse_with = "451 4.3.0 Mail server temporarily rejected message"
    critical = trip(outbox)
    outbox.forward_once()

    outbox.deliver_locally_once()
    outbox.deliver_locally_once()  # not again before the interval
    assert relay.data_calls == 1
    status = outbox.status(critical)
    checks = {check.name: check for check in doctor.doctor_run(db_path=outbox.buffer.path, client=None, clock=clock)}
    assert outbox.link is not None
    report = outbox.link.heartbeat_report()

    clock.advance(30)
    relay.refuse_with = None
    outbox.deliver_locally_once()

    expected_error = (
        f"local relay 127.0.0.1:{relay.port} (none): message refused: 451 4.3.0 Mail server temporarily rejected "
        "message"
    )
    assert (status["local_delivery"]["state"], status["local_delivery"]["error"]) == ("failed", expected_error)
    assert report["fallback"] == {
        "configured": True,
        "active": True,
        "delivered": 0,
        "failing": 1,
        "last_error": expected_error,
        "last_error_at": "2026-11-21T10:00:00.000000Z",
    }
    assert "fallback" not in checks  # doctor_run without the fallback configuration checks nothing of it
    assert relay.ids() == {critical: 1} and relay.data_calls == 2
    assert outbox.link.heartbeat_report()["fallback"]["failing"] == 0


def test_doctor_names_the_relays_failures_and_the_relay_itself(down_outbox, central, relay, clock, tmp_path):
    outbox = down_outbox(fallback=relay.settings(after_seconds=0))
    central.always = Reset()
    relay.refuse_with = "554 5.7.1 Relay access denied"
    trip(outbox)
    outbox.forward_once()
    outbox.deliver_locally_once()

    checks = {
        check.name: check
        for check in doctor.doctor_run(
            db_path=outbox.buffer.path, client=None, clock=clock, fallback=outbox.fallback_config
        )
    }

    assert checks["fallback"].level == "FAIL"
    assert "1 notification(s) the local relay could not take" in checks["fallback"].detail
    assert "554 5.7.1 Relay access denied" in checks["fallback"].detail
    assert checks["relay"].level == "OK"
    assert checks["relay"].detail.startswith(f"127.0.0.1:{relay.port} (none) answers")


def test_a_relay_that_is_down_is_retried_on_the_interval_and_forwarding_goes_on(down_outbox, central, clock):
    outbox = down_outbox(
        fallback={
            "after_seconds": 0,
            "smtp": {
                "host": "127.0.0.1",
                "port": int(closed_port_url().rsplit(":", 1)[1]),
                "from_address": "a@b.example",
                "to": ["c@d.example"],
                "timeout_seconds": 2,
            },
        },
        retry_interval=30,
    )
    central.always = Reset()
    critical = trip(outbox)
    outbox.forward_once()

    result = outbox.deliver_locally_once()
    again = outbox.deliver_locally_once()
    central.always = None
    clock.advance(30)
    forwarded = outbox.forward_once().forwarded

    assert result.relay_unreachable and result.failed == 1
    assert (again.failed, again.delivered) == (0, 0)  # the relay is waited out, not hammered
    assert forwarded == 1 and critical in central.stored  # central took it; nothing was held up
    assert "delivered_locally_at" not in central.stored[critical]


def test_a_relay_that_hangs_does_not_hold_up_forwarding(make_outbox, central, relay):
    outbox = make_outbox(
        fallback=relay.settings(after_seconds=0),
        sweep_interval=0.05,
        retry_interval=0.05,
        heartbeat_interval=0,
        clock=None,
    )
    central.always = Reset()
    critical = trip(outbox)
    relay.hold()
    stop = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop,))
    forwarder.start()
    try:
        assert relay.holding.wait(10)  # the relay sits on the critical row's end …
        central.always = None
        ordinary = send_many(outbox, 3)
        deadline = time.monotonic() + 10
        while not all(nid in central.stored for nid in ordinary) and time.monotonic() < deadline:
            time.sleep(0.02)
        forwarded_meanwhile = all(nid in central.stored for nid in ordinary)  # … while forwarding goes on
        relay.release()
    finally:
        relay.release()
        stop.set()
        forwarder.join(10)

    assert forwarded_meanwhile
    assert relay.ids() == {critical: 1}


# --- the configuration file -----------------------------------------------------------------------------


def test_the_cli_takes_the_fallback_from_the_configuration_file(relay, buffer_path, tmp_path, capsys, monkeypatch):
    config = tmp_path / "agent.json"
    config.write_text(
        json.dumps(
            {
                "db": str(buffer_path),
                "central_url": closed_port_url(),
                "key": "site-key",
                "site_id": "plant-a",
                "fallback": relay.settings(after_seconds=0),
            }
        )
    )
    monkeypatch.setenv("OUTBOX_AGENT_CONFIG", str(config))
    main(["send", "--list", "Operators", "--subject", "Boiler trip", "--body", "x", "--priority", "critical"])
    critical = capsys.readouterr().out.strip()

    code = main(["forward", "--once"])
    out = capsys.readouterr().out

    assert code == 0
    assert "central unreachable: local relay delivered 1, failed 0, unknown 0" in out
    assert relay.ids() == {critical: 1}
    assert relay.messages[0]["Subject"] == "[sent locally by site plant-a] Boiler trip"
