"""Template helpers that bring the sites' state into other console pages."""

from typing import Any

from django import template
from django.http import HttpRequest

from notifications.clock import database_now
from sites.models import Site, SiteParkedNotification, Watchdog
from sites.services import site_is_silent

register = template.Library()

PARKED_CAP = 10_000


@register.simple_tag(takes_context=True)
def sites_console_summary(context: dict[str, Any]) -> dict[str, Any] | None:
    """``{"silent": [site_id, …], "parked_at_sites": n, "backlog": n, "can_view_sites": bool,
    "silent_watchdogs": n or None}`` for the outbox page (``silent_watchdogs`` None when the user
    may not see watchdogs), or None when the user may see neither sites nor site-parked rows."""
    request: HttpRequest | None = context.get("request")
    if request is None:
        return None
    user = request.user
    if not (user.has_perm("sites.view_site") or user.has_perm("sites.view_siteparkednotification")):
        return None
    now = database_now()
    silent, backlog = [], 0
    for site_id, received_at, buffered in Site.objects.filter(active=True).values_list(
        "site_id", "heartbeat__received_at", "heartbeat__buffered"
    ):
        if site_is_silent(last_heartbeat_at=received_at, now=now):
            silent.append(site_id)
        backlog += buffered or 0
    # Bounded like every count on the outbox page: the figure is exact up to the cap.
    parked = SiteParkedNotification.objects.filter(state=SiteParkedNotification.State.PARKED)[: PARKED_CAP + 1].count()
    shown = f"{PARKED_CAP:,}+" if parked > PARKED_CAP else str(parked)
    watchdogs = None
    if user.has_perm("sites.view_watchdog"):
        # Bounded like every count on the outbox page (a handful in practice).
        silent_watchdogs = Watchdog.objects.filter(state=Watchdog.State.SILENT, site__active=True)
        watchdogs = silent_watchdogs[: PARKED_CAP + 1].count()
    return {
        "silent": silent,
        "parked_at_sites": shown,
        "backlog": backlog,
        "can_view_sites": user.has_perm("sites.view_site"),
        "silent_watchdogs": watchdogs,
    }
