"""The shape of every API error (docs/api.md), shared by the notification and the site APIs:
``{"error": code, "detail": text[, "errors": {field: [...]}]}``, the DRF exception handler
that writes it, and its OpenAPI description."""

from typing import Any

from django.db import InterfaceError, OperationalError
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

DB_UNAVAILABLE = {"error": "database_unavailable", "detail": "The database is unavailable; retry later."}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF errors as ``{"error": code, "detail": text[, "errors": {field: [..]}]}``.

    A database that cannot be reached answers 503, never 500: the client must retry, and
    nothing was acknowledged.
    """
    if isinstance(exc, (OperationalError, InterfaceError)):
        return Response(DB_UNAVAILABLE, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"error": "invalid", "detail": "Invalid input.", "errors": detail}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        response.data = {"error": code, "detail": str(exc.detail)}
    return response


ErrorSerializer = inline_serializer(
    "Error",
    {
        "error": serializers.CharField(),
        "detail": serializers.CharField(),
        "errors": serializers.DictField(required=False),
    },
)

ERROR_RESPONSES = {
    400: OpenApiResponse(ErrorSerializer, description="Invalid input, per field"),
    401: OpenApiResponse(ErrorSerializer, description="Missing, invalid, revoked or expired key"),
    403: OpenApiResponse(ErrorSerializer, description="Site deactivated or source_site_id mismatch"),
    413: OpenApiResponse(ErrorSerializer, description="Body larger than the configured limit"),
    415: OpenApiResponse(ErrorSerializer, description="Not application/json"),
    429: OpenApiResponse(ErrorSerializer, description="Site over its rate limit; see Retry-After"),
    503: OpenApiResponse(ErrorSerializer, description="Database unavailable"),
}
