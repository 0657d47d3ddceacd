"""OUTBOX_ENV_FILE: manage.py run by hand reads the systemd units' environment file with
systemd's rules (no shell: `$`, `(`, `#` and quotes inside a value are literal, `$NAME` is never
another variable), variables already set win, and a file systemd would not read as written is
a start-up error naming the line."""

import json
import subprocess
import sys

import pytest

from outbox_project.env_file import EnvFileError, env_file_parse
from tests.support.processes import ROOT, child_env

# Every character a generated secret may hold that a shell would act on, and quotes inside.
AWKWARD_KEY = "$ecret(1)#2;3`4`\"five\"'six'$HOME${PATH}&|<>*?~!"

SHOW_SETTINGS = (
    "import json, os; from django.conf import settings; "
    "print(json.dumps({'SECRET_KEY': settings.SECRET_KEY, 'ALLOWED_HOSTS': settings.ALLOWED_HOSTS, "
    "'OUTBOX_PUBLIC_URL': settings.OUTBOX_PUBLIC_URL, 'NOTE': os.environ.get('NOTE')}))"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("KEY=value\n", {"KEY": "value"}),
        ("  KEY  =   two  words  \n", {"KEY": "two  words"}),
        ("KEY=$HOME(x)#y;z`w`\n", {"KEY": "$HOME(x)#y;z`w`"}),
        ('KEY=it\'s "quoted" inside\n', {"KEY": 'it\'s "quoted" inside'}),
        ("KEY=value # not a comment\n", {"KEY": "value # not a comment"}),
        ("KEY=#not a comment either\n", {"KEY": "#not a comment either"}),
        ("KEY='$HOME \\n \"x\"'\n", {"KEY": '$HOME \\n "x"'}),
        ('KEY="\\"q\\" \\$HOME \\` \\\\ \\n"\n', {"KEY": '"q" $HOME ` \\ \\n'}),
        ("KEY=a\\ b\\\\c\\$d\n", {"KEY": "a b\\c$d"}),
        ("KEY=trailing\\ \n", {"KEY": "trailing "}),
        ("KEY=one\\\ntwo\n", {"KEY": "onetwo"}),
        ('KEY="one\\\ntwo"\n', {"KEY": "onetwo"}),
        ("KEY='two\nlines'\n", {"KEY": "two\nlines"}),
        ("KEY=\"a\"'b'c\n", {"KEY": "abc"}),
        ('KEY="a"  \n', {"KEY": "a"}),
        ("KEY=\n", {"KEY": ""}),
        ("KEY=1\nKEY=2\n", {"KEY": "2"}),
        ("KEY=no final line break", {"KEY": "no final line break"}),
        ("KEY=crlf\r\nOTHER=x\r\n", {"KEY": "crlf", "OTHER": "x"}),
        ("# a comment\n; another\n\n   \n\tKEY=x\n", {"KEY": "x"}),
        ("KEY=émoji ✓\n", {"KEY": "émoji ✓"}),
    ],
)
def test_a_value_reads_as_systemd_reads_it(text, expected):
    assert env_file_parse(text=text) == expected


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("A=1\nexport KEY=value\n", 2, "'export KEY' is not a variable name"),
        ("A=1\n\nKEY\n", 3, "no '='"),
        ("KEY", 1, "no '='"),
        ("1KEY=x\n", 1, "'1KEY' is not a variable name"),
        ("KEY-NAME=x\n", 1, "'KEY-NAME' is not a variable name"),
        ('A=1\nKEY="open\nstill open\n', 2, "a quote that is never closed"),
        ("KEY='open\n", 1, "a quote that is never closed"),
        ("# a comment \\\nKEY=x\n", 1, "a comment ending with a backslash"),
        ("KEY=a\0b\n", 1, "a NUL character"),
    ],
)
def test_a_line_systemd_would_skip_is_an_error_naming_it(text, line, problem):
    with pytest.raises(EnvFileError) as raised:
        env_file_parse(text=text)
    assert raised.value.line == line
    assert problem in str(raised.value)


