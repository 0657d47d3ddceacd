"""Guards that must act before Django or DRF read a request's body or query.

One rule, :func:`request_refusal`, applied at two levels:

* :class:`AsgiRequestGuard` wraps the ASGI application the web server runs. Django's ASGI
  handler reads a whole body into memory (or a temporary file) before any middleware runs, so
  an over-limit or unframed body is refused here, before it is buffered.
* :class:`ApiGuardMiddleware` is Django middleware: the same rule for the WSGI entry point (and
  the test client), and the 503 (never 500) answer when the database cannot be reached.
"""

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

# An over-limit body up to this many times OUTBOX_MAX_BODY_BYTES is read and thrown away before
# the 413 is sent: a server that answers and closes while the client is still sending makes the
# client's kernel see a reset ("broken pipe"), and the client never reads the 413. Beyond this
# bound the server answers without reading and the client may see the connection reset.
DISCARD_FACTOR = 8
DISCARD_CHUNK = 64 * 1024

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Refusal:
    """Why a request is answered before the application sees it: the HTTP status, the error
    code and sentence of the API's error shape, and how many body bytes to read and drop first
    (0: none)."""

    status: int
    error: str
    detail: str
    discard: int = 0


def request_refusal(
    *, path: str, query_string: str, content_length: str | None, transfer_encoding: str | None
) -> Refusal | None:
    """The refusal of a request with these properties, or None to let it through.

    * a query string with a NUL character (``%00``): 400 — no parameter may hold one, and the
      database refuses them in every text comparison;
    * a body without a Content-Length (``Transfer-Encoding: chunked``): 411 — the body's size
      must be known before it is read, and Django would read such a body as empty;
    * a malformed Content-Length: 400;
    * a body over OUTBOX_MAX_BODY_BYTES: 413.

    A refused body up to DISCARD_FACTOR times the limit is read and dropped first.
    """
    limit = settings.OUTBOX_MAX_BODY_BYTES
    if "%00" in query_string:
        return Refusal(400, "invalid", "The query string must not contain NUL characters (%00).")
    if content_length is None or content_length == "":
        if transfer_encoding:
            return Refusal(
                411,
                "length_required",
                "Send the body with a Content-Length header; chunked request bodies are not accepted.",
                discard=DISCARD_FACTOR * limit,
            )
        return None
    if not content_length.isdigit():
        return Refusal(400, "invalid", "Malformed Content-Length.")
    length = int(content_length)
    if length > limit:
        return Refusal(
            413,
            "request_too_large",
            f"Request body exceeds {limit} bytes.",
            discard=length if length <= DISCARD_FACTOR * limit else 0,
        )
    return None


def refusal_body(refusal: Refusal, *, path: str) -> tuple[str, bytes]:
    """The content type and body of a refusal: the API's JSON error shape on /api/, one line of
    text elsewhere."""
    if path.startswith("/api/"):
        return "application/json", JsonResponse({"error": refusal.error, "detail": refusal.detail}).content
    return "text/plain; charset=utf-8", refusal.detail.encode()


class AsgiRequestGuard:
    """ASGI wrapper applying :func:`request_refusal` before the body is read or buffered."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.lower(), value)
        length = headers.get(b"content-length")
        encoding = headers.get(b"transfer-encoding")
        refusal = request_refusal(
            path=scope["path"],
            query_string=scope.get("query_string", b"").decode("latin-1"),
            content_length=None if length is None else length.decode("latin-1").strip(),
            transfer_encoding=None if encoding is None else encoding.decode("latin-1"),
        )
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if refusal.discard:
            await _discard_body(receive, limit=refusal.discard)
        content_type, body = refusal_body(refusal, path=scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": refusal.status,
                "headers": [
                    (b"content-type", content_type.encode()),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of a body we did not read must not be taken for the next request.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _discard_body(receive: Receive, *, limit: int) -> None:
    """Read and drop at most ``limit`` body bytes (fewer if the body ends or the client goes)."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class ApiGuardMiddleware:
    """:func:`request_refusal` for the WSGI entry point, and 503 (never 500) when the database
    cannot be reached outside DRF's own handling."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refusal = request_refusal(
            path=request.path,
            query_string=request.META.get("QUERY_STRING", ""),
            content_length=request.META.get("CONTENT_LENGTH"),
            transfer_encoding=request.META.get("HTTP_TRANSFER_ENCODING"),
        )
        if refusal is not None:
            if refusal.discard:
                request_body_discard(request)
            content_type, body = refusal_body(refusal, path=request.path)
            response = HttpResponse(body, status=refusal.status, content_type=content_type)
            if refusal.discard or refusal.status in (411, 413):
                response["Connection"] = "close"
            return response
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, (OperationalError, InterfaceError)):
            return JsonResponse(
                {"error": "database_unavailable", "detail": "The database is unavailable; retry later."}, status=503
            )
        return None


def request_body_discard(request: HttpRequest) -> None:
    """Read the request body (at most Content-Length bytes) in chunks and drop it. A client that
    goes away meanwhile ends the reading; the answer then reaches no one anyway."""
    with contextlib.suppress(OSError):
        while request.read(DISCARD_CHUNK):
            pass


class ContentSecurityPolicyMiddleware:
    """Adds the Content-Security-Policy header (settings.OUTBOX_CONTENT_SECURITY_POLICY) to every
    response that has none: the console loads scripts, styles and images from this server only
    (inline style attributes allowed, inline scripts not), and no page may be framed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.OUTBOX_CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
