"""Plain Django views: health check and the benchmark's raw-insert ceiling."""

import json
import uuid

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from notifications.models import Notification


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database answers a query, else 503."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        return JsonResponse({"status": "unavailable", "database": "down"}, status=503)
    return JsonResponse({"status": "ok", "database": "up"})


@csrf_exempt
@require_POST
def bench_raw_insert(request: HttpRequest) -> JsonResponse:
    """The ingest benchmark's ceiling: the same row inserted with no auth and no validation.

    Mounted only when OUTBOX_BENCH_RAW_VIEW is true (never in production).
    """
    if not settings.OUTBOX_BENCH_RAW_VIEW:
        raise Http404
    data = json.loads(request.body)
    now = timezone.now()
    notification = Notification.objects.create(
        notification_id=uuid.UUID(data["notification_id"]),
        type=data.get("type", "email"),
        list_name=data["list_name"],
        subject=data["subject"],
        body=data["body"],
        type_data=data.get("type_data", {}),
        source_site_id="bench",
        site_enqueued_at=now,
        created_at=now,
        next_attempt_at=now,
        fingerprint="",
    )
    return JsonResponse({"notification_id": str(notification.notification_id)}, status=201)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """JSON for API clients, the styled page (templates/) for people."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "detail": "No such resource."}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """JSON for API clients, the styled 403 page (templates/403.html) for people."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "forbidden", "detail": "Not allowed."}, status=403)
    from django.views.defaults import permission_denied as django_permission_denied

    return django_permission_denied(request, exception)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """JSON for API clients (e.g. a Host header not in ALLOWED_HOSTS), the styled page for people."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": "bad_request", "detail": "Bad request (e.g. a Host not served here)."}, status=400
        )
    from django.views.defaults import bad_request as django_bad_request

    return django_bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """JSON for API clients, the styled page (templates/) for people."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "server_error", "detail": "Internal error; it has been logged."}, status=500)
    from django.views.defaults import server_error as django_server_error

    return django_server_error(request)
