"""The systemd units in deploy/systemd/ pass `systemd-analyze verify`, with the installation
paths of the documented layout replaced by this checkout's (the command checks that the
programs exist). Skipped with the reason where systemd-analyze is not installed."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


def localised(unit: Path, directory: Path) -> Path:
    """``unit`` with /opt/outbox, its interpreter and the environment file pointing here, and
    the current user: what the checks need to find on this machine."""
    text = unit.read_text()
    environment = directory / "outbox.env"
    environment.write_text("DATABASE_URL=sqlite:///unused.sqlite3\n")
    text = (
        text.replace("/opt/outbox/.venv/bin/python", sys.executable)
        .replace("/opt/outbox/.venv/bin/gunicorn", str(Path(sys.executable).parent / "gunicorn"))
        .replace("/opt/outbox", str(ROOT))
        .replace("/etc/outbox/outbox.env", str(environment))
    )
    path = directory / unit.name
    path.write_text(text)
    return path


def test_both_units_are_shipped():
    assert [unit.name for unit in UNITS] == ["outbox-web.service", "outbox-worker.service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_unit_passes_systemd_analyze_verify(unit, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(localised(unit, tmp_path))], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outbox" not in done.stderr.lower(), done.stderr  # no warning about the unit at all


def test_the_units_share_the_metrics_directory_and_read_one_environment_file():
    for unit in UNITS:
        text = unit.read_text()
        assert "Environment=PROMETHEUS_MULTIPROC_DIR=/run/outbox/metrics" in text
        assert "RuntimeDirectory=outbox" in text and "RuntimeDirectoryPreserve=yes" in text
        assert "EnvironmentFile=/etc/outbox/outbox.env" in text
