"""Priority and rate limits: send(priority=…) is checked, stored and sent only when it is not
``normal``; the forwarder takes its buffer by priority, then age, with critical rows in requests
of their own; a 429 holds only the lane it was answered for while critical rows keep flowing;
dedup_key; a buffer written by agent 0.3 is upgraded in place; central's ``Suppressed``.

Central is the scripted stand-in (tests/agent/fake_central.py), which draws rate budgets per
notification as central does (critical items from a budget of their own)."""

import json
import sqlite3

import pytest

from sites.agent import InvalidNotification, SiteOutbox, doctor
from sites.agent.cli import main
from tests.agent.conftest import send_many
from tests.agent.fake_central import GOOD_KEY, Reply

# The buffer schema of agent 0.3.0 (schema version 2), as that agent created it.
AGENT_0_3_SCHEMA = """
CREATE TABLE outbox_buffer (
    notification_id TEXT PRIMARY KEY,
    payload         TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    retry_count     INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    next_attempt_at TEXT NOT NULL,
    last_attempt_at TEXT,
    last_error      TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL DEFAULT 'forwarding' CHECK (status IN ('forwarding', 'parked'))
);
CREATE INDEX outbox_buffer_due ON outbox_buffer (status, next_attempt_at);
CREATE TABLE outbox_parked_reports (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id TEXT NOT NULL UNIQUE,
    parked          INTEGER NOT NULL CHECK (parked IN (0, 1)),
    outcome         TEXT NOT NULL DEFAULT '',
    changed_at      TEXT NOT NULL
);
CREATE TRIGGER outbox_buffer_report_parked AFTER UPDATE OF status ON outbox_buffer
WHEN NEW.status = 'parked' AND OLD.status <> 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (NEW.notification_id, 1, '', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER outbox_buffer_report_retried AFTER UPDATE OF status ON outbox_buffer
WHEN OLD.status = 'parked' AND NEW.status <> 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (OLD.notification_id, 0, 'retried', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TRIGGER outbox_buffer_report_discarded AFTER DELETE ON outbox_buffer
WHEN OLD.status = 'parked'
BEGIN
    INSERT OR REPLACE INTO outbox_parked_reports (notification_id, parked, outcome, changed_at)
    VALUES (OLD.notification_id, 0, 'discarded', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
END;
CREATE TABLE outbox_commands (
    command_id      TEXT PRIMARY KEY,
    action          TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    result          TEXT NOT NULL CHECK (result IN ('done', 'failed')),
    detail          TEXT NOT NULL DEFAULT '',
    executed_at     TEXT NOT NULL,
    acked_at        TEXT
);
CREATE TABLE outbox_agent_state (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
PRAGMA user_version = 2;
"""

OLD_FORWARDING = "0b5e3c8e-0000-4000-8000-000000000001"
OLD_PARKED = "0b5e3c8e-0000-4000-8000-000000000002"


def payload_of(outbox, notification_id):
    return json.loads(outbox.buffer.get(notification_id).payload)


def items_of(received):
    return received.body["notifications"] if received.path.endswith("/batch/") else [received.body]


# --- send(priority=…, dedup_key=…) ------------------------------------------------------------


def test_send_stores_the_priority_and_puts_it_in_the_body_only_when_it_is_not_normal(outbox):
    notifier = outbox.notify("Operators")
    critical = notifier.send("Boiler pressure high", "", priority="critical")
    normal = notifier.send("Shift report", "")

    assert payload_of(outbox, critical)["priority"] == "critical"
    assert "priority" not in payload_of(outbox, normal)
    assert [outbox.buffer.get(nid).priority for nid in (critical, normal)] == ["critical", "normal"]
    assert outbox.status(critical)["priority"] == "critical"


@pytest.mark.parametrize("priority", ["urgent", "Critical", "", "normal "])
def test_an_unknown_priority_is_refused_at_send_naming_the_field_and_nothing_is_buffered(outbox, priority):
    with pytest.raises(InvalidNotification) as raised:
        outbox.notify("Operators").send("Pump 3 tripped", "", priority=priority)

    assert raised.value.field == "priority"
    assert "critical, high, normal, low" in str(raised.value)
    assert outbox.stats() == {"buffered": 0, "parked": 0}


def test_a_priority_that_is_not_text_is_a_type_error(outbox):
    with pytest.raises(TypeError, match="priority must be a str"):
        outbox.notify("Operators").send("Pump 3 tripped", "", priority=1)


def test_a_dedup_key_is_stored_and_sent_only_when_given(outbox, central):
    notifier = outbox.notify("Operators")
    keyed = notifier.send("Pump 3 tripped", "", dedup_key="pump-3-trip")
    plain = notifier.send("Pump 4 tripped", "")

    outbox.forward_once()

    (request,) = central.requests
    bodies = {item["notification_id"]: item for item in items_of(request)}
    assert bodies[keyed]["dedup_key"] == "pump-3-trip"
    assert "dedup_key" not in bodies[plain]


