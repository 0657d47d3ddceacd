"""``doctor``: one line per check with OK/WARN/FAIL, exit 1 when a check failed. Central is the
scripted stand-in (its Date header can be skewed); the same three states against the real
central run in tests/e2e/test_agent_field.py."""

import json
import shutil
import socket
import sqlite3
from collections import namedtuple
from datetime import timedelta

import pytest

from sites.agent import SiteOutbox, doctor
from sites.agent.central import CentralClient
from sites.agent.cli import main
from tests.agent.conftest import send_many
from tests.agent.fake_central import GOOD_KEY, Reply


def checks_by_name(checks):
    return {check.name: check for check in checks}


def levels(checks):
    return {check.name: check.level for check in checks}


def run_doctor(capsys, *argv):
    code = main([*argv, "doctor"])
    out = capsys.readouterr().out
    return code, out


def unused_port():
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        return placeholder.getsockname()[1]


def test_everything_ok_prints_one_line_per_check_and_exits_0(central, buffer_path, capsys):
    with SiteOutbox(buffer_path, None, None) as outbox:
        send_many(outbox, 2)

    code, out = run_doctor(capsys, "--db", str(buffer_path), "--central-url", central.url, "--key", GOOD_KEY)

    lines = out.splitlines()
    assert code == 0, out
    assert lines[0].startswith("outbox-site-agent ")
    assert [line.split()[1].rstrip(":") for line in lines[1:]] == [
        "python",
        "sqlite",
        "journal",
        "buffer",
        "forwarding",
        "disk",
        "central",
        "key",
        "clock",
    ]
    assert all(line.startswith("OK ") for line in lines[1:]), out
    assert "2 buffered, 0 parked" in out
    assert "journal_mode=wal" in out


def test_a_wrong_key_fails_the_key_check_and_exits_1(central, buffer_path, capsys):
    code, out = run_doctor(capsys, "--db", str(buffer_path), "--central-url", central.url, "--key", "revoked")

    assert code == 1
    assert "FAIL key: central refused the key (HTTP 401" in out
    assert "OK   central:" in out and "OK   clock:" in out


def test_a_deactivated_site_fails_the_key_check(central, buffer_path):
    central.then(Reply(200, {"status": "ok"}), Reply(403, {"error": "permission_denied", "detail": "inactive"}))
    with CentralClient(central.url, GOOD_KEY) as client:
        checks = checks_by_name(doctor.doctor_run(db_path=str(buffer_path), client=client))
    assert checks["key"].level == "FAIL" and "is the site active" in checks["key"].detail


def test_central_down_fails_reachability_and_leaves_key_and_clock_unchecked(buffer_path, capsys):
    url = f"http://127.0.0.1:{unused_port()}"
    code, out = run_doctor(capsys, "--db", str(buffer_path), "--central-url", url, "--key", GOOD_KEY)

    assert code == 1
    assert "FAIL central: central unreachable" in out and "ConnectionRefusedError" in out
    assert "WARN key: not checked: central is unreachable" in out
    assert "WARN clock: not checked: central is unreachable" in out


def test_central_not_configured_fails_and_names_the_settings(buffer_path, capsys, monkeypatch):
    monkeypatch.delenv("OUTBOX_CENTRAL_URL", raising=False)
    monkeypatch.delenv("OUTBOX_SITE_KEY", raising=False)
    code, out = run_doctor(capsys, "--db", str(buffer_path))

    assert code == 1 and "FAIL central: not configured: set OUTBOX_CENTRAL_URL and OUTBOX_SITE_KEY" in out


def test_a_ca_file_that_cannot_be_loaded_fails_the_central_check(buffer_path, capsys, tmp_path):
    code, out = run_doctor(
        capsys,
        "--db",
        str(buffer_path),
        "--central-url",
        "https://central.example",
        "--key",
        GOOD_KEY,
        "--ca-file",
        str(tmp_path / "missing.pem"),
    )
    assert code == 1 and "FAIL central: cannot load the CA file" in out


