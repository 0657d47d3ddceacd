"""The site API's own endpoints (heartbeats, parked reports, command acknowledgements, watchdog
pings), mounted under /api/v1/sites/ by outbox_project/urls.py."""

from django.urls import path

from sites import api

urlpatterns = [
    path("heartbeat/", api.HeartbeatView.as_view(), name="site-heartbeat"),
    path("parked/", api.ParkedReportView.as_view(), name="site-parked-report"),
    path("commands/<uuid:command_id>/ack/", api.CommandAckView.as_view(), name="site-command-ack"),
    path("watchdogs/", api.WatchdogPingView.as_view(), name="site-watchdog-ping"),
]
