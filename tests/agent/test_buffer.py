"""The site buffer: send is durable and immediate, safe under concurrency, and operators can
retry and discard parked rows. Forwarding faults that park rows use the fake central
(tests/agent/fake_central.py) because central cannot be made to fail on demand."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from sites.agent import AgentNotConfigured, SiteOutbox
from tests.agent.conftest import send_many
from tests.agent.fake_central import Reply

REPO = Path(__file__).resolve().parents[2]


def agent_process(*code_lines, **popen):
    """A separate Python process running the agent (no Django anywhere on its path)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.Popen(
        [sys.executable, "-c", "\n".join(code_lines)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def rows_in(path):
    with sqlite3.connect(path) as connection:
        return {row[0]: row for row in connection.execute("SELECT notification_id, status FROM outbox_buffer")}


# --- send -------------------------------------------------------------------------------------


def test_send_returns_a_uuid_string_and_buffers_the_exact_post_body(outbox, central):
    notification_id = outbox.notify("Operators").send(
        "Pump 3 tripped",
        "Motor overload",
        source_instance_id="Pump3",
        source_script="OnTrip",
        type_data={"priority": "high"},
    )

    assert isinstance(notification_id, str) and str(uuid.UUID(notification_id)) == notification_id
    row = outbox.buffer.get(notification_id)
    assert json.loads(row.payload) == {
        "notification_id": notification_id,
        "type": "email",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "body": "Motor overload",
        "type_data": {"priority": "high"},
        "source_instance_id": "Pump3",
        "source_script": "OnTrip",
        "site_enqueued_at": "2026-11-21T10:00:00.000000Z",
    }
    assert (row.status, row.retry_count, row.last_error) == ("forwarding", 0, "")
    assert central.requests == []  # send never talks to central


def test_send_works_without_central_configuration_but_forwarding_says_what_is_missing(buffer_path):
    with SiteOutbox(buffer_path, None, None) as outbox:
        notification_id = outbox.notify("Operators").send("Pump 3 tripped", "")
        assert (outbox.status(notification_id) or {})["status"] == "Forwarding"
        with pytest.raises(AgentNotConfigured, match="no central URL and site key"):
            outbox.forward_once()


def test_buffer_uses_wal_and_full_synchronous_commits(outbox):
    connection = outbox.buffer._connection()
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


@pytest.mark.parametrize(
    "subject, body, options, error",
    [
        ("Pump 3\r\ntripped", "", {}, ValueError),
        ("Pump 3", "nul\x00byte", {}, ValueError),
        ("Pump 3", "", {"type_data": ["not", "an", "object"]}, TypeError),
        ("Pump 3", "", {"type_data": {"when": object()}}, ValueError),
        (None, "", {}, TypeError),
        ("Pump \ud800", "", {}, ValueError),
    ],
)
def test_send_refuses_input_central_would_certainly_reject(outbox, subject, body, options, error):
    with pytest.raises(error):
        outbox.notify("Operators").send(subject, body, **options)
    assert outbox.stats() == {"buffered": 0, "parked": 0}


def test_notify_refuses_a_blank_list_name(outbox):
    with pytest.raises(ValueError):
        outbox.notify("  ")


def test_row_survives_the_process_being_killed_right_after_send_returns(buffer_path):
    process = agent_process(
        "import sys",
        "from sites.agent import AgentNotConfigured, SiteOutbox",
        f"outbox = SiteOutbox({str(buffer_path)!r}, None, None)",
        "print(outbox.notify('Operators').send('Pump 3 tripped', 'killed right after'), flush=True)",
        "sys.stdin.read()",  # stay alive until killed
    )
    notification_id = process.stdout.readline().strip()
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    assert process.returncode == -signal.SIGKILL

    with SiteOutbox(buffer_path, None, None) as reopened:
        assert (reopened.status(notification_id) or {})["status"] == "Forwarding"
        row = reopened.buffer.get(notification_id)
        assert row is not None and json.loads(row.payload)["body"] == "killed right after"


def test_many_threads_and_processes_sending_at_once_lose_nothing(buffer_path):
    per_worker, processes, threads = 40, 3, 4
    SiteOutbox(buffer_path, None, None).close()  # create the file once, as a real site would
    workers = [
        agent_process(
            "import sys",
            "from sites.agent import AgentNotConfigured, SiteOutbox",
            f"outbox = SiteOutbox({str(buffer_path)!r}, None, None)",
            "sys.stdin.readline()",  # start together
            f"for n in range({per_worker}): print(outbox.notify('Operators').send(f'p{{n}}', ''), flush=True)",
        )
        for _ in range(processes)
    ]
    outbox = SiteOutbox(buffer_path, None, None)
    start = threading.Barrier(threads + 1)
    sent, failures = [], []

    def send_from_thread():
        start.wait()
        try:
            sent.extend(send_many(outbox, per_worker))
        except Exception as error:  # pragma: no cover - the assertion below reports it
            failures.append(error)

    pool = [threading.Thread(target=send_from_thread) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    start.wait()
    for worker in workers:
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        sent.extend(out.split())
    for thread in pool:
        thread.join()
    outbox.close()

    assert failures == []
    assert len(sent) == len(set(sent)) == per_worker * (processes + threads)
    assert set(rows_in(buffer_path)) == set(sent)


# --- parking, retry, discard -------------------------------------------------------------------


# An answer outside central's contract (here a redirect, as from a login portal in front of a
# wrong URL) is what max_retries counts; an outage never is (test_outages.py).
REDIRECT = Reply(302, headers={"Location": "https://sso.example.com/login"})


def test_row_is_parked_once_max_retries_unexpected_answers_are_spent(make_outbox, central, clock):
    outbox = make_outbox(max_retries=3, retry_interval=30)
    central.always = REDIRECT
    (notification_id,) = send_many(outbox, 1)

    for _attempt in range(1, 4):
        result = outbox.forward_once()
        clock.advance(30)
    status = outbox.status(notification_id)

    assert (result.parked, result.retrying) == (1, 0)
    assert status["status"] == "Parked" and status["location"] == "site"
    assert status["retry_count"] == 3
    assert status["last_error"].startswith("Retries exhausted after 3 attempts; last error: HTTP 302")
    assert outbox.stats() == {"buffered": 0, "parked": 1}
    outbox.forward_once()
    assert len(central.requests) == 3  # a parked row is not forwarded


def test_max_retries_zero_never_parks(make_outbox, central, clock):
    outbox = make_outbox(max_retries=0, retry_interval=30)
    central.always = REDIRECT
    (notification_id,) = send_many(outbox, 1)

    for _ in range(60):
        outbox.forward_once()
        clock.advance(30)

    status = outbox.status(notification_id)
    assert (status["status"], status["retry_count"]) == ("Forwarding", 60)


def test_operator_retry_moves_a_parked_row_back_with_its_retry_count_reset(make_outbox, central, clock):
    outbox = make_outbox(max_retries=1)
    central.then(REDIRECT)
    (notification_id,) = send_many(outbox, 1)
    outbox.forward_once()
    assert outbox.status(notification_id)["status"] == "Parked"

    assert outbox.retry(notification_id) is True
    assert outbox.status(notification_id)["status"] == "Forwarding"
    assert outbox.status(notification_id)["retry_count"] == 0
    result = outbox.forward_once()  # due at once, no need to wait the retry interval

    assert result.forwarded == 1
    assert outbox.status(notification_id)["location"] == "central"


def test_retry_and_discard_touch_only_parked_rows(outbox):
    (notification_id,) = send_many(outbox, 1)

    assert outbox.retry(notification_id) is False
    assert outbox.discard(notification_id) is None
    assert outbox.status(notification_id)["status"] == "Forwarding"


def test_discard_deletes_a_parked_row_and_returns_what_was_discarded(make_outbox, central):
    outbox = make_outbox()
    central.then(Reply(400, {"error": "invalid", "detail": "Invalid input.", "errors": {"list_name": ["Unknown."]}}))
    (notification_id,) = send_many(outbox, 1)
    outbox.forward_once()

    discarded = outbox.discard(notification_id)

    assert discarded["notification_id"] == notification_id and discarded["subject"] == "Pump 0 tripped"
    assert outbox.buffer.get(notification_id) is None
    assert outbox.stats() == {"buffered": 0, "parked": 0}


def test_parked_lists_site_parked_rows_with_their_error_and_subject(make_outbox, central):
    outbox = make_outbox()
    outbox.notify("Operators").send("Accepted", "")
    outbox.forward_once()
    conflicting = outbox.notify("Operators").send("Conflicting", "")
    central.then(Reply(422, {"error": "idempotency_conflict", "detail": "different content"}))
    outbox.forward_once()

    (parked,) = outbox.parked()

    assert parked["notification_id"] == conflicting and parked["subject"] == "Conflicting"
    assert parked["last_error"] == "Rejected by central: HTTP 422: idempotency_conflict: different content"


def test_undecodable_payload_is_logged_and_dropped_without_blocking_the_rest(outbox, central, caplog):
    good = send_many(outbox, 2)
    broken = str(uuid.uuid4())
    outbox.buffer.insert(notification_id=broken, payload="{not json", created_at="2026-11-21T09:00:00.000000Z")

    result = outbox.forward_once()

    assert (result.dropped, result.forwarded) == (1, 2)
    assert outbox.buffer.get(broken) is None
    assert broken not in central.posted_ids() and set(central.posted_ids()) == set(good)
    assert any(broken in record.getMessage() and record.levelname == "WARNING" for record in caplog.records)
