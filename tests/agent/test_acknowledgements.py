"""Acknowledgements both ways. From central: ``acknowledged`` commands are stored in the buffer
once, acknowledged to central, read by the plant's code with ``acknowledgements()`` (handed
over once with ``consume=True``, whichever process reads, across restarts) and shown by
``status()``. From the plant: ``acknowledge()`` and ``clear()`` are buffered and sent to central
once the notification itself has reached central. Central is the scripted stand-in."""

import json
import logging
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from sites.agent import InvalidNotification
from sites.agent.cli import main
from sites.agent.sitelink import SITE_ACTION_NOT_FOUND_TRIES
from tests.agent.conftest import send_many
from tests.agent.fake_central import Reply

REPO = Path(__file__).resolve().parents[2]


def acknowledged(notification_id, *, by="o***@plant-a.example.com", via="link", note="on my way", at=None):
    return {
        "id": str(uuid.uuid4()),
        "action": "acknowledged",
        "notification_id": notification_id,
        "acknowledged_at": at or "2026-11-21T10:03:00.000000Z",
        "acknowledged_via": via,
        "acknowledged_by": by,
        "note": note,
    }


def forwarded(outbox, count=1):
    sent = send_many(outbox, count)
    assert outbox.forward_once().forwarded == count
    return sent


# --- from central ---------------------------------------------------------------------------------


def test_an_acknowledged_command_is_stored_once_and_acknowledged_to_central(outbox, central, clock):
    (notification_id,) = forwarded(outbox)
    command = acknowledged(notification_id)
    central.commands.append(command)

    outbox.sync_with_central()
    central.acks.clear()  # the acknowledgement got lost: central hands the command out again
    clock.advance(30)
    outbox.sync_with_central()

    assert outbox.acknowledgements() == [
        {
            "notification_id": notification_id,
            "acknowledged_at": "2026-11-21T10:03:00.000000Z",
            "acknowledged_via": "link",
            "acknowledged_by": "o***@plant-a.example.com",
            "note": "on my way",
            "received_at": "2026-11-21T10:00:00.000000Z",
        }
    ]
    assert central.acks[command["id"]] == {"result": "done", "detail": "stored at the site for the plant's code"}


def test_a_second_acknowledgement_of_the_same_notification_keeps_the_first(outbox, central, clock):
    (notification_id,) = forwarded(outbox)
    central.commands.append(acknowledged(notification_id, by="first"))
    outbox.sync_with_central()
    later = acknowledged(notification_id, by="second")
    central.commands.append(later)
    outbox.sync_with_central()

    assert [ack["acknowledged_by"] for ack in outbox.acknowledgements()] == ["first"]
    assert central.acks[later["id"]]["detail"] == "already stored at the site (acknowledged before); nothing changed"


def test_acknowledgements_come_in_the_order_they_arrived_and_since_filters_on_arrival(outbox, central, clock):
    first, second = forwarded(outbox, 2)
    central.commands.append(acknowledged(first))
    outbox.sync_with_central()
    clock.advance(60)
    central.commands.append(
        acknowledged(second, at="2026-11-21T09:59:00.000000Z")
    )  # acknowledged earlier, arrived later
    outbox.sync_with_central()

    assert [a["notification_id"] for a in outbox.acknowledgements()] == [first, second]
    assert [a["notification_id"] for a in outbox.acknowledgements(since="2026-11-21T10:00:30Z")] == [second]
    naive = datetime(2026, 11, 21, 10, 0, 30)  # taken as UTC
    assert [a["notification_id"] for a in outbox.acknowledgements(since=naive)] == [second]
    aware = datetime(2026, 11, 21, 11, 0, 30, tzinfo=timezone.utc)
    assert outbox.acknowledgements(since=aware) == []
    with pytest.raises(ValueError, match="since must be a datetime or an ISO-8601 time"):
        outbox.acknowledgements(since="yesterday")


