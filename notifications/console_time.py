"""The console's time zone: every console page shows timestamps with seconds and the zone, in
UTC or in the zone the operator chose (their browser's), kept in a cookie.

The zone is activated for console (admin) requests only; the API always speaks UTC.
"""

import zoneinfo
from collections.abc import Callable
from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone

COOKIE = "outbox_tz"
COOKIE_MAX_AGE = 365 * 24 * 3600


def zone_parse(name: str) -> zoneinfo.ZoneInfo | None:
    """The IANA zone ``name`` ("Europe/Zurich", "UTC"), or None when there is no such zone."""
    name = (name or "").strip()
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


def console_time(value: datetime | None) -> str:
    """``value`` as the console shows every timestamp: "2026-11-23 10:13:08 UTC", in the
    active zone; "—" for None."""
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or 'UTC'}"


def console_time_short(value: datetime | str | None) -> str:
    """``value`` (a datetime or an ISO string) as a 24-hour "02:41" in the active zone, with
    the date in front when it is not today there; "—" for None."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    today = timezone.localtime(timezone.now()).date() if timezone.is_aware(value) else local.date()
    return f"{local:%H:%M}" if local.date() == today else f"{local:%Y-%m-%d %H:%M}"


def zone_label() -> str:
    """The active zone's name, e.g. "UTC" or "Europe/Zurich"."""
    return str(timezone.get_current_timezone_name())


class ConsoleTimezoneMiddleware:
    """Activates the zone stored in the ``outbox_tz`` cookie for console requests."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.prefix: str | None = None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self.prefix is None:
            self.prefix = reverse("admin:index")
        zone = zone_parse(request.COOKIES.get(COOKIE, "")) if request.path.startswith(self.prefix) else None
        if zone is None:
            return self.get_response(request)
        with timezone.override(zone):
            return self.get_response(request)
