"""Watchdogs: ``outbox.watchdog(name, every_seconds, list_name)`` keeps one row per watchdog
with only its latest ping, makes no network call, and the forwarder sends the latest ping with
``pinged_at`` before its heartbeat. Central is the scripted stand-in."""

import logging
import threading

import pytest

from sites.agent import InvalidNotification
from sites.agent.buffer import Buffer
from sites.agent.cli import main
from tests.agent.fake_central import Reply

WATCHDOGS = "/api/v1/sites/watchdogs/"
HEARTBEAT = "/api/v1/sites/heartbeat/"


def test_a_watchdog_keeps_one_row_per_name_with_only_the_latest_ping_and_calls_nobody(outbox, central, clock):
    for _ in range(120):  # a SCADA main loop, once a second for two minutes
        outbox.watchdog("pump-loop", 60, "Operators")
        clock.advance(1)
    outbox.watchdog("historian", 300, "Shift-Leads", type="sms")

    pings = {ping.name: ping for ping in outbox.buffer.watchdogs()}

    assert sorted(pings) == ["historian", "pump-loop"]
    assert pings["pump-loop"].pinged_at == "2026-11-21T10:01:59.000000Z"
    assert (pings["historian"].every_seconds, pings["historian"].list_name, pings["historian"].type) == (
        300,
        "Shift-Leads",
        "sms",
    )
    assert central.requests == [] and central.site_requests == []  # nothing left the site


def test_pings_are_sent_before_the_heartbeat_with_pinged_at(outbox, central, clock):
    outbox.watchdog("pump-loop", 60, "Operators")
    outbox.watchdog("historian", 300, "Shift-Leads", type="sms")

    outbox.sync_with_central()

    assert [r.path for r in central.site_requests] == [WATCHDOGS, WATCHDOGS, HEARTBEAT]
    assert central.watchdog_pings() == [
        {
            "name": "historian",
            "every_seconds": 300,
            "list_name": "Shift-Leads",
            "type": "sms",
            "pinged_at": "2026-11-21T10:00:00.000000Z",
        },
        {
            "name": "pump-loop",
            "every_seconds": 60,
            "list_name": "Operators",
            "pinged_at": "2026-11-21T10:00:00.000000Z",
        },
    ]
    assert central.watchdogs["pump-loop"]["last_ping_at"] == "2026-11-21T10:00:00.000000Z"


def test_after_an_outage_only_each_watchdogs_latest_ping_is_sent(outbox, central, clock):
    central.site_always = Reply(503, {"error": "database_unavailable", "detail": "down"})
    for _ in range(30):
        outbox.watchdog("pump-loop", 60, "Operators")
        outbox.sync_with_central(heartbeat=False)
        clock.advance(10)
    failed = len(central.watchdog_pings())

    central.site_always = None
    outbox.sync_with_central()

    assert failed == 30  # one try per cycle, each failing
    assert central.watchdog_pings()[failed:] == [
        {"name": "pump-loop", "every_seconds": 60, "list_name": "Operators", "pinged_at": "2026-11-21T10:04:50.000000Z"}
    ]


def test_a_ping_central_has_is_not_sent_again(outbox, central):
    outbox.watchdog("pump-loop", 60, "Operators")

    outbox.sync_with_central()
    outbox.sync_with_central()

    assert len(central.watchdog_pings()) == 1


def test_a_ping_made_while_the_previous_one_was_being_sent_is_sent_next(outbox, central, clock):
    outbox.watchdog("pump-loop", 60, "Operators")

    def ping_again_meanwhile(received):
        if received.path == WATCHDOGS and len(central.watchdog_pings()) == 1:
            clock.advance(5)
            outbox.watchdog("pump-loop", 60, "Operators")
        return None

    central.site_always = ping_again_meanwhile
    outbox.sync_with_central(heartbeat=False)
    outbox.sync_with_central(heartbeat=False)

    assert [ping["pinged_at"] for ping in central.watchdog_pings()] == [
        "2026-11-21T10:00:00.000000Z",
        "2026-11-21T10:00:05.000000Z",
    ]


def test_a_central_without_the_watchdog_endpoint_gets_one_warning_and_no_resends(outbox, central, caplog):
    outbox.watchdog("pump-loop", 60, "Operators")

    def no_watchdogs(received):
        return Reply(404, {"detail": "Not found."}) if received.path == WATCHDOGS else None

    central.site_always = no_watchdogs
    with caplog.at_level(logging.WARNING, logger="sites.agent"):
        outbox.sync_with_central()
        outbox.sync_with_central()

    assert len(central.watchdog_pings()) == 1
    warnings = [r.getMessage() for r in caplog.records if "watchdog pings" in r.getMessage()]
    assert len(warnings) == 1 and "older than this agent" in warnings[0]


@pytest.mark.parametrize(
    "name, every_seconds, list_name, error, words",
    [
        ("", 60, "Operators", InvalidNotification, "must not be blank"),
        ("pump\nloop", 60, "Operators", InvalidNotification, "single line"),
        ("pump-loop", 0, "Operators", InvalidNotification, "every_seconds: must be from 1 to"),
        ("pump-loop", 1.5, "Operators", TypeError, "every_seconds must be an int"),
        ("pump-loop", True, "Operators", TypeError, "every_seconds must be an int"),
        ("pump-loop", 60, " ", InvalidNotification, "list_name: must not be blank"),
    ],
)
def test_a_watchdog_central_would_refuse_is_refused_at_the_call(outbox, name, every_seconds, list_name, error, words):
    with pytest.raises(error, match=words):
        outbox.watchdog(name, every_seconds, list_name)
    assert outbox.buffer.watchdogs() == []


def test_the_forwarder_sends_pings_before_its_heartbeat(make_outbox, central):
    outbox = make_outbox(sweep_interval=0.05, heartbeat_interval=0.2, clock=None)
    outbox.watchdog("pump-loop", 60, "Operators")
    stop = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop,))
    forwarder.start()
    try:
        central.wait_for_site_requests(lambda requests: sum(r.path == HEARTBEAT for r in requests) >= 2)
        outbox.watchdog("pump-loop", 60, "Operators")
        central.wait_for_site_requests(lambda requests: len([r for r in requests if r.path == WATCHDOGS]) >= 2)
    finally:
        stop.set()
        forwarder.join(10)

    paths = [r.path for r in central.site_requests]
    assert paths[:2] == [WATCHDOGS, HEARTBEAT]


def test_the_watchdog_command_records_a_ping(buffer_path, capsys):
    code = main(["--db", str(buffer_path), "watchdog", "pump-loop", "--every", "60", "--list", "Operators"])
    bad = main(["--db", str(buffer_path), "watchdog", "pump-loop", "--every", "0", "--list", "Operators"])

    assert code == 0
    assert bad == 2 and "every_seconds: must be from 1 to" in capsys.readouterr().err
    buffer = Buffer(buffer_path)  # no central URL or key needed: the forwarder sends it
    try:
        (ping,) = buffer.watchdogs()
    finally:
        buffer.close()
    assert (ping.name, ping.every_seconds, ping.list_name) == ("pump-loop", 60, "Operators")
