"""Deployment on several hosts, as docs/deployment.md sets it up.

* Two web hosts, each with the shipped environment file's settings (ALLOWED_HOSTS is the
  public name only), its own STATIC_ROOT prepared by the command outbox-web.service runs before
  gunicorn, and gunicorn from gunicorn.conf.py: the probes answer 200 to the backend address
  as Host (as a load balancer and Prometheus send it), each host serves the console's static
  files, another path with that Host is refused with 400, and no probe leaves a DisallowedHost
  record in the log. A web host whose STATIC_ROOT was not collected says so at start.
* PgBouncer: the pgbouncer.ini of the guide, with a userlist.txt made by its SCRAM query, lets
  a role in with its password and no one without.
"""

import json
import re
import secrets
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import django.contrib.admin
import pytest
import requests
from django.db import connection

from outbox_project.env_file import env_file_parse
from tests.support.db import database_url
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support.processes import ROOT, Central, child_env

GUIDE = ROOT / "docs" / "deployment.md"
ENV_EXAMPLE = ROOT / "deploy" / "systemd" / "outbox.env.example"
WEB_UNIT = ROOT / "deploy" / "systemd" / "outbox-web.service"
ADMIN_CSS = Path(django.contrib.admin.__file__).parent / "static" / "admin" / "css" / "base.css"
PUBLIC = "outbox.example.com"


def unit_commands(unit: Path, directive: str) -> list[list[str]]:
    """The commands of ``directive=`` lines of ``unit``, run with this checkout's Python."""
    return [
        shlex.split(line.split("=", 1)[1].replace("/opt/outbox/.venv/bin/python", sys.executable))
        for line in unit.read_text().splitlines()
        if line.startswith(f"{directive}=")
    ]


def web_host_environment(directory: Path, secret_key: str) -> dict[str, Any]:
    """The environment of one web host: the shipped environment file (its database replaced
    by the test database, its placeholder key by ``secret_key``) and, as the unit sets it, a
    metrics directory; the host's own STATIC_ROOT under ``directory``."""
    environment: dict[str, Any] = dict(env_file_parse(text=ENV_EXAMPLE.read_text()))
    del environment["DATABASE_URL"]  # the test database (child_env)
    environment.update(
        SECRET_KEY=secret_key,
        STATIC_ROOT=str(directory / "static"),
        PROMETHEUS_MULTIPROC_DIR=str(directory / "metrics"),
    )
    return environment


def json_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_two_web_hosts_answer_probes_to_any_host_and_serve_the_console_files_each_from_its_own_root(
    transactional_db, tmp_path
):
    secret_key = secrets.token_urlsafe(50)
    hosts: list[tuple[Central, Path, Path]] = []
    try:
        for number in (1, 2):
            directory = tmp_path / f"web{number}"
            environment = web_host_environment(directory, secret_key)
            assert environment["ALLOWED_HOSTS"] == PUBLIC and environment["LOG_FORMAT"] == "json"
            # What outbox-web.service runs before gunicorn starts (and before a reload).
            for command in unit_commands(WEB_UNIT, "ExecStartPre"):
                done = subprocess.run(
                    command, cwd=ROOT, env=child_env(**environment), capture_output=True, text=True, check=False
                )
                assert done.returncode == 0, done.stderr
                assert done.stdout == ""  # nothing but log records in the unit's journal
            log = directory / "web.log"
            with log.open("w") as stderr:
                hosts.append((Central(workers=1, stderr=stderr, **environment).start(), directory, log))

        for central, directory, _ in hosts:
            backend = {"Host": f"127.0.0.1:{central.port}"}  # what a load balancer and Prometheus send
            public = {"Host": PUBLIC, "X-Forwarded-Proto": "https"}  # what nginx passes on

            health = requests.get(f"{central.url}/healthz", headers=backend, timeout=10)
            assert (health.status_code, health.json()) == (200, {"status": "ok", "database": "up"})
            scrape = requests.get(f"{central.url}/metrics", headers=backend, timeout=10)
            assert scrape.status_code == 200 and "outbox_queue_depth" in scrape.text

            css = requests.get(f"{central.url}/static/admin/css/base.css", headers=public, timeout=10)
            assert css.status_code == 200 and css.content == ADMIN_CSS.read_bytes()
            own = requests.get(f"{central.url}/static/notifications/outbox.css", headers=public, timeout=10)
            assert own.status_code == 200
            assert (directory / "static" / "admin" / "css" / "base.css").is_file()  # this host's own root
            login = requests.get(f"{central.url}/admin/login/", headers=public, timeout=10)
            assert login.status_code == 200 and "/static/admin/css/base.css" in login.text

            assert requests.get(f"{central.url}/admin/login/", headers=backend, timeout=10).status_code == 400
            api = requests.get(f"{central.url}/api/v1/notifications/", headers=backend, timeout=10)
            assert (api.status_code, api.json()["error"]) == (400, "bad_request")
    finally:
        for central, _, _ in hosts:
            central.stop()

    for _, _, log in hosts:
        records = json_records(log)
        refused = [r for r in records if r["logger"] == "django.security.DisallowedHost"]
        assert sorted(r["request"] for r in refused) == [
            "<ASGIRequest: GET '/admin/login/'>",
            "<ASGIRequest: GET '/api/v1/notifications/'>",
        ]
        assert not [r for r in records if r["logger"] == "outbox_project.static_files"]


