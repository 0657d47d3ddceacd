"""DATABASE_PGBOUNCER / ?pgbouncer=true: the connection settings PgBouncer's transaction mode
needs (no server-side cursors, no prepared statements), and a clear error for a bad value.
The dispatch and ingest suites themselves run through a real PgBouncer with
`make test-pgbouncer` (scripts/test_pgbouncer.py, a CI step)."""

import json
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, child_env

SHOW = (
    "import json, django; django.setup(); from django.conf import settings; d = settings.DATABASES['default']; "
    "print(json.dumps({'pgbouncer': settings.DATABASE_PGBOUNCER, "
    "'cursors_off': d.get('DISABLE_SERVER_SIDE_CURSORS', False), 'options': d.get('OPTIONS', {})}, default=str))"
)


def settings_with(database_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = child_env(database=database_url)
    env.pop("DATABASE_PGBOUNCER", None)  # set when this suite itself runs through PgBouncer
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("url", "env"),
    [
        ("postgres://u@db:6432/outbox?pgbouncer=true", {}),
        ("postgres://u@db:6432/outbox", {"DATABASE_PGBOUNCER": "true"}),
    ],
)
def test_pgbouncer_mode_turns_off_what_outlives_a_transaction(url, env):
    done = settings_with(url, **env)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["pgbouncer"] is True and shown["cursors_off"] is True
    assert "prepare_threshold" in shown["options"] and shown["options"]["prepare_threshold"] is None
    assert "pgbouncer" not in shown["options"]  # not passed on to the driver


def test_without_pgbouncer_server_side_cursors_stay_available():
    done = settings_with("postgres://u@db:5432/outbox")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["pgbouncer"], shown["cursors_off"]) == (False, False)


def test_an_unreadable_pgbouncer_value_is_a_settings_error():
    done = settings_with("postgres://u@db:6432/outbox?pgbouncer=maybe")
    assert done.returncode != 0
    assert "Environment variable DATABASE_URL is invalid: pgbouncer= must be true or false" in done.stderr
