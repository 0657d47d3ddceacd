"""The agent's distributions (scripts/agent_dist.py): a one-file zipapp and a wheel named
outbox-site-agent, both standard library only, built offline and reproducibly."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sites.agent

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    env.update({key: str(value) for key, value in extra.items()})
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "agent_dist.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.split()
    pyz, wheel = (Path(path) for path in built)
    return {"out": out, "pyz": pyz, "wheel": wheel}


def run(command, cwd, **env):
    # Run from a directory without the repository, so only the archive can provide the agent.
    return subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True, text=True, check=False)


def test_the_zipapp_runs_send_and_stats_on_its_own(dist, tmp_path):
    db = tmp_path / "buffer.sqlite3"
    sent = run(
        [sys.executable, str(dist["pyz"]), "send", "--list", "Operators", "--subject", "s", "--body", "b"],
        tmp_path,
        OUTBOX_AGENT_DB=db,
    )
    stats = run([sys.executable, str(dist["pyz"]), "stats", "--json"], tmp_path, OUTBOX_AGENT_DB=db)

    assert sent.returncode == 0, sent.stderr
    assert json.loads(stats.stdout) == {"buffered": 1, "parked": 0}


def test_the_zipapp_reports_its_version_and_usage_under_its_own_name(dist, tmp_path):
    version = run([sys.executable, str(dist["pyz"]), "--version"], tmp_path)
    usage = run([sys.executable, str(dist["pyz"]), "--help"], tmp_path)

    assert version.stdout.startswith(f"outbox-site-agent {sites.agent.__version__} (Python ")
    assert usage.stdout.startswith("usage: outbox-agent.pyz")


def test_the_wheel_is_named_outbox_site_agent_and_depends_on_nothing(dist):
    assert dist["wheel"].name == f"outbox_site_agent-{sites.agent.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"outbox_site_agent-{sites.agent.__version__}.dist-info/METADATA").decode()
        record = wheel.read(f"outbox_site_agent-{sites.agent.__version__}.dist-info/RECORD").decode()

    assert "Name: outbox-site-agent\n" in metadata and "Requires-Python: >=3.8\n" in metadata
    assert "Requires-Dist" not in metadata
    assert "sites/__init__.py" not in names  # `sites` stays a namespace package
    assert {name for name in names if name.startswith("sites/")} == {
        f"sites/agent/{path.name}" for path in (REPO / "sites" / "agent").glob("*.py")
    }
    assert all(line.split(",")[0] in names for line in record.splitlines())


def test_the_wheel_installs_offline_and_provides_the_outbox_agent_command(dist, tmp_path):
    target = tmp_path / "installed"
    installed = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            str(dist["wheel"]),
        ],
        tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    script = target / ("Scripts/outbox-agent.exe" if os.name == "nt" else "bin/outbox-agent")

    version = run([sys.executable, str(script), "--version"], tmp_path, PYTHONPATH=target)
    module = run([sys.executable, "-m", "sites.agent", "--version"], tmp_path, PYTHONPATH=target)

    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"outbox-site-agent {sites.agent.__version__}")
    assert module.stdout == version.stdout


def test_building_twice_gives_the_same_bytes(dist, tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "agent_dist.py"), "--out", str(tmp_path)],
        capture_output=True,
        check=True,
        env=clean_env(),
    )
    assert (tmp_path / dist["pyz"].name).read_bytes() == dist["pyz"].read_bytes()
    assert (tmp_path / dist["wheel"].name).read_bytes() == dist["wheel"].read_bytes()
