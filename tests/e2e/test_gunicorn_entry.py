"""`gunicorn outbox_project.wsgi`, the command every Django deployment guide shows, refuses to
start in one line saying what to run instead (gunicorn.conf.py's ASGI worker cannot serve the
WSGI application); the WSGI application with a WSGI worker, asked for on purpose, serves."""

import json
import subprocess
import sys
import urllib.request

import pytest

from tests.support.payloads import make_payload
from tests.support.processes import ROOT, Central, child_env, free_port

pytestmark = pytest.mark.slow


def gunicorn(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{free_port()}", *arguments],
        cwd=ROOT,
        env=child_env(database="sqlite:///unused.sqlite3"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gunicorn_with_the_wsgi_module_refuses_to_start_in_one_line_naming_the_command_to_run():
    result = gunicorn("outbox_project.wsgi")

    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "Starting gunicorn" not in line]
    assert line.startswith("gunicorn: outbox_project.wsgi is the WSGI application")
    assert "run `gunicorn` with no application argument" in line


def test_gunicorn_with_the_asgi_application_and_a_wsgi_worker_refuses_to_start_too():
    result = gunicorn("--worker-class", "gthread", "outbox_project.asgi:application")

    assert result.returncode == 1
    assert "needs the ASGI worker: leave out --worker-class" in result.stderr


def test_the_wsgi_application_serves_with_a_wsgi_worker_asked_for_on_purpose(transactional_db, site_key):
    with Central(workers=1, options=["--worker-class", "gthread", "outbox_project.wsgi:application"]) as central:
        request = urllib.request.Request(
            f"{central.url}/api/v1/notifications/",
            data=json.dumps(make_payload()).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Api-Key {site_key}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
        with urllib.request.urlopen(f"{central.url}/admin/login/", timeout=10) as response:
            assert response.status == 200
