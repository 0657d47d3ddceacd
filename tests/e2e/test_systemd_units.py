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


def test_the_units_are_shipped():
    assert [unit.name for unit in UNITS] == ["outbox-metrics.service", "outbox-web.service", "outbox-worker.service"]


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


def directives(unit: Path, name: str) -> list[str]:
    """The values of every ``name=`` line of ``unit``, in order."""
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith(f"{name}=")]


def test_stopping_a_unit_signals_its_main_process_only():
    # gunicorn's master and django-q2's cluster stop their own processes; a SIGTERM to every
    # process of the cluster at once leaves qcluster hanging for over a minute.
    for unit in UNITS:
        assert directives(unit, "KillMode") == ["mixed"], unit.name


def test_every_web_host_collects_the_static_files_at_start_and_reload():
    web = ROOT / "deploy" / "systemd" / "outbox-web.service"
    collect = "/opt/outbox/.venv/bin/python manage.py collectstatic --noinput --verbosity 0"
    assert directives(web, "ExecStartPre") == [collect]
    assert directives(web, "ExecReload") == [collect, "/bin/kill -s HUP $MAINPID"]
