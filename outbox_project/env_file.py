"""The environment file of the systemd units (``/etc/outbox/outbox.env``), read as systemd reads
it, so that a command run by hand sees what the services see::

    OUTBOX_ENV_FILE=/etc/outbox/outbox.env python manage.py migrate

systemd's rules (systemd.exec(5), ``EnvironmentFile=``), not a shell's: nothing is expanded, so
``$``, ``(``, `````, ``#`` and ``;`` inside a value are literal, and ``$NAME`` is those five
characters, never another variable's value. In detail:

* one ``NAME=value`` per line; blank lines, and lines whose first non-blank character is ``#``
  or ``;``, are comments; blanks around the name and the ``=`` and at both ends of the value
  are dropped, blanks inside the value kept;
* unquoted, a backslash keeps the next character as it is (``\\\\`` is one backslash) and one at
  the end of a line joins the next line; a quote after the value's first character is kept;
* ``'…'`` keeps everything up to the next single quote as it is, line breaks included;
* ``"…"`` does too, except that ``\\"``, ``\\\\``, ``\\``` and ``\\$`` stand for the second
  character, and a backslash at the end of a line joins the next one;
* quoted and unquoted parts that follow each other make one value (``"a"'b'c`` is ``abc``); a
  name given twice takes the later value.

This is a line-for-line reading of systemd's parser (``src/basic/env-file.c``). Where systemd
skips a line with only a note in its log (no ``=``, a name that is not a variable name,
invalid UTF-8, an unterminated quote), reading fails here naming the line: the service would
run without that setting, which is worth knowing before it matters.
"""

import os
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

NEWLINE = "\n\r"
WHITESPACE = " \t\n\r"
COMMENTS = "#;"
DOUBLE_QUOTE_ESCAPES = '"\\`$'


class EnvFileError(ValueError):
    """A line of an environment file that systemd would not read as a setting."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line


def _is_name(key: str) -> bool:
    return bool(key) and not key[0].isdigit() and all(c == "_" or (c.isascii() and c.isalnum()) for c in key)


def env_file_parse(*, text: str) -> dict[str, str]:
    """The variables ``text`` (an environment file's content) sets, by systemd's rules (the
    module's docstring). EnvFileError for a line systemd would skip."""
    values: dict[str, str] = {}
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_end: int | None = None  # where trailing blanks of the name start
    value_end: int | None = None  # where trailing blanks of an unquoted value start
    line = 1  # of the character read
    started = 1  # the line the current name started on
    quote_line = 1

    def push() -> None:
        name = "".join(key[:key_end] if key_end is not None else key)
        text = "".join(value)
        if not _is_name(name):
            raise EnvFileError(started, f"{name!r} is not a variable name (systemd ignores this line)")
        values[name] = text

    for c in text:
        if c == "\0":
            raise EnvFileError(line, "a NUL character (systemd stops reading the file there)")
        if state == "pre_key":
            if c in COMMENTS:
                state = "comment"
            elif c not in WHITESPACE:
                state, key, key_end, started = "key", [c], None, line
        elif state == "key":
            if c in NEWLINE:
                raise EnvFileError(started, "no '=' (systemd ignores this line)")
            if c == "=":
                state, value, value_end = "pre_value", [], None
            else:
                if c not in WHITESPACE:
                    key_end = None
                elif key_end is None:
                    key_end = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in NEWLINE:
                push()
                state = "pre_key"
            elif c == "'":
                state, quote_line = "single_quote", line
            elif c == '"':
                state, quote_line = "double_quote", line
            elif c == "\\":
                state = "value_escape"
            elif c not in WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in NEWLINE:
                if value_end is not None:
                    del value[value_end:]
                push()
                state = "pre_key"
            elif c == "\\":
                state, value_end = "value_escape", None
            else:
                if c not in WHITESPACE:
                    value_end = None
                elif value_end is None:
                    value_end = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in NEWLINE:  # an escaped line break joins the next line
                value.append(c)
        elif state == "single_quote":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double_quote":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_quote_escape"
            else:
                value.append(c)
        elif state == "double_quote_escape":
            state = "double_quote"
            if c in DOUBLE_QUOTE_ESCAPES:
                value.append(c)
            elif c != "\n":  # another character keeps its backslash, as in a shell
                value.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            if c in NEWLINE:
                # systemd 254 and later end the comment here; older ones (Debian 12 has 252)
                # also ignore the next line.
                raise EnvFileError(
                    line, "a comment ending with a backslash (systemd versions disagree on the next line)"
                )
            state = "comment"
        if c == "\n":
            line += 1

    if state == "key":
        raise EnvFileError(started, "no '=' (systemd ignores this line)")
    if state in ("single_quote", "double_quote", "double_quote_escape"):
        raise EnvFileError(quote_line, "a quote that is never closed")
    if state in ("pre_value", "value", "value_escape"):
        if state == "value" and value_end is not None:
            del value[value_end:]
        push()
    return values


def env_file_load(*, path: str | Path) -> list[str]:
    """Set the variables of the environment file ``path`` (systemd's rules) that the environment
    does not already hold, and return their names: a variable set when the command is started
    wins, as with ``.env``. ImproperlyConfigured naming OUTBOX_ENV_FILE, the file and the
    problem when it cannot be read."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ImproperlyConfigured(f"Environment variable OUTBOX_ENV_FILE: cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ImproperlyConfigured(
            f"Environment variable OUTBOX_ENV_FILE: {path}, line {line}: not UTF-8 (systemd ignores this line)"
        ) from None
    try:
        values = env_file_parse(text=text)
    except EnvFileError as exc:
        raise ImproperlyConfigured(f"Environment variable OUTBOX_ENV_FILE: {path}, {exc}") from None
    loaded = [name for name in values if name not in os.environ]
    for name in loaded:
        os.environ[name] = values[name]
    return loaded


class LiteralEnv(environ.Env):
    """django-environ's reader, taking every value as it is.

    django-environ reads a value that starts with ``$`` as the name of another variable
    (``SECRET_KEY=$abc…`` would be the value of ``abc…``, or empty); neither systemd nor this
    project's environment file expand anything, and a generated secret may well start with
    ``$``."""

    def get_value(
        self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET, parse_default: bool = False
    ) -> Any:
        raw = self.ENVIRON.get(f"{self.prefix}{var}")
        if isinstance(raw, str) and raw.startswith("$"):
            return raw if cast is None else self.parse_value(raw, cast)
        return super().get_value(var, cast=cast, default=default, parse_default=parse_default)