@pytest.mark.parametrize(
    "dedup_key, words", [("", "must not be blank"), ("a\nb", "single line"), ("k" * 201, "at most 200")]
)
def test_a_dedup_key_central_would_refuse_is_refused_at_send(outbox, dedup_key, words):
    with pytest.raises(InvalidNotification, match=words) as raised:
        outbox.notify("Operators").send("Pump 3 tripped", "", dedup_key=dedup_key)
    assert raised.value.field == "dedup_key"


# --- forwarding order ---------------------------------------------------------------------------


def test_the_forwarder_takes_the_buffer_by_priority_first_then_age(make_outbox, central, clock):
    outbox = make_outbox(batch_size=2)
    notifier = outbox.notify("Operators")
    sent = {}
    for name, priority in [
        ("low", "low"),
        ("normal-old", "normal"),
        ("high", "high"),
        ("normal-new", "normal"),
        ("critical", "critical"),
    ]:
        sent[name] = notifier.send(name, "", priority=priority)
        clock.advance(1)

    outbox.forward_once()

    names = {nid: name for name, nid in sent.items()}
    assert [names[nid] for nid in central.posted_ids()] == ["critical", "high", "normal-old", "normal-new", "low"]


def test_critical_rows_travel_in_requests_of_their_own(make_outbox, central):
    outbox = make_outbox(batch_size=10)
    notifier = outbox.notify("Operators")
    for n in range(3):
        notifier.send(f"Trip {n}", "", priority="critical")
        notifier.send(f"Report {n}", "", priority="normal")

    outbox.forward_once()

    lanes = [{item.get("priority", "normal") for item in items_of(request)} for request in central.requests]
    assert lanes == [{"critical"}, {"normal"}]


# --- rate limits ----------------------------------------------------------------------------------


def test_a_429_holds_the_other_priorities_for_retry_after_while_critical_rows_keep_flowing(make_outbox, central, clock):
    outbox = make_outbox(max_retries=1)
    central.budgets["other"] = 0  # this site sent too many ordinary notifications
    central.retry_after = "120"
    ordinary = send_many(outbox, 3)
    first_trip = outbox.notify("Operators").send("Boiler trip", "", priority="critical")

    result = outbox.forward_once()

    assert result.forwarded == 1 and first_trip in central.stored
    assert result.throttled_for == 120 and result.critical_throttled_for is None
    clock.advance(60)
    second_trip = outbox.notify("Operators").send("Second boiler trip", "", priority="critical")
    assert outbox.forward_once().forwarded == 1 and second_trip in central.stored  # still held for the others
    assert all(nid not in central.stored for nid in ordinary)
    assert [outbox.status(nid)["retry_count"] for nid in ordinary] == [0, 0, 0]  # nothing counted
    assert outbox.stats() == {"buffered": 3, "parked": 0}  # nothing parked
    assert outbox.link_status()["state"] == "rate_limited"  # not "unreachable": no local fallback

    clock.advance(60)
    central.budgets["other"] = None
    assert outbox.forward_once().forwarded == 3


def test_a_429_for_critical_rows_holds_only_the_critical_lane(make_outbox, central):
    outbox = make_outbox()
    central.budgets["critical"] = 0
    trip = outbox.notify("Operators").send("Boiler trip", "", priority="critical")
    (report,) = send_many(outbox, 1)

    result = outbox.forward_once()

    assert result.critical_throttled_for == 30 and result.throttled_for is None
    assert report in central.stored and trip not in central.stored


def test_the_rate_limit_is_shown_in_status_doctor_and_heartbeat(make_outbox, central, buffer_path, clock):
    outbox = make_outbox()
    central.budgets["other"] = 0
    central.retry_after = "120"
    (held,) = send_many(outbox, 1)
    outbox.forward_once()

    status = outbox.status(held)
    outbox.sync_with_central()
    checks = {check.name: check for check in doctor.doctor_run(db_path=str(buffer_path), client=None, clock=clock)}

    assert status["held"] == (
        "central is rate-limiting this site (HTTP 429) until 2026-11-21T10:02:00.000000Z; it is sent then"
    )
    assert central.heartbeats()[-1]["last_error"] == (
        "rate-limited by central (HTTP 429): non-critical notifications wait until 2026-11-21T10:02:00.000000Z; "
        "critical ones go on"
    )
    assert (checks["forwarding"].level, checks["forwarding"].detail) == (
        "WARN",
        "rate-limited by central (HTTP 429): non-critical notifications wait until 2026-11-21T10:02:00.000000Z; "
        "critical ones go on",
    )