@pytest.mark.slow
def test_a_web_host_whose_static_files_were_not_collected_says_so_at_start(transactional_db, tmp_path):
    environment = web_host_environment(tmp_path, secrets.token_urlsafe(50))
    log = tmp_path / "web.log"
    with log.open("w") as stderr, Central(workers=1, stderr=stderr, **environment) as central:
        public = {"Host": PUBLIC, "X-Forwarded-Proto": "https"}
        assert requests.get(f"{central.url}/static/admin/css/base.css", headers=public, timeout=10).status_code == 404
    (warning,) = [r for r in json_records(log) if r["logger"] == "outbox_project.static_files"]
    assert warning["level"] == "WARNING"
    assert f"STATIC_ROOT {tmp_path / 'static'} lacks" in warning["message"]
    assert "python manage.py collectstatic --noinput" in warning["message"]


# --- PgBouncer ---------------------------------------------------------------------------------

# The guide's query for userlist.txt (its shell command holds it with the double quotes escaped).
USERLIST_QUERY = "SELECT format('\"%s\" \"%s\"', rolname, rolpassword) FROM pg_authid WHERE rolname = 'outbox'"


def guide_pgbouncer_ini() -> str:
    (ini,) = [block for block in re.findall(r"```ini\n(.*?)```", GUIDE.read_text(), re.S) if "[pgbouncer]" in block]
    return ini


class GuidePgBouncer(PgBouncer):
    """PgBouncer with the guide's pgbouncer.ini (this machine's addresses and paths put in) and
    a userlist.txt given by the test."""

    def __init__(self, *, upstream: str, database: str, userlist: str) -> None:
        super().__init__(upstream=upstream)
        self.database, self.users = database, userlist

    def userlist(self) -> str:
        return self.users

    def config(self) -> str:
        ini = guide_pgbouncer_ini()
        replacements = {
            "host=db.example.com port=5432 dbname=outbox": (
                f"host={self.upstream_host} port={self.upstream_port} dbname={self.database}"
            ),
            "listen_addr = 0.0.0.0": "listen_addr = 127.0.0.1",
            "listen_port = 6432": f"listen_port = {self.port}",
            "auth_file = /etc/pgbouncer/userlist.txt": f"auth_file = {self.directory / 'userlist.txt'}",
        }
        for documented, here in replacements.items():
            assert documented in ini, f"the guide's pgbouncer.ini no longer has {documented!r}"
            ini = ini.replace(documented, here)
        d = self.directory
        return ini + f"unix_socket_dir =\nlogfile = {d / 'pgbouncer.log'}\npidfile = {d / 'pgbouncer.pid'}\n"


@pytest.mark.slow
def test_the_guides_pgbouncer_ini_and_scram_userlist_let_a_role_in_with_its_password_only(db):
    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer sits in front of PostgreSQL")
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (Debian package pgbouncer)")
    ini = guide_pgbouncer_ini()
    assert "server_login_retry = 1" in ini and "pool_mode = transaction" in ini
    assert USERLIST_QUERY.replace('"', '\\"') in GUIDE.read_text()

    import psycopg
    from psycopg import sql

    server = database_url()
    parsed = urlparse(server)
    role, password = f"outbox_scram_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(16)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        try:
            (line,) = admin.execute(USERLIST_QUERY.replace("'outbox'", f"'{role}'")).fetchone() or ()
            assert line.startswith(f'"{role}" "SCRAM-SHA-256$')  # a secret, never the password itself
            with GuidePgBouncer(upstream=server, database=parsed.path.lstrip("/"), userlist=line + "\n") as bouncer:
                through = f"postgresql://{role}:{password}@127.0.0.1:{bouncer.port}/outbox"
                with psycopg.connect(through, connect_timeout=5) as client:
                    assert client.execute("SELECT current_user").fetchone() == (role,)
                wrong = f"postgresql://{role}:not-{password}@127.0.0.1:{bouncer.port}/outbox"
                with pytest.raises(psycopg.OperationalError, match="authentication failed"):
                    psycopg.connect(wrong, connect_timeout=5)
        finally:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