def test_the_last_received_at_is_a_cursor_that_misses_nothing_even_when_the_clock_steps_back(outbox, central, clock):
    first, second, third = forwarded(outbox, 3)
    central.commands.append(acknowledged(first))
    outbox.sync_with_central()
    (seen,) = outbox.acknowledgements()
    clock.advance(-120)  # NTP steps the site's clock back two minutes
    central.commands.append(acknowledged(second))
    outbox.sync_with_central()
    central.commands.append(acknowledged(third))
    outbox.sync_with_central()

    newer = outbox.acknowledgements(since=seen["received_at"])
    assert [a["notification_id"] for a in newer] == [second, third]
    assert seen["received_at"] < newer[0]["received_at"] < newer[1]["received_at"]
    assert outbox.acknowledgements(since=newer[1]["received_at"]) == []


READER = """
import json, sys
from sites.agent import SiteOutbox
with SiteOutbox(sys.argv[1], None, None) as outbox:
    print(json.dumps([a["notification_id"] for a in outbox.acknowledgements(consume=True)]))
"""


def read_in_a_new_process(buffer_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", READER, str(buffer_path)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_consumed_acknowledgements_are_handed_over_once_across_restarts_of_the_reading_process(
    outbox, central, buffer_path
):
    first, second = forwarded(outbox, 2)
    central.commands.append(acknowledged(first))
    outbox.sync_with_central()  # the forwarder stores it; the HMI reads in processes of its own

    assert read_in_a_new_process(buffer_path) == [first]
    assert read_in_a_new_process(buffer_path) == []  # restarted: not handed over again
    central.commands.append(acknowledged(second))
    outbox.sync_with_central()
    assert read_in_a_new_process(buffer_path) == [second]
    assert [a["notification_id"] for a in outbox.acknowledgements()] == [first, second]  # a plain read sees all


def test_status_includes_the_acknowledgement(outbox, central):
    notification_id, not_acknowledged = forwarded(outbox, 2)
    (still_here,) = send_many(outbox, 1)
    central.commands.extend([acknowledged(notification_id), acknowledged(still_here, via="sms", note="")])
    outbox.sync_with_central()

    at_central = outbox.status(notification_id)
    at_site = outbox.status(still_here)

    assert at_central["location"] == "central" and at_central["acknowledgement"]["acknowledged_via"] == "link"
    assert at_site["location"] == "site" and at_site["acknowledgement"]["acknowledged_via"] == "sms"
    assert outbox.status(not_acknowledged)["acknowledgement"] is None


def test_the_acknowledgements_command_prints_and_consumes(outbox, central, buffer_path, capsys):
    (notification_id,) = forwarded(outbox)
    central.commands.append(acknowledged(notification_id))
    outbox.sync_with_central()

    first = main(["--db", str(buffer_path), "acknowledgements", "--consume", "--json"])
    consumed = json.loads(capsys.readouterr().out)
    main(["--db", str(buffer_path), "acknowledgements", "--consume", "--json"])
    again = json.loads(capsys.readouterr().out)
    main(["--db", str(buffer_path), "acknowledgements"])
    text = capsys.readouterr().out

    assert first == 0 and [a["notification_id"] for a in consumed] == [notification_id] and again == []
    assert text.startswith(
        f"{notification_id}  acknowledged 2026-11-21T10:03:00.000000Z via link by o***@plant-a.example.com — on my way"
    )


# --- from the plant -------------------------------------------------------------------------------------


def test_acknowledge_and_clear_wait_for_the_notification_to_reach_central_then_go_in_order(outbox, central, clock):
    (notification_id,) = send_many(outbox, 1)
    outbox.acknowledge(notification_id, by="Shift lead B. Ortiz", note="Pump switched to standby")
    outbox.clear(notification_id, note="Pressure back to normal")

    outbox.sync_with_central(heartbeat=False)
    assert central.site_acks == {} and central.site_clears == {}  # the notification is still at the site

    outbox.forward_once()
    outbox.sync_with_central(heartbeat=False)

    paths = [r.path for r in central.site_requests if r.path.startswith("/api/v1/notifications/")]
    assert paths == [f"/api/v1/notifications/{notification_id}/ack/", f"/api/v1/notifications/{notification_id}/clear/"]
    assert central.site_acks[notification_id] == {"by": "Shift lead B. Ortiz", "note": "Pump switched to standby"}
    assert central.site_clears[notification_id] == {"note": "Pressure back to normal"}
    assert outbox.buffer.site_actions_waiting() == 0


