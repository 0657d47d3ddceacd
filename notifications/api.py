"""The site-facing REST API (DESIGN §3). Views parse, call one ingest function, render."""

import django_filters
from django import forms
from django.conf import settings
from django.db import InterfaceError, OperationalError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from notifications.adapters import TYPE_CHOICES
from notifications.ingest import notification_status_record, notification_validate, notifications_ingest
from notifications.kpis import kpis_compute
from notifications.models import Notification

# --- errors ---------------------------------------------------------------------------------

DB_UNAVAILABLE = {"error": "database_unavailable", "detail": "The database is unavailable; retry later."}


def exception_handler(exc, context):
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


def _invalid(errors):
    return Response({"error": "invalid", "detail": "Invalid input.", "errors": errors}, status=400)


IDEMPOTENCY_CONFLICT = {
    "error": "idempotency_conflict",
    "detail": "A notification with this id already exists with different content or from another site.",
}

# --- schema-only serializers (the API validates with notifications.ingest) -------------------


class NotificationInSerializer(serializers.Serializer):
    """Optional fields may be omitted or null (both mean "use the default")."""

    notification_id = serializers.UUIDField()
    type = serializers.ChoiceField(choices=TYPE_CHOICES, default="email", required=False, allow_null=True)
    list_name = serializers.CharField(max_length=200)
    subject = serializers.CharField(max_length=255, allow_blank=True)
    body = serializers.CharField(max_length=100_000, allow_blank=True)
    type_data = serializers.DictField(required=False, allow_null=True)
    source_instance_id = serializers.CharField(max_length=200, required=False, allow_blank=True, allow_null=True)
    source_script = serializers.CharField(max_length=200, required=False, allow_blank=True, allow_null=True)
    site_enqueued_at = serializers.DateTimeField(required=False, allow_null=True)
    source_site_id = serializers.CharField(max_length=64, required=False, allow_null=True)


class StatusRecordSerializer(serializers.Serializer):
    notification_id = serializers.UUIDField()
    type = serializers.CharField()
    list_name = serializers.CharField()
    status = serializers.ChoiceField(choices=Notification.Status.choices)
    retry_count = serializers.IntegerField()
    last_error = serializers.CharField(allow_blank=True)
    site_enqueued_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, instance):
        return notification_status_record(instance)


ErrorSerializer = inline_serializer(
    "Error",
    {"error": serializers.CharField(), "detail": serializers.CharField(),
     "errors": serializers.DictField(required=False)},
)  # fmt: skip
class BatchItemResultSerializer(serializers.Serializer):
    notification_id = serializers.CharField(allow_null=True)
    result = serializers.ChoiceField(choices=["created", "replayed", "rejected"])
    status = StatusRecordSerializer(required=False)
    errors = serializers.DictField(required=False)
    error = serializers.CharField(required=False)
ERROR_RESPONSES = {
    400: OpenApiResponse(ErrorSerializer, description="Invalid input, per field"),
    401: OpenApiResponse(ErrorSerializer, description="Missing, invalid, revoked or expired key"),
    403: OpenApiResponse(ErrorSerializer, description="Site deactivated or source_site_id mismatch"),
    413: OpenApiResponse(ErrorSerializer, description="Body larger than the configured limit"),
    415: OpenApiResponse(ErrorSerializer, description="Not application/json"),
    429: OpenApiResponse(ErrorSerializer, description="Site over its rate limit; see Retry-After"),
    503: OpenApiResponse(ErrorSerializer, description="Database unavailable"),
}

# --- views ----------------------------------------------------------------------------------


class StrictFilterForm(forms.Form):
    """A filter given with an empty value is a mistake to report, not "no filter"."""

    def clean(self):
        cleaned = super().clean()
        for name in self.fields:
            if name in self.data and self.data.get(name) == "":
                self.add_error(name, "Must not be empty.")
        return cleaned


class NotificationFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Notification.Status.choices)
    type = django_filters.ChoiceFilter(choices=TYPE_CHOICES)
    list_name = django_filters.CharFilter()
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Notification
        fields = ["status", "type", "list_name", "created_after", "created_before"]
        form = StrictFilterForm


class NewestFirstCursorPagination(CursorPagination):
    ordering = "-created_at"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        """Like DRF's, but a bad page_size is a 400, not silently the default."""
        values = request.query_params.getlist(self.page_size_query_param)
        if not values:
            return self.page_size
        if len(values) > 1 or not values[0].isdigit() or not 1 <= int(values[0]) <= self.max_page_size:
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"Must be one integer from 1 to {self.max_page_size}."]}
            )
        return int(values[0])


