from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from notifications import ack_page, api, metrics, providers, silences_api, views

urlpatterns = [
    path("api/v1/notifications/", api.NotificationCollectionView.as_view(), name="notification-list"),
    path("api/v1/notifications/batch/", api.NotificationBatchView.as_view(), name="notification-batch"),
    path(
        "api/v1/notifications/<uuid:notification_id>/",
        api.NotificationDetailView.as_view(),
        name="notification-detail",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/retry/",
        api.NotificationRetryView.as_view(),
        name="notification-retry",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/discard/",
        api.NotificationDiscardView.as_view(),
        name="notification-discard",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/requeue/",
        api.NotificationRequeueView.as_view(),
        name="notification-requeue",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/ack/",
        api.NotificationAcknowledgeView.as_view(),
        name="notification-ack",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/clear/",
        api.NotificationClearView.as_view(),
        name="notification-clear",
    ),
    path(
        "api/v1/notifications/<uuid:notification_id>/release/",
        api.NotificationReleaseView.as_view(),
        name="notification-release",
    ),
    path(
        "api/v1/providers/twilio/status/",
        providers.TwilioStatusCallbackView.as_view(),
        name="provider-twilio-status",
    ),
    path(
        "api/v1/providers/twilio/inbound/",
        providers.TwilioInboundView.as_view(),
        name="provider-twilio-inbound",
    ),
    path("api/v1/kpis/", api.KpiView.as_view(), name="kpis"),
    path("api/v1/silences/", silences_api.SilenceCollectionView.as_view(), name="silence-list"),
    path("api/v1/silences/<int:silence_id>/", silences_api.SilenceDetailView.as_view(), name="silence-detail"),
    path("api/v1/sites/", include("sites.urls")),
    path(
        "api/v1/schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
        name="schema",
    ),
    path("ack/<str:token>/", ack_page.ack_page, name="ack-page"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
]

if settings.OUTBOX_BENCH_RAW_VIEW:
    urlpatterns.append(path("bench/raw-insert/", views.bench_raw_insert))

handler400 = "notifications.views.bad_request"
handler403 = "notifications.views.permission_denied"
handler404 = "notifications.views.not_found"
handler500 = "notifications.views.server_error"