def test_an_acknowledgement_survives_a_restart_and_an_outage(make_outbox, central, clock):
    first = make_outbox()
    (notification_id,) = forwarded(first)
    first.acknowledge(notification_id)
    central.site_always = Reply(503, {"error": "database_unavailable", "detail": "down"})
    first.sync_with_central(heartbeat=False)
    first.close()

    central.site_always = None
    restarted = make_outbox()
    restarted.sync_with_central(heartbeat=False)

    assert central.site_acks[notification_id] == {}


def test_a_404_is_retried_a_few_times_then_the_call_is_dropped_with_a_log_line(outbox, central, clock, caplog):
    unknown = str(uuid.uuid4())  # central never had it
    outbox.clear(unknown)

    with caplog.at_level(logging.ERROR, logger="sites.agent"):
        for _ in range(SITE_ACTION_NOT_FOUND_TRIES + 2):
            outbox.sync_with_central(heartbeat=False)
            clock.advance(30)

    tries = [r for r in central.site_requests if r.path == f"/api/v1/notifications/{unknown}/clear/"]
    assert len(tries) == SITE_ACTION_NOT_FOUND_TRIES
    assert outbox.buffer.site_actions_waiting() == 0
    assert any(f"Central does not know notification {unknown}" in r.getMessage() for r in caplog.records)


def test_a_404_is_not_retried_before_the_retry_interval(outbox, central, clock):
    outbox.acknowledge(str(uuid.uuid4()))

    outbox.sync_with_central(heartbeat=False)
    outbox.sync_with_central(heartbeat=False)

    assert len([r for r in central.site_requests if r.path.endswith("/ack/")]) == 1


def test_a_400_drops_the_call_with_a_log_line(outbox, central, caplog):
    (notification_id,) = forwarded(outbox)
    outbox.acknowledge(notification_id, note="x")
    central.site_always = Reply(400, {"error": "invalid", "errors": {"note": ["Too long."]}})

    with caplog.at_level(logging.ERROR, logger="sites.agent"):
        outbox.sync_with_central(heartbeat=False)

    assert outbox.buffer.site_actions_waiting() == 0
    assert any("Central refused the acknowledgement of" in r.getMessage() for r in caplog.records)


def test_link_failures_keep_the_call_without_counting(outbox, central, clock):
    (notification_id,) = forwarded(outbox)
    outbox.acknowledge(notification_id)
    central.site_always = Reply(502)
    for _ in range(SITE_ACTION_NOT_FOUND_TRIES + 2):
        outbox.sync_with_central(heartbeat=False)
    central.site_always = None

    outbox.sync_with_central(heartbeat=False)

    assert notification_id in central.site_acks


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda outbox: outbox.acknowledge("pump-3"), ValueError, "badly formed"),
        (lambda outbox: outbox.acknowledge(str(uuid.uuid4()), by="a\nb"), InvalidNotification, "by: must be a single"),
        (lambda outbox: outbox.clear(str(uuid.uuid4()), note="x" * 1001), InvalidNotification, "note: must be at most"),
    ],
)
def test_an_acknowledgement_central_would_refuse_is_refused_at_the_call(outbox, call, error, words):
    with pytest.raises(error, match=words):
        call(outbox)
    assert outbox.buffer.site_actions_waiting() == 0


def test_the_acknowledge_and_clear_commands_buffer_the_calls(buffer_path, capsys):
    notification_id = str(uuid.uuid4())

    ack = main(["--db", str(buffer_path), "acknowledge", notification_id, "--by", "HMI 2", "--note", "seen"])
    clear = main(["--db", str(buffer_path), "clear", notification_id])
    bad = main(["--db", str(buffer_path), "clear", "pump-3"])

    out, err = capsys.readouterr()
    assert (ack, clear, bad) == (0, 0, 2)
    assert f"acknowledgement of {notification_id} buffered" in out
    assert "'pump-3' is not a notification id" in err
