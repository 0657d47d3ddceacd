"""Guards for the API that must act before Django or DRF read the request body."""

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse


class ApiGuardMiddleware:
    """Answer 413 for API bodies over OUTBOX_MAX_BODY_BYTES, and 503 (never 500) when the
    database cannot be reached outside DRF's own handling."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"error": "invalid", "detail": "Malformed Content-Length."}, status=400)
            limit = settings.OUTBOX_MAX_BODY_BYTES
            if length > limit:
                return JsonResponse(
                    {"error": "request_too_large", "detail": f"Request body exceeds {limit} bytes."}, status=413
                )
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, (OperationalError, InterfaceError)):
            return JsonResponse(
                {"error": "database_unavailable", "detail": "The database is unavailable; retry later."}, status=503
            )
        return None
