"""The two paths machines probe — ``GET /healthz`` (load balancers) and ``GET /metrics``
(Prometheus) — answered whatever ``Host`` they send.

A load balancer or a Prometheus server addresses a web process directly and sends its address
(``10.0.0.5:8000``) as ``Host``, which is not one of ``ALLOWED_HOSTS``. Django checks the Host
only where something asks for it (``request.get_host()``, first in ``CommonMiddleware``), and
answers 400 with a ``DisallowedHost`` traceback in the log. :class:`ProbeMiddleware`, first in
``MIDDLEWARE``, serves exactly these two paths itself, before anything asks for the Host;
every other path goes down the usual chain and keeps refusing a Host not in ``ALLOWED_HOSTS``.
Neither view reads the Host, and ``/metrics`` keeps its own rule (loopback, or the bearer
token; notifications.metrics).
"""

from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

from notifications import metrics, views

PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {
    "/healthz": views.healthz,
    "/metrics": metrics.metrics_view,
}


class ProbeMiddleware:
    """Serves the paths of :data:`PROBES` without the Host check; passes everything else on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        view = PROBES.get(request.path_info)
        if view is None:
            return self.get_response(request)
        try:
            response = view(request)
        except (OperationalError, InterfaceError):
            # /metrics reads the database gauges; the middleware that turns this into a 503
            # elsewhere (ApiGuardMiddleware) is not on this path.
            response = JsonResponse(
                {"error": "database_unavailable", "detail": "The database is unavailable; retry later."}, status=503
            )
        # The later middleware, which adds the security headers, does not run for a probe: the
        # two that matter for a response that is not a page.
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        if settings.OUTBOX_CONTENT_SECURITY_POLICY:
            response.headers.setdefault("Content-Security-Policy", settings.OUTBOX_CONTENT_SECURITY_POLICY)
        return response
