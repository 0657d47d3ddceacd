"""The web server's log: gunicorn's, with secrets in query strings redacted."""

import re
from typing import Any

from gunicorn.glogging import Logger

# A query parameter whose name suggests a credential; its value is never logged.
SECRET_PARAMETER = re.compile(r"(?i)((?:^|[?&])[^=&]*(?:key|token|secret|passw|auth|signature)[^=&\s]*=)[^&\s]*")
REDACTED = "[redacted]"


def query_redact(text: str) -> str:
    """``text`` (a query string or a URI) with the values of credential-like parameters
    replaced by ``[redacted]``."""
    return SECRET_PARAMETER.sub(lambda match: match.group(1) + REDACTED, text)


class RedactingLogger(Logger):
    """gunicorn's logger; the request line and query string atoms of the access log are
    redacted with :func:`query_redact`."""

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> dict[str, Any]:
        atoms = super().atoms(resp, req, environ, request_time)
        for name in ("r", "q", "{raw_uri}e", "{query_string}e"):
            if isinstance(atoms.get(name), str):
                atoms[name] = query_redact(atoms[name])
        return atoms
