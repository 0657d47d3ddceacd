"""Operator commands (``python -m sites.agent``), the benchmark command, and the promise that the
agent runs without Django or any third-party package. Central is the scripted stand-in of
tests/agent/fake_central.py (see test_forwarder.py for why)."""

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sites.agent
from sites.agent import SiteOutbox, bench
from sites.agent.cli import main
from tests.agent.fake_central import GOOD_KEY, Reply

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(monkeypatch, buffer_path, central):
    monkeypatch.setenv("OUTBOX_AGENT_DB", str(buffer_path))
    monkeypatch.setenv("OUTBOX_CENTRAL_URL", central.url)
    monkeypatch.setenv("OUTBOX_SITE_KEY", GOOD_KEY)
    return monkeypatch


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def park_one(central, capsys):
    _code, out, _ = run(capsys, "send", "--list", "Operators", "--subject", "Pump 3 tripped", "--body", "overload")
    central.then(Reply(400, {"error": "invalid", "detail": "Invalid input.", "errors": {"list_name": ["Unknown."]}}))
    assert run(capsys, "forward", "--once")[0] == 0
    return out.strip()


def test_send_prints_only_the_new_id(env, capsys, buffer_path):
    code, out, _ = run(
        capsys,
        "send",
        "--list",
        "Operators",
        "--subject",
        "Pump 3 tripped",
        "--body",
        "overload",
        "--source-instance-id",
        "Pump3",
        "--source-script",
        "OnTrip",
    )

    assert code == 0
    with SiteOutbox(buffer_path, None, None) as outbox:
        row = outbox.buffer.get(out.strip())
    assert row is not None
    payload = json.loads(row.payload)
    assert (payload["source_instance_id"], payload["source_script"]) == ("Pump3", "OnTrip")


def test_a_missing_setting_is_named_in_the_error(monkeypatch, capsys):
    monkeypatch.delenv("OUTBOX_AGENT_DB", raising=False)

    code, _, err = run(capsys, "stats")

    assert code == 2
    assert "OUTBOX_AGENT_DB" in err


def test_forward_needs_the_central_url_and_key(env, capsys):
    env.delenv("OUTBOX_SITE_KEY")

    code, _, err = run(capsys, "forward", "--once")

    assert code == 2 and "OUTBOX_SITE_KEY" in err


def test_flags_override_the_environment(env, capsys, tmp_path):
    other = tmp_path / "other.sqlite3"
    run(capsys, "--db", str(other), "send", "--list", "L", "--subject", "s", "--body", "b")

    assert run(capsys, "--db", str(other), "stats", "--json")[1].strip() == '{"buffered": 1, "parked": 0}'
    assert run(capsys, "stats")[1] == "buffered: 0\nparked: 0\n"


def test_status_shows_forwarding_then_centrals_status(env, capsys):
    notification_id = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b")[1].strip()

    assert run(capsys, "status", notification_id)[1].startswith("Forwarding (at this site)")
    run(capsys, "forward", "--once")
    code, out, _ = run(capsys, "status", notification_id, "--json")

    assert code == 0 and json.loads(out)["status"] == "Pending" and json.loads(out)["location"] == "central"


def test_status_of_an_unknown_id_says_unknown(env, capsys):
    code, out, _ = run(capsys, "status", "6f1c8a52-96a4-4d7e-9a53-0b1f0e3e7a11")

    assert code == 1 and out.startswith("Unknown")


def test_forward_once_reports_progress_and_totals(env, capsys):
    for n in range(3):
        run(capsys, "send", "--list", "Operators", "--subject", f"s{n}", "--body", "b")

    code, out, _ = run(capsys, "forward", "--once")

    assert code == 0
    assert "forwarded 3, parked 0, retrying 0, dropped 0 — 0 buffered, 0 parked" in out
    assert '"forwarded": 3' in out.splitlines()[-1]


def test_forward_once_with_a_rejected_key_exits_3(env, capsys, central):
    run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b")
    env.setenv("OUTBOX_SITE_KEY", "revoked")

    code, _, err = run(capsys, "forward", "--once")

    assert code == 3 and "HTTP 401" in err and "OUTBOX_SITE_KEY" in err
    assert run(capsys, "stats")[1] == "buffered: 1\nparked: 0\n"


def test_parked_retry_and_discard(env, capsys, central):
    notification_id = park_one(central, capsys)

    out = run(capsys, "parked")[1]
    assert notification_id in out and "Rejected by central: HTTP 400" in out and "'Pump 3 tripped'" in out

    assert run(capsys, "retry", notification_id)[0] == 0
    assert run(capsys, "stats")[1] == "buffered: 1\nparked: 0\n"
    assert run(capsys, "retry", notification_id)[0] == 1  # no longer parked

    central.then(Reply(400, {"error": "invalid", "detail": "still bad"}))
    run(capsys, "forward", "--once")
    code, out, _ = run(capsys, "discard", notification_id)
    assert code == 0 and out.startswith("discarded {") and "Pump 3 tripped" in out
    assert run(capsys, "stats")[1] == "buffered: 0\nparked: 0\n"
    assert run(capsys, "parked")[1] == "no parked notifications\n"


def test_discard_of_a_malformed_id_is_a_usage_error(env, capsys):
    code, _, err = run(capsys, "discard", "pump-3")

    assert code == 2 and "not a notification id" in err


def test_forward_runs_until_sigterm_and_then_stops_cleanly(env, capsys, central, buffer_path):
    notification_id = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b")[1].strip()
    process = subprocess.Popen(
        [sys.executable, "-m", "sites.agent", "forward", "--sweep-interval", "60"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # wait for the first sweep's progress line
            if line.startswith("forwarded 1"):
                break
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        process.kill()

    assert process.returncode == 0, err
    assert out.rstrip().endswith("SIGTERM received: finished the current request; stopped")
    assert central.posted_ids() == [notification_id]


def test_bench_forwards_the_whole_backlog_and_reports_json(central, capsys):
    code = bench.main(["--central-url", central.url, "--key", GOOD_KEY, "--count", "1200", "--json"])
    report = json.loads(capsys.readouterr().out)

    assert code == 0
    assert (report["forwarded"], report["left_in_buffer"], report["requests"]) == (1200, 0, 3)
    assert len(central.stored) == 1200


def test_bench_reports_a_rejected_key(central, capsys):
    assert bench.main(["--central-url", central.url, "--key", "wrong", "--count", "5"]) == 3


def test_send_refuses_an_over_limit_notification_naming_the_field(env, capsys):
    code, _, err = run(capsys, "send", "--list", "Operators", "--subject", "x" * 256, "--body", "b")

    assert code == 2
    assert "subject: must be at most 255 characters (got 256)" in err
    assert run(capsys, "stats")[1] == "buffered: 0\nparked: 0\n"


def test_send_honours_a_smaller_body_limit_from_the_environment(env, capsys):
    env.setenv("OUTBOX_MAX_BODY_BYTES", "2048")

    code, _, err = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "x" * 3000)

    assert code == 2 and "at most 2,048 bytes" in err


def test_version_names_the_agent_python_and_sqlite(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    out = capsys.readouterr().out

    assert exited.value.code == 0
    assert out.startswith(f"outbox-site-agent {sites.agent.__version__} (Python {platform.python_version()}, SQLite ")