def test_the_shipped_example_reads_without_an_error():
    values = env_file_parse(text=(ROOT / "deploy" / "systemd" / "outbox.env.example").read_text())
    assert {"DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS", "LOG_FORMAT"} <= set(values)


def run_with_env_file(path, code: str = SHOW_SETTINGS, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py shell -c code`` with OUTBOX_ENV_FILE=path and none of the file's variables in
    the environment (unless given in ``env``)."""
    environment = child_env(database="sqlite:///unused.sqlite3", OUTBOX_ENV_FILE=path)
    for name in ("SECRET_KEY", "ALLOWED_HOSTS", "OUTBOX_PUBLIC_URL", "NOTE", "DATABASE_URL"):
        environment.pop(name, None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_manage_py_reads_the_env_file_literally_with_outbox_env_file(tmp_path):
    env_file = tmp_path / "outbox.env"
    env_file.write_text(
        "# /etc/outbox/outbox.env as the units read it\n"
        f"SECRET_KEY={AWKWARD_KEY}\n"
        "ALLOWED_HOSTS=outbox.example.com,outbox-web-1.example.com\n"
        "DATABASE_URL=sqlite:///unused.sqlite3\n"
        "NOTE=$SECRET_KEY and ${ALLOWED_HOSTS} stay as written\n"
    )
    done = run_with_env_file(env_file)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown == {
        "SECRET_KEY": AWKWARD_KEY,
        "ALLOWED_HOSTS": ["outbox.example.com", "outbox-web-1.example.com"],
        "OUTBOX_PUBLIC_URL": "",
        "NOTE": "$SECRET_KEY and ${ALLOWED_HOSTS} stay as written",
    }


def test_a_variable_set_when_the_command_starts_wins_over_the_file(tmp_path):
    env_file = tmp_path / "outbox.env"
    env_file.write_text("SECRET_KEY=from-the-file\nALLOWED_HOSTS=outbox.example.com\n")
    done = run_with_env_file(env_file, ALLOWED_HOSTS="override.example.com")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert (shown["SECRET_KEY"], shown["ALLOWED_HOSTS"]) == ("from-the-file", ["override.example.com"])


def test_a_value_starting_with_a_dollar_is_never_read_as_another_variable(tmp_path):
    # django-environ alone would take SECRET_KEY=$HOME for the value of HOME.
    done = run_with_env_file(tmp_path / "none.env", OUTBOX_ENV_FILE="", SECRET_KEY="$HOME")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["SECRET_KEY"] == "$HOME"


def test_a_missing_env_file_stops_the_command_naming_the_variable_and_the_path(tmp_path):
    done = run_with_env_file(tmp_path / "missing.env")
    assert done.returncode != 0
    assert f"Environment variable OUTBOX_ENV_FILE: cannot read {tmp_path / 'missing.env'}" in done.stderr
    assert "No such file or directory" in done.stderr


def test_a_line_systemd_would_skip_stops_the_command_naming_the_file_and_the_line(tmp_path):
    env_file = tmp_path / "outbox.env"
    env_file.write_text("SECRET_KEY=x\nexport DEBUG=true\n")
    done = run_with_env_file(env_file)
    assert done.returncode != 0
    assert f"Environment variable OUTBOX_ENV_FILE: {env_file}, line 2: 'export DEBUG' is not a variable name" in (
        done.stderr
    )


def test_an_env_file_that_is_not_utf8_is_named(tmp_path):
    env_file = tmp_path / "outbox.env"
    env_file.write_bytes(b"SECRET_KEY=x\nNOTE=caf\xe9\n")
    done = run_with_env_file(env_file)
    assert done.returncode != 0
    assert f"{env_file}, line 2: not UTF-8" in done.stderr
