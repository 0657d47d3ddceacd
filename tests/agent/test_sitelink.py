"""What the agent tells central about the site (heartbeats, parked reports) and what it does for
central's operators (commands executed once, acknowledged, remembered across restarts)."""

import json
import logging
import sqlite3
import uuid

import sites.agent
from sites.agent.buffer import Buffer
from tests.agent.conftest import send_many
from tests.agent.fake_central import Reply

REJECTED = Reply(400, {"error": "invalid", "detail": "Invalid input.", "errors": {"type": ["Unknown type 'sms'."]}})


def command(action, notification_id, command_id=None):
    return {"id": command_id or str(uuid.uuid4()), "action": action, "notification_id": notification_id, "reason": ""}


def park_one(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    central.then(REJECTED)
    assert outbox.forward_once().parked == 1
    return notification_id


# --- heartbeats -------------------------------------------------------------------------------------


def test_a_heartbeat_reports_the_buffer_the_last_forward_and_the_agent_version(make_outbox, central, clock):
    outbox = make_outbox()
    park_one(outbox, central)
    send_many(outbox, 2)
    central.then(Reply(503, {"error": "database_unavailable", "detail": "down"}))
    outbox.forward_once()
    clock.advance(60)
    outbox.forward_once()  # forwards both

    send_many(outbox, 1)
    outbox.sync_with_central()

    (heartbeat,) = central.heartbeats()
    assert heartbeat == {
        "agent_version": sites.agent.__version__,
        "buffered": 1,
        "parked": 1,
        "oldest_buffered_at": "2026-11-21T10:01:00.000000Z",
        "last_forward_at": "2026-11-21T10:01:00.000000Z",
        "last_error": "",
        "capabilities": ["acknowledged"],
    }


def test_the_last_error_is_reported_until_a_forward_succeeds(make_outbox, central, clock):
    outbox = make_outbox()
    send_many(outbox, 1)
    central.then(Reply(503, {"error": "database_unavailable", "detail": "down"}))
    outbox.forward_once()
    outbox.sync_with_central()
    clock.advance(60)
    outbox.forward_once()
    outbox.sync_with_central()

    first, second = central.heartbeats()
    assert first["last_error"] == "HTTP 503: database_unavailable: down" and first["last_forward_at"] is None
    assert second["last_error"] == "" and second["last_forward_at"] == "2026-11-21T10:01:00.000000Z"


def test_a_central_without_site_endpoints_gets_one_warning_and_forwarding_goes_on(make_outbox, central, caplog):
    outbox = make_outbox()
    central.site_always = Reply(404, {"error": "not_found", "detail": "No such resource."})
    send_many(outbox, 1)
    with caplog.at_level(logging.WARNING, logger="sites.agent"):
        outbox.sync_with_central()
        outbox.sync_with_central()
        assert outbox.forward_once().forwarded == 1

    warnings = [r.getMessage() for r in caplog.records if "older than this agent" in r.getMessage()]
    assert len(warnings) == 1


# --- parked reports ---------------------------------------------------------------------------------


def test_a_row_parked_at_the_site_is_reported_with_its_reason_and_only_once(make_outbox, central):
    outbox = make_outbox()
    notification_id = park_one(outbox, central)

    outbox.sync_with_central(heartbeat=False)
    outbox.sync_with_central(heartbeat=False)

    reports = [r.body for r in central.site_requests if r.path == "/api/v1/sites/parked/"]
    assert len(reports) == 1
    (item,) = reports[0]["parked"]
    assert item["notification_id"] == notification_id
    assert item["reason"] == "Rejected by central: HTTP 400: invalid: Invalid input.: type: Unknown type 'sms'."
    assert (item["list_name"], item["subject"], item["type"]) == ("Operators", "Pump 0 tripped", "email")
    assert item["source_instance_id"] == "Pump0" and item["parked_at"] == "2026-11-21T10:00:00.000000Z"


def test_retry_and_discard_at_the_site_are_reported_so_centrals_view_heals(make_outbox, central):
    outbox = make_outbox()
    retried, discarded = park_one(outbox, central), park_one(outbox, central)
    outbox.sync_with_central(heartbeat=False)
    assert set(central.parked) == {retried, discarded}

    assert outbox.retry(retried)
    assert outbox.discard(discarded) is not None
    outbox.sync_with_central(heartbeat=False)

    assert central.parked == {}
    assert {nid: item["outcome"] for nid, item in central.unparked.items()} == {
        retried: "retried",
        discarded: "discarded",
    }


def test_a_report_central_could_not_take_is_sent_later(make_outbox, central):
    outbox = make_outbox()
    notification_id = park_one(outbox, central)
    central.site_always = Reply(503, {"error": "database_unavailable", "detail": "down"})
    outbox.sync_with_central(heartbeat=False)
    assert central.parked == {}

    central.site_always = None
    outbox.sync_with_central(heartbeat=False)
    assert set(central.parked) == {notification_id}


def test_a_buffer_written_by_the_previous_agent_version_reports_its_parked_rows(buffer_path, make_outbox, central):
    with sqlite3.connect(str(buffer_path)) as old:  # version 1: the table alone
        old.execute(
            "CREATE TABLE outbox_buffer (notification_id TEXT PRIMARY KEY, payload TEXT NOT NULL,"
            " created_at TEXT NOT NULL, retry_count INTEGER NOT NULL DEFAULT 0, next_attempt_at TEXT NOT NULL,"
            " last_attempt_at TEXT, last_error TEXT NOT NULL DEFAULT '', status TEXT NOT NULL DEFAULT 'forwarding')"
        )
        payload = {"notification_id": "0b5e3c8e-0000-4000-8000-000000000001", "list_name": "Ops", "subject": "old"}
        old.execute(
            "INSERT INTO outbox_buffer VALUES (?, ?, '2026-01-01T00:00:00.000000Z', 50,"
            " '2026-01-01T00:00:00.000000Z', '2026-01-01T01:00:00.000000Z', 'Retries exhausted', 'parked')",
            (payload["notification_id"], json.dumps(payload)),
        )
        old.execute("PRAGMA user_version = 1")

    make_outbox().sync_with_central(heartbeat=False)

    assert central.parked[payload["notification_id"]]["reason"] == "Retries exhausted"


# --- commands -----------------------------------------------------------------------------------------


def test_a_retry_command_forwards_the_parked_row_and_is_acknowledged(make_outbox, central):
    outbox = make_outbox()
    notification_id = park_one(outbox, central)
    retry = command("retry", notification_id)
    central.commands.append(retry)

    assert outbox.sync_with_central() == 1
    assert outbox.forward_once().forwarded == 1

    assert central.acks[retry["id"]] == {"result": "done", "detail": "forwarding again with the retry count reset"}
    assert outbox.stats() == {"buffered": 0, "parked": 0}
    assert central.unparked[notification_id]["outcome"] == "retried"


def test_a_discard_command_removes_the_parked_row(make_outbox, central):
    outbox = make_outbox()
    notification_id = park_one(outbox, central)
    discard = command("discard", notification_id)
    central.commands.append(discard)

    outbox.sync_with_central()

    assert outbox.stats() == {"buffered": 0, "parked": 0}
    assert central.acks[discard["id"]]["result"] == "done"
    assert central.unparked[notification_id]["outcome"] == "discarded"


def test_commands_for_rows_that_are_not_parked_fail_with_a_reason_and_change_nothing(make_outbox, central):
    outbox = make_outbox()
    (forwarding,) = send_many(outbox, 1)
    unknown = str(uuid.uuid4())
    commands = [command("discard", forwarding), command("retry", unknown), command("reboot", forwarding)]
    central.commands.extend(commands)

    outbox.sync_with_central()

    acks = [central.acks[c["id"]] for c in commands]
    assert [ack["result"] for ack in acks] == ["failed"] * 3
    assert "not parked at this site (it is being forwarded)" in acks[0]["detail"]
    assert "not in this site's buffer" in acks[1]["detail"]
    assert "unknown action 'reboot'" in acks[2]["detail"]
    assert outbox.stats() == {"buffered": 1, "parked": 0}


def test_a_command_handed_out_again_is_not_executed_twice(make_outbox, central):
    outbox = make_outbox()
    notification_id = park_one(outbox, central)
    retry = command("retry", notification_id)
    central.commands.append(retry)
    outbox.sync_with_central()
    central.then(REJECTED)
    outbox.forward_once()  # the retried row is refused again: parked again
    assert outbox.stats()["parked"] == 1

    central.acks.clear()  # as if the acknowledgement never arrived: central hands it out again
    outbox.sync_with_central()

    assert outbox.stats()["parked"] == 1  # not retried a second time
    assert central.acks[retry["id"]]["result"] == "done"


def test_an_executed_command_is_remembered_across_a_restart_and_acknowledged_later(make_outbox, central, buffer_path):
    first = make_outbox()
    notification_id = park_one(first, central)
    discard = command("discard", notification_id)
    central.commands.append(discard)
    acks = {"refused": True}

    def acknowledgements_fail(received):
        if "/ack/" in received.path and acks["refused"]:
            return Reply(503, {"error": "database_unavailable", "detail": "down"})
        return None

    central.site_always = acknowledgements_fail
    first.sync_with_central()
    assert first.stats()["parked"] == 0 and central.acks == {}
    first.close()

    acks["refused"] = False
    restarted = make_outbox()
    restarted.sync_with_central(heartbeat=False)

    assert central.acks[discard["id"]] == {"result": "done", "detail": "discarded at the site"}
    assert Buffer(buffer_path).commands_unacknowledged() == []
