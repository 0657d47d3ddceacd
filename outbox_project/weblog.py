"""The web server's log: gunicorn's, with query strings and URL credentials redacted by the same
rules as the application's log (outbox_project.log_redaction)."""

from typing import Any

from gunicorn.glogging import Logger

from outbox_project.log_redaction import RedactingFilter, query_redact, urls_redact

# Atoms that hold a query string alone (no "?" in front); every other text atom is redacted
# where it holds a URL or a path with a query (the request line, the referrer …).
QUERY_ATOMS = ("q", "{query_string}e")


class RedactingLogger(Logger):
    """gunicorn's logger: the access log's atoms are redacted (the request line, the query
    string, the referrer, …), and every handler of its error and access logs gets the
    application's :class:`RedactingFilter` (gunicorn logs a request's URI when it fails)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
                    handler.addFilter(RedactingFilter())

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> dict[str, Any]:
        atoms = super().atoms(resp, req, environ, request_time)
        for name, value in atoms.items():
            if isinstance(value, str):
                atoms[name] = query_redact(value) if name in QUERY_ATOMS else urls_redact(value)
        return atoms