def test_a_central_whose_database_is_down_is_a_warning(central, buffer_path):
    central.then(Reply(503, {"status": "unavailable", "database": "down"}))
    with CentralClient(central.url, GOOD_KEY) as client:
        checks = checks_by_name(doctor.doctor_run(db_path=str(buffer_path), client=client))
    assert checks["central"].level == "WARN" and "HTTP 503" in checks["central"].detail
    assert checks["key"].level == "OK"


@pytest.mark.parametrize(
    "offset, level, words",
    [(0, "OK", "within"), (-60, "WARN", "ahead of"), (45, "WARN", "behind"), (3600, "FAIL", "behind")],
)
def test_clock_skew_against_centrals_date_header(central, buffer_path, offset, level, words):
    central.clock_offset = offset
    with CentralClient(central.url, GOOD_KEY) as client:
        check = checks_by_name(doctor.doctor_run(db_path=str(buffer_path), client=client))["clock"]
    assert check.level == level, check.detail
    assert words in check.detail


def test_parked_rows_and_an_old_backlog_are_warnings(make_outbox, central, clock, buffer_path):
    outbox = make_outbox()
    central.then(Reply(400, {"error": "invalid", "detail": "Invalid input."}))
    send_many(outbox, 1)
    outbox.forward_once()  # parked
    send_many(outbox, 1)
    outbox.close()

    checks = checks_by_name(doctor.doctor_run(db_path=str(buffer_path), client=None, clock=clock))
    assert checks["buffer"].level == "WARN" and "1 buffered, 1 parked" in checks["buffer"].detail

    later = checks_by_name(
        doctor.doctor_run(db_path=str(buffer_path), client=None, clock=lambda: clock() + timedelta(hours=2))
    )
    assert "oldest buffered 2.0 h ago (is a forwarder running?)" in later["buffer"].detail


def test_a_buffer_that_does_not_exist_yet_is_a_warning_and_is_not_created(tmp_path):
    path = tmp_path / "not-yet" / "buffer.sqlite3"
    checks = checks_by_name(doctor.doctor_run(db_path=str(path), client=None))

    assert checks["buffer"].level == "WARN" and "created by the first send" in checks["buffer"].detail
    assert not path.exists()


def test_a_file_that_is_not_a_buffer_fails(tmp_path):
    path = tmp_path / "buffer.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    checks = checks_by_name(doctor.doctor_run(db_path=str(path), client=None))
    assert checks["buffer"].level == "FAIL" and "cannot open" in checks["buffer"].detail


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("free, level", [(10 * 1024**3, "OK"), (200 * 1024**2, "WARN"), (10 * 1024**2, "FAIL")])
def test_free_disk_thresholds(buffer_path, monkeypatch, free, level):
    # A mock: a nearly full disk cannot be produced safely on a shared test machine.
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(100 * 1024**3, 100 * 1024**3 - free, free))
    assert doctor.check_disk(str(buffer_path)).level == level


def test_sqlite_older_than_3_26_is_a_warning(monkeypatch):
    # A mock: no SQLite older than 3.26 is installed here to link against.
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 22, 0))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.22.0")
    check = doctor.check_sqlite()
    assert check.level == "WARN" and "3.22.0 is older than 3.26.0" in check.detail


def test_json_output_lists_every_check(central, buffer_path, capsys):
    code = main(["--db", str(buffer_path), "--central-url", central.url, "--key", GOOD_KEY, "doctor", "--json"])
    checks = json.loads(capsys.readouterr().out)

    assert code == 0
    assert {"name": "key", "level": "OK", "detail": "central accepts the site key"} in checks


def test_doctor_changes_nothing_at_central(central, buffer_path, capsys):
    run_doctor(capsys, "--db", str(buffer_path), "--central-url", central.url, "--key", GOOD_KEY)
    assert [(r.method, r.path) for r in central.requests] == [
        ("GET", "/healthz"),
        ("GET", "/api/v1/notifications/?page_size=1"),
    ]
    assert central.stored == {}