def test_a_rate_limit_is_honoured_by_a_forwarder_started_during_it(make_outbox, central, clock):
    first = make_outbox()
    central.budgets["other"] = 0
    central.retry_after = "120"
    send_many(first, 1)
    first.forward_once()
    first.close()
    central.budgets["other"] = None

    restarted = make_outbox()

    assert restarted.forward_once().requests == 0
    clock.advance(120)
    assert restarted.forward_once().forwarded == 1
    assert len(central.requests) == 2


# --- old buffers ------------------------------------------------------------------------------------


def build_agent_0_3_buffer(path):
    with sqlite3.connect(str(path)) as old:
        old.execute("PRAGMA journal_mode = WAL")
        old.executescript(AGENT_0_3_SCHEMA)
        for notification_id, status, retries, error in (
            (OLD_FORWARDING, "forwarding", 4, "HTTP 503"),
            (OLD_PARKED, "parked", 50, "Retries exhausted after 50 attempts; last error: central unreachable"),
        ):
            payload = {
                "notification_id": notification_id,
                "type": "email",
                "list_name": "Operators",
                "subject": f"old {status}",
                "body": "",
                "type_data": {},
                "source_instance_id": "",
                "source_script": "",
                "site_enqueued_at": "2026-11-20T08:00:00.000000Z",
            }
            old.execute(
                "INSERT INTO outbox_buffer VALUES (?, ?, '2026-11-20T08:00:00.000000Z', ?,"
                " '2026-11-20T08:00:00.000000Z', '2026-11-20T09:00:00.000000Z', ?, ?)",
                (notification_id, json.dumps(payload), retries, error, status),
            )
        old.execute("DELETE FROM outbox_parked_reports")  # agent 0.3 had reported it already
        old.execute("INSERT INTO outbox_agent_state VALUES ('last_forward_at', '2026-11-20T07:00:00.000000Z')")


def test_a_buffer_written_by_agent_0_3_is_upgraded_in_place_and_keeps_its_rows_as_they_were(
    buffer_path, make_outbox, central
):
    build_agent_0_3_buffer(buffer_path)

    outbox = make_outbox()
    trip = outbox.notify("Operators").send("Boiler trip", "", priority="critical")

    with sqlite3.connect(str(buffer_path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == 3
    old = outbox.status(OLD_FORWARDING)
    assert (old["status"], old["priority"], old["retry_count"]) == ("Forwarding", "normal", 4)
    parked = outbox.status(OLD_PARKED)
    assert (parked["status"], parked["priority"], parked["last_error"]) == (
        "Parked",
        "normal",
        "Retries exhausted after 50 attempts; last error: central unreachable",
    )

    assert outbox.forward_once().forwarded == 2
    assert central.posted_ids() == [trip, OLD_FORWARDING]  # the new critical row first
    assert "priority" not in central.stored[OLD_FORWARDING]  # the old row's body is sent as stored
    assert outbox.status(OLD_PARKED)["status"] == "Parked"  # never unparked silently
    outbox.sync_with_central(heartbeat=False)
    assert central.parked == {}  # its report was already taken by central: not sent again


def test_a_buffer_upgraded_by_one_process_is_opened_by_another_without_a_second_upgrade(buffer_path):
    build_agent_0_3_buffer(buffer_path)
    with SiteOutbox(buffer_path, None, None) as first, SiteOutbox(buffer_path, None, None) as second:
        first.notify("Operators").send("a", "", priority="high")
        second.notify("Operators").send("b", "", priority="low")
        assert first.stats() == {"buffered": 3, "parked": 1}


# --- central's final statuses -----------------------------------------------------------------------


def test_status_understands_a_notification_central_suppressed(outbox, central, capsys, monkeypatch, buffer_path):
    (notification_id,) = send_many(outbox, 1)
    outbox.forward_once()
    suppressed = {
        **central.status_record(notification_id),
        "status": "Suppressed",
        "suppressed_by": "duplicate:6f1c8a52-96a4-4d7e-9a53-0b1f0e3e7a11",
    }
    central.then(Reply(200, suppressed), Reply(200, suppressed))

    record = outbox.status(notification_id)
    monkeypatch.setenv("OUTBOX_CENTRAL_URL", central.url)
    monkeypatch.setenv("OUTBOX_SITE_KEY", GOOD_KEY)
    code = main(["--db", str(buffer_path), "status", notification_id])
    out = capsys.readouterr().out

    assert (record["status"], record["final"], record["suppressed_by"]) == (
        "Suppressed",
        True,
        "duplicate:6f1c8a52-96a4-4d7e-9a53-0b1f0e3e7a11",
    )
    assert code == 0
    assert out.splitlines()[0] == (
        "Suppressed (at central) — final: kept by central without sending it "
        "(duplicate:6f1c8a52-96a4-4d7e-9a53-0b1f0e3e7a11)"
    )