class NotificationCollectionView(ListAPIView):
    """POST one notification; GET the calling site's own notifications."""

    serializer_class = StatusRecordSerializer
    filterset_class = NotificationFilter
    pagination_class = NewestFirstCursorPagination
    filter_backends = [django_filters.rest_framework.DjangoFilterBackend]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no site
            return Notification.objects.none()
        return Notification.objects.filter(source_site_id=self.request.user.site_id)

    @extend_schema(
        responses={
            200: StatusRecordSerializer(many=True),
            404: OpenApiResponse(ErrorSerializer, description="Invalid cursor"),
            **{code: ERROR_RESPONSES[code] for code in (400, 401, 403, 429, 503)},
        }
    )
    def get(self, request, *args, **kwargs):
        """The calling site's notifications, newest first, filtered and cursor-paginated."""
        known = set(NotificationFilter.base_filters) | {"cursor", "page_size"}
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            return _invalid({name[:100]: ["Unknown query parameter."] for name in unknown})
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=NotificationInSerializer,
        responses={
            201: OpenApiResponse(StatusRecordSerializer, description="Created and committed"),
            200: OpenApiResponse(StatusRecordSerializer, description="Replay of the same content; nothing changed"),
            422: OpenApiResponse(ErrorSerializer, description="idempotency_conflict"),
            **ERROR_RESPONSES,
        },
    )
    def post(self, request):
        data = request.data
        item, errors = notification_validate(data)
        if errors:
            return _invalid(errors)
        site = request.user
        if item.source_site_id is not None and item.source_site_id != site.site_id:
            raise exceptions.PermissionDenied(
                "source_site_id does not match the site of the API key.", code="site_mismatch"
            )
        (outcome,) = notifications_ingest(site_id=site.site_id, inputs=[item])
        if outcome.result == "conflict":
            return Response(IDEMPOTENCY_CONFLICT, status=422)
        code = status.HTTP_201_CREATED if outcome.result == "created" else status.HTTP_200_OK
        return Response(notification_status_record(outcome.notification), status=code)


class NotificationBatchView(APIView):
    @extend_schema(
        # Items are validated one by one and rejected individually (DESIGN §3), so the
        # envelope accepts any JSON value per item; each should be a NotificationIn.
        request=inline_serializer(
            "BatchIn",
            {"notifications": serializers.ListField(
                child=serializers.JSONField(), help_text="Each item as the body of POST /api/v1/notifications/.")},
        ),
        responses={
            200: inline_serializer("BatchOut", {"results": BatchItemResultSerializer(many=True)}),
            **ERROR_RESPONSES,
        },
    )
    def post(self, request):
        """Ingest up to OUTBOX_BATCH_MAX_ITEMS notifications; one result per item, in order."""
        data = request.data
        items = data.get("notifications") if isinstance(data, dict) else None
        if not isinstance(items, list):
            return _invalid({"notifications": ["Must be a list of notification objects."]})
        limit = settings.OUTBOX_BATCH_MAX_ITEMS
        if len(items) > limit:
            return _invalid({"notifications": [f"At most {limit} notifications per batch (got {len(items)})."]})
        if set(data) - {"notifications"}:
            return _invalid({name: ["Unknown field."] for name in sorted(set(data) - {"notifications"})})

        site_id = request.user.site_id
        results = [None] * len(items)
        valid, positions = [], []
        for index, raw in enumerate(items):
            item, errors = notification_validate(raw)
            if not errors and item.source_site_id is not None and item.source_site_id != site_id:
                errors = {"source_site_id": ["Does not match the site of the API key."]}
            if errors:
                raw_id = raw.get("notification_id") if isinstance(raw, dict) else None
                results[index] = {
                    "notification_id": raw_id if isinstance(raw_id, str) else None,
                    "result": "rejected",
                    "errors": errors,
                }
            else:
                valid.append(item)
                positions.append(index)
        outcomes = notifications_ingest(site_id=site_id, inputs=valid)
        for index, outcome in zip(positions, outcomes):
            nid = str(outcome.notification_id)
            if outcome.result == "conflict":
                results[index] = {
                    "notification_id": nid,
                    "result": "rejected",
                    "errors": {"notification_id": [IDEMPOTENCY_CONFLICT["detail"]]},
                    "error": "idempotency_conflict",
                }
            else:
                results[index] = {
                    "notification_id": nid,
                    "result": outcome.result,
                    "status": notification_status_record(outcome.notification),
                }
        return Response({"results": results})


class NotificationDetailView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        responses={
            200: StatusRecordSerializer,
            404: OpenApiResponse(ErrorSerializer, description="No such notification for this site"),
            **{code: ERROR_RESPONSES[code] for code in (401, 403, 429, 503)},
        },
    )
    def get(self, request, notification_id):
        """The status record of one of the calling site's notifications."""
        notification = (
            Notification.objects.filter(pk=notification_id, source_site_id=request.user.site_id).first()
        )
        if notification is None:
            raise exceptions.NotFound("No notification with this id for this site.", code="not_found")
        return Response(notification_status_record(notification))



# --- KPIs (staff only) ------------------------------------------------------------------------


class KpiView(APIView):
    """Delivery KPIs, global and per source site (DESIGN §6). Staff only: Basic first, so an
    anonymous caller gets 401 with a WWW-Authenticate challenge; a non-staff user gets 403."""

    authentication_classes = [BasicAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    throttle_classes = []

    @extend_schema(
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="KPIs: global, per_site, computed_at"),
            401: OpenApiResponse(ErrorSerializer, description="Not authenticated"),
            403: OpenApiResponse(ErrorSerializer, description="Not staff"),
            503: ERROR_RESPONSES[503],
        }
    )
    def get(self, request):
        return Response(kpis_compute())
