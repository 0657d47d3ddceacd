"""The agent runs where sites run it: any Python from 3.8, SQLite from 3.26 (with or without
``UPDATE … RETURNING``), Linux or Windows, with nothing but the standard library."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sites.agent import SiteOutbox
from sites.agent.buffer import ENV_NO_RETURNING, Buffer, sqlite_has_returning
from tests.agent.conftest import send_many
from tests.agent.fake_central import Reply

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "sites" / "agent"

# Modules that exist only on POSIX systems; none may be imported by the agent (Windows hosts).
POSIX_ONLY = {"fcntl", "termios", "tty", "pty", "pwd", "grp", "resource", "syslog", "crypt", "posix", "spwd", "nis"}


def agent_imports():
    """Top-level module names every agent source file imports, at any depth."""
    names: set = set()
    for path in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_the_agent_imports_no_posix_only_module():
    assert agent_imports() & POSIX_ONLY == set()


def test_the_agent_imports_only_the_standard_library():
    # -S: no site-packages at all, so any third-party import (Django included) fails here.
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "import sites.agent, sites.agent.cli, sites.agent.bench, sites.agent.doctor\n"
        "print('django' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=str(AGENT), env=env, capture_output=True, text=True, check=True
    ).stdout

    assert out.strip() == "False"


def test_the_returning_fallback_can_be_forced_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_NO_RETURNING, "1")
    assert sqlite_has_returning() is False
    monkeypatch.delenv(ENV_NO_RETURNING)
    assert sqlite_has_returning() is (__import__("sqlite3").sqlite_version_info >= (3, 35, 0))


@pytest.mark.parametrize("use_returning", [True, False], ids=["returning", "pre-3.35 path"])
def test_both_update_paths_count_retrying_and_parked_rows_alike(buffer_path, use_returning):
    if use_returning and not sqlite_has_returning():
        pytest.skip("UPDATE … RETURNING is off: SQLite older than 3.35, or the fallback is forced")
    buffer = Buffer(buffer_path, use_returning=use_returning)
    try:
        ids = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(6)]
        for notification_id in ids:
            buffer.insert(notification_id=notification_id, payload="{}", created_at="2026-11-21T10:00:00.000000Z")
        buffer.park({ids[5]: "parked by hand"}, now="2026-11-21T10:00:00.000000Z")
        # Two attempts for the first three, so they reach the budget of 3 one attempt earlier.
        for _ in range(2):
            buffer.record_transient_failure(ids[:3], error="HTTP 503", now="t", next_attempt_at="t", max_retries=3)

        counts = buffer.record_transient_failure(ids, error="HTTP 503", now="t", next_attempt_at="t", max_retries=3)

        assert counts == (2, 3)  # ids 3 and 4 retrying; 0–2 spent their budget; 5 untouched
        rows = [buffer.get(nid) for nid in ids]
        assert [row.status if row else None for row in rows] == ["parked"] * 3 + ["forwarding"] * 2 + ["parked"]
        assert [row.last_error if row else None for row in (rows[5], rows[0])] == [
            "parked by hand",
            "Retries exhausted after 3 attempts; last error: HTTP 503",
        ]
    finally:
        buffer.close()


@pytest.mark.parametrize("use_returning", [True, False], ids=["returning", "pre-3.35 path"])
def test_a_backlog_larger_than_one_chunk_is_counted_on_both_paths(buffer_path, use_returning):
    if use_returning and not sqlite_has_returning():
        pytest.skip("UPDATE … RETURNING is off: SQLite older than 3.35, or the fallback is forced")
    buffer = Buffer(buffer_path, use_returning=use_returning)
    try:
        rows = [(f"id-{n:05d}", "{}", "2026-11-21T10:00:00.000000Z") for n in range(1201)]
        buffer.insert_many(rows)
        counts = buffer.record_transient_failure(
            [row[0] for row in rows], error="down", now="t", next_attempt_at="t", max_retries=1
        )
        assert counts == (0, 1201)
    finally:
        buffer.close()


def test_the_forwarder_parks_on_an_exhausted_budget_on_the_pre_335_path(make_outbox, central, clock):
    outbox = make_outbox(max_retries=2, retry_interval=30, use_returning=False)
    central.always = Reply(302, headers={"Location": "https://sso.example.com/login"})  # counted, unlike outages
    (notification_id,) = send_many(outbox, 1)

    first = outbox.forward_once()
    clock.advance(30)
    second = outbox.forward_once()

    assert (first.retrying, first.parked, second.retrying, second.parked) == (1, 0, 0, 1)
    assert outbox.status(notification_id)["status"] == "Parked"


def test_a_site_outbox_picks_the_path_its_sqlite_supports(buffer_path, monkeypatch):
    with SiteOutbox(buffer_path, None, None) as outbox:
        assert outbox.buffer.use_returning is sqlite_has_returning()
    monkeypatch.setenv(ENV_NO_RETURNING, "1")
    with SiteOutbox(buffer_path, None, None) as outbox:
        assert outbox.buffer.use_returning is False
