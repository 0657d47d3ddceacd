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


# --- the configuration file ------------------------------------------------------------------------


def write_config(tmp_path, **settings):
    path = tmp_path / "outbox-agent.json"
    path.write_text(json.dumps(settings), encoding="utf-8")
    return str(path)


def test_the_configuration_file_supplies_what_flags_and_environment_do_not(central, buffer_path, tmp_path, capsys):
    config = write_config(tmp_path, db=str(buffer_path), central_url=central.url, key=GOOD_KEY, batch_size=2)
    for n in range(3):
        run(capsys, "--config", config, "send", "--list", "Operators", "--subject", f"s{n}", "--body", "b")

    code, out, _ = run(capsys, "--config", config, "forward", "--once")

    assert code == 0 and '"forwarded": 3' in out
    assert [len(r.body["notifications"]) if "notifications" in r.body else 1 for r in central.requests] == [2, 1]


def test_flags_and_the_environment_win_over_the_configuration_file(env, central, buffer_path, tmp_path, capsys):
    config = write_config(tmp_path, db=str(tmp_path / "from-file.sqlite3"), key="key-from-file")
    env.setenv("OUTBOX_AGENT_CONFIG", config)

    run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b")  # OUTBOX_AGENT_DB wins
    code, _, _ = run(capsys, "forward", "--once")  # OUTBOX_SITE_KEY wins
    other = tmp_path / "from-flag.sqlite3"
    run(capsys, "--db", str(other), "send", "--list", "Operators", "--subject", "s", "--body", "b")

    assert code == 0 and len(central.stored) == 1
    assert not (tmp_path / "from-file.sqlite3").exists()
    assert run(capsys, "--db", str(other), "stats", "--json")[1].strip() == '{"buffered": 1, "parked": 0}'


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"db": "x", "retry_intervall": 5}', "unknown setting 'retry_intervall'"),
        ('{"db": 5}', "db must be a str, got 5"),
        ('{"sweep_interval": "10"}', "sweep_interval must be a number, got '10'"),
        ('{"db": "x",}', "is not JSON"),
        ("[]", "must hold a JSON object"),
        ('{"fallback": {"smtp": {"host": "127.0.0.1"}}}', "fallback.smtp.from_address is not an email address"),
    ],
)
def test_a_wrong_configuration_file_is_a_usage_error_naming_the_problem(tmp_path, capsys, content, words):
    path = tmp_path / "outbox-agent.json"
    path.write_text(content, encoding="utf-8")
    if "fallback" in content:
        content_db = json.loads(content)
        content_db["db"] = str(tmp_path / "b.sqlite3")
        path.write_text(json.dumps(content_db), encoding="utf-8")

    code, _, err = run(capsys, "--config", str(path), "stats")

    assert code == 2 and words in err


def test_a_configuration_file_that_does_not_exist_is_named(tmp_path, capsys):
    code, _, err = run(capsys, "--config", str(tmp_path / "missing.json"), "stats")

    assert code == 2 and "cannot read the configuration file" in err and "missing.json" in err


# --- new states on the command line -------------------------------------------------------------------


def test_status_of_a_row_held_by_a_refused_key_says_why(env, capsys, central):
    notification_id = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b")[1].strip()
    env.setenv("OUTBOX_SITE_KEY", "revoked")
    run(capsys, "forward", "--once")

    code, out, _ = run(capsys, "status", notification_id)

    assert code == 0
    assert out.splitlines()[0] == "Forwarding (at this site)"
    assert "  held: central refused the site key (HTTP 401: authentication_failed: Invalid API key.) since" in out
    assert "  priority: normal" in out


def test_send_takes_a_priority_and_refuses_an_unknown_one(env, capsys, buffer_path):
    code, out, _ = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b", "--priority", "critical")
    bad, _, err = run(capsys, "send", "--list", "Operators", "--subject", "s", "--body", "b", "--priority", "urgent")

    assert code == 0 and bad == 2 and "priority: must be one of critical, high, normal, low" in err
    with SiteOutbox(buffer_path, None, None) as outbox:
        row = outbox.buffer.get(out.strip())
    assert row is not None and row.priority == "critical"


def test_doctor_checks_the_local_relay_named_in_the_configuration_file(central, buffer_path, tmp_path, capsys):
    from tests.agent.conftest import closed_port_url
    from tests.agent.local_relay import LocalRelay

    SiteOutbox(buffer_path, None, None).close()  # the buffer exists
    with LocalRelay() as relay:
        good = write_config(
            tmp_path, db=str(buffer_path), central_url=central.url, key=GOOD_KEY, fallback=relay.settings()
        )
        code, out, _ = run(capsys, "--config", good, "doctor")
    down = relay.settings()
    down["smtp"]["port"] = int(closed_port_url().rsplit(":", 1)[1])
    bad = write_config(tmp_path, db=str(buffer_path), central_url=central.url, key=GOOD_KEY, fallback=down)
    failed, failed_out, _ = run(capsys, "--config", bad, "doctor")

    assert code == 0, out
    assert f"OK   relay: 127.0.0.1:{relay.port} (none) answers" in out
    assert "after 300 s without central, high and more urgent notifications go to control-room@plant-a" in out
    assert "OK   fallback: standing by; 0 delivered locally so far" in out
    assert failed == 1
    assert f"FAIL relay: the local fallback relay 127.0.0.1:{down['smtp']['port']} (none) cannot be used" in failed_out
