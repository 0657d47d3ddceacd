"""Logs never carry a URL's query string or credentials (docs/observability.md, "What logs never
show").

Secrets travel in URLs: a Teams Workflows URL is signed in its query (``…&sig=…``), a client may
put its API key there (``?api_key=…``), an Apprise or proxy URL may hold ``user:password@``.
Libraries log URLs as they are: httpx at INFO ("HTTP Request: POST https://…?sig=… 200 OK"),
Django the request a 404 or 500 answered (``<ASGIRequest: GET '/api/…?api_key=…'>``), gunicorn
its request lines. So every handler of the application's and gunicorn's logging has
:class:`RedactingFilter`, which redacts, in every URL or request path of a record's message, its
arguments, its extra values and its traceback: each query value (names stay, they say what
was asked) and the user information.

An acknowledgement link carries its signed token in the path (``/ack/<token>/``), so the token
is redacted too: ``/ack/[redacted]/``.

gunicorn's access log (outbox_project/weblog.py) uses the same functions.
"""

import logging
import re
from typing import Any

REDACTED = "[redacted]"
_TRACEBACKS = logging.Formatter()

# A URL with a scheme, or a path (from "/"), then a query: "?" and what follows up to white
# space or a quote; the user information of a URL with a scheme ("scheme://user:secret@").
_QUERY = re.compile(r"((?:\b[A-Za-z][A-Za-z0-9+.-]*://|/)[^\s?\"'<>`]*\?)([^\s\"'<>`]+)")
# The token of an acknowledgement page's path (notifications.ack_page).
_ACK_TOKEN = re.compile(r"(/ack/)[^/\s?#\"'<>`]+")
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#\"'<>`]*@")

# Attributes every LogRecord has; anything else on a record came from extra=.
STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def query_redact(query: str) -> str:
    """``query`` (a query string without its ``?``) with every value replaced by ``[redacted]``:
    ``list_name=Ops&api_key=abc`` → ``list_name=[redacted]&api_key=[redacted]``. A parameter
    without ``=`` may be a value alone (``?abc.secret``): redacted whole."""
    if not query:
        return query
    parts = []
    for part in re.split(r"([&;])", query):
        if part in ("&", ";", ""):
            parts.append(part)
        else:
            name, equals, _ = part.partition("=")
            parts.append(f"{name}={REDACTED}" if equals else REDACTED)
    return "".join(parts)


def urls_redact(text: str) -> str:
    """``text`` with the query of every URL or path in it redacted (:func:`query_redact`) and
    every URL's user information replaced by ``[redacted]``, and the token of every
    acknowledgement page path."""
    if "/ack/" in text:
        text = _ACK_TOKEN.sub(lambda match: match.group(1) + REDACTED, text)
    if "?" not in text and "@" not in text:
        return text
    text = _USERINFO.sub(lambda match: f"{match.group(1)}{REDACTED}@", text)
    return _QUERY.sub(lambda match: match.group(1) + query_redact(match.group(2)), text)


class RedactingFilter(logging.Filter):
    """Redacts URLs in a record (:func:`urls_redact`) before a handler writes it: the message
    with its arguments filled in, the values passed with ``extra=`` (objects such as a request by
    their text, when that holds a URL to redact), the traceback and the stack. The record is
    changed in place, so every handler after this one sees it redacted too."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - arguments that do not fit the format: written beside it, redacted
            message = f"{record.msg} {record.args!r}"
            record.msg, record.args = urls_redact(message), None
        redacted = urls_redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        for name, value in list(vars(record).items()):
            if name in STANDARD_ATTRIBUTES or value is None or isinstance(value, (bool, int, float)):
                continue
            text = value if isinstance(value, str) else _text(value)
            if text is not None and urls_redact(text) != text:
                setattr(record, name, urls_redact(text))
        if record.exc_info and not record.exc_text:
            # Formatted here, as a formatter would: formatters write exc_text when it is set.
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = urls_redact(record.exc_text)
        if record.stack_info:
            record.stack_info = urls_redact(record.stack_info)
        return True


def _text(value: Any) -> str | None:
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an object whose str() fails is left to the formatter
        return None
