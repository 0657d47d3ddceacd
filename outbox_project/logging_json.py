"""Log formats: ``LOG_FORMAT=text`` (the default, for people) or ``json`` (for log shippers).

With ``json`` every record is one line holding one JSON object::

    {"timestamp": "2026-11-23T10:00:00.123Z", "level": "INFO", "logger": "notifications.dispatch",
     "message": "…", "notification_id": "…", "site": "plant-a", "channel": "email",
     "worker": "q:host:123:ab12cd34", "outcome": "retrying"}

``timestamp`` (UTC, milliseconds), ``level``, ``logger`` and ``message`` are always there;
the context fields (``CONTEXT_FIELDS``) when the code that logs passes them with ``extra=``;
``process`` and ``thread`` names identify the writer; ``exception`` holds a traceback as one
string (its line breaks escaped, so the record stays one line). Any other ``extra=`` value is
kept too, as JSON or as its text.
"""

import io
import json
import logging
import logging.config
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

from outbox_project.log_redaction import STANDARD_ATTRIBUTES

LOG_FORMATS = ("text", "json")
# Context a log call passes with extra= where it is relevant (dispatcher, ingest).
CONTEXT_FIELDS = ("notification_id", "site", "channel", "worker", "outcome")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        for name, value in vars(record).items():
            if name not in STANDARD_ATTRIBUTES and name not in entry:
                entry[name] = value
        entry["process"] = record.process
        entry["thread"] = record.threadName
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            # As logging.Formatter does: a traceback formatted once (and redacted:
            # outbox_project.log_redaction) is written as it is.
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def logging_config(*, log_format: str, level: str) -> dict[str, Any]:
    """Django's LOGGING for ``log_format`` (one of LOG_FORMATS) at ``level``: everything to
    standard error, database statement logging quiet. ValueError for another format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    formatter: dict[str, Any] = (
        {"()": "outbox_project.logging_json.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"outbox": formatter},
        "filters": {"redact": {"()": "outbox_project.log_redaction.RedactingFilter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "outbox", "filters": ["redact"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django.db.backends": {"level": "WARNING"},
            # Django's own handlers for these (its console and mail_admins, runserver's request
            # lines) would bypass the format and the redaction: they log through ours instead.
            "django": {"handlers": [], "propagate": True},
            "django.server": {"handlers": ["console"], "propagate": False},
        },
    }


def gunicorn_logging_config(*, level: str = "INFO") -> dict[str, Any]:
    """gunicorn's own log (its master's and workers' messages) in JSON, for ``logconfig_dict``
    in gunicorn.conf.py: to standard error, each line one object."""
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "stream": "ext://sys.stderr",
        "filters": ["redact"],
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "outbox_project.logging_json.JsonFormatter"}},
        "filters": {"redact": {"()": "outbox_project.log_redaction.RedactingFilter"}},
        "handlers": {"json": handler},
        "root": {"level": level, "handlers": ["json"]},
        "loggers": {
            # No level: gunicorn's --log-level (set before this is applied) stays in force.
            "gunicorn.error": {"handlers": ["json"], "propagate": False, "qualname": "gunicorn.error"},
            # The access log stays off, as it is without LOG_FORMAT=json.
            "gunicorn.access": {
                "level": "WARNING",
                "handlers": ["json"],
                "propagate": False,
                "qualname": "gunicorn.access",
            },
        },
    }


# --- output that bypasses logging (LOG_FORMAT=json) ----------------------------------------------


class StderrToLog(io.TextIOBase):
    """Standard error whose text becomes log records: each piece written up to a line break is
    one WARNING record of the logger ``outbox.stderr`` (a piece of several lines, such as
    Django's system check report, stays one record). What libraries print there — the system
    checks before a command runs, a thread's traceback — is then a JSON line like the rest.
    The real stream stays at ``stream``, where the log handlers write."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._pending = ""
        self._lock = threading.Lock()
        self._local = threading.local()

    def write(self, text: str) -> int:
        if getattr(self._local, "emitting", False):
            # A handler reporting its own failure writes here: straight to the real stream,
            # rather than round again.
            return self.stream.write(text)
        with self._lock:
            self._pending += text
            if not self._pending.endswith("\n"):
                return len(text)
            message, self._pending = self._pending, ""
        self._emit(message)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            message, self._pending = self._pending, ""
        self._emit(message)
        self.stream.flush()

    def _emit(self, message: str) -> None:
        message = message.rstrip("\n")
        if not message.strip():
            return
        self._local.emitting = True
        try:
            logging.getLogger("outbox.stderr").warning(message)
        finally:
            self._local.emitting = False

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding


def logging_configure(config: dict[str, Any]) -> None:
    """Django's ``LOGGING_CONFIG``: apply ``config`` (settings.LOGGING); with LOG_FORMAT=json,
    also log Python's warnings (logger ``py.warnings``) rather than print them, and, unless
    standard error is a terminal (a person reading), route what is printed there through
    logging (:class:`StderrToLog`), so that every line a process writes is one JSON object."""
    from django.conf import settings

    if isinstance(sys.stderr, StderrToLog):
        sys.stderr = sys.stderr.stream  # configured again: the handlers are built on the real stream
    logging.config.dictConfig(config)
    if getattr(settings, "LOG_FORMAT", "text") != "json":
        return
    logging.captureWarnings(True)
    if not sys.stderr.isatty():
        sys.stderr = StderrToLog(sys.stderr)
