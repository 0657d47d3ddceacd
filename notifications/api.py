"""The site-facing REST API (docs/api.md). Views parse, call one ingest function, render.

The request schema of a notification is generated from ingest's declarations (fields, required,
limits, types), so the published OpenAPI description and validation cannot drift apart.
"""

from datetime import UTC, datetime
from typing import Any, cast

import django_filters
from django import forms
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications import acknowledgement
from notifications.api_errors import ERROR_RESPONSES, ErrorSerializer
from notifications.ingest import (
    ACCEPTED_FIELDS,
    DEFAULT_TYPE,
    INVALID,
    MAX_TYPE_DATA_BYTES,
    SITE_MISMATCH,
    TEXT_RULES,
    NotificationInput,
    Rejection,
    notification_status_record,
    notification_validate,
    notifications_ingest,
    rejection_invalid,
)
from notifications.kpis import kpis_compute
from notifications.models import PRIORITY_NAMES, Notification
from notifications.operations import notification_act
from notifications.suppression import flood_report
from notifications.vocabulary import TYPE_CHOICES, TargetOutcome
from sites.authentication import IsActiveSite, SiteKeyAuthentication, StaffKeyAuthentication
from sites.models import Site
from sites.services import site_kpis_add
from sites.throttling import site_notifications_throttle

# --- errors ---------------------------------------------------------------------------------

# A rejected request answers with its code, sentence and field errors; the status by code.
REJECTION_STATUS = {INVALID: status.HTTP_400_BAD_REQUEST, SITE_MISMATCH: status.HTTP_403_FORBIDDEN}


def _rejected(rejection: Rejection) -> Response:
    body = {"error": rejection.error, "detail": rejection.detail, "errors": rejection.errors}
    return Response(body, status=REJECTION_STATUS[rejection.error])


def _invalid(errors: dict[str, list[str]]) -> Response:
    return _rejected(rejection_invalid(errors))


def _site(request: Request) -> Site:
    """The calling site (IsActiveSite, the default permission, has made sure there is one)."""
    return cast(Site, request.user)


IDEMPOTENCY_CONFLICT = {
    "error": "idempotency_conflict",
    "detail": "A notification with this id already exists with different content or from another site.",
}

# --- schema-only serializers (the API validates with notifications.ingest) -------------------


def _notification_in_fields() -> dict[str, serializers.Field]:
    """The request schema of one notification, field by field from ingest's declarations, in
    their order; an optional field may be omitted or null (both mean "use the default")."""
    text_rules = {rule.name: rule for rule in TEXT_RULES}
    fields: dict[str, serializers.Field] = {}
    for name in (f for f in NotificationInput.__dataclass_fields__ if f in ACCEPTED_FIELDS):
        rule = text_rules.get(name)
        if rule is not None:
            fields[name] = serializers.CharField(
                max_length=rule.max_length,
                required=rule.required,
                allow_null=not rule.required,
                allow_blank=rule.blank,
                help_text="One line (no CR or LF)." if rule.single_line else "",
            )
        elif name == "notification_id":
            fields[name] = serializers.UUIDField(help_text="The idempotency key, generated at the site.")
        elif name == "type":
            fields[name] = serializers.ChoiceField(
                choices=TYPE_CHOICES, default=DEFAULT_TYPE, required=False, allow_null=True
            )
        elif name == "type_data":
            fields[name] = serializers.DictField(
                required=False,
                allow_null=True,
                help_text=f"A JSON object of at most {MAX_TYPE_DATA_BYTES} bytes (for email not counting attachment "
                "contents). Email reads html, reply_to, cc, priority and attachments from it (docs/api.md).",
            )
        elif name == "site_enqueued_at":
            fields[name] = serializers.DateTimeField(
                required=False, allow_null=True, help_text="With a timezone. Default: the ingest time."
            )
        elif name == "priority":
            fields[name] = serializers.ChoiceField(
                choices=PRIORITY_NAMES,
                default="normal",
                required=False,
                allow_null=True,
                help_text="Dispatch takes higher priorities first; high and critical also mark an email important. "
                "Critical notifications draw on a rate budget of their own (docs/api.md).",
            )
        elif name == "delivered_locally_at":
            fields[name] = serializers.DateTimeField(
                required=False,
                allow_null=True,
                help_text="When the site delivered it through its own local relay (the agent's fallback), with a "
                "timezone. Not part of the idempotency fingerprint: a replay may add it to a row that is not yet "
                "Delivered. Central then does not send it unless the list sets resend_after_local_delivery.",
            )
        else:
            raise ImproperlyConfigured(f"the API does not describe the submitted field {name!r}")
    return fields


NotificationInSerializer = inline_serializer("NotificationIn", _notification_in_fields())


class TargetSerializer(serializers.Serializer):
    channel = serializers.CharField()
    target = serializers.CharField(
        help_text="For a site key, masked: an email address as o***@example.com, a phone number as +49***456, a "
        "Teams or webhook URL as its host, an Apprise URL as its scheme (and host). Staff see the stored form "
        "(secrets masked)."
    )
    outcome = serializers.ChoiceField(choices=TargetOutcome.choices)
    provider_status = serializers.CharField(allow_null=True)
    provider_status_at = serializers.DateTimeField(required=False)
    provider_error_code = serializers.CharField(
        required=False,
        help_text="SMS: Twilio's error code for this number, when it has one (from the status callback's "
        "ErrorCode, e.g. 30003, or the refusal of the message, e.g. 21211).",
    )


class StatusRecordSerializer(serializers.Serializer):
    notification_id = serializers.UUIDField()
    type = serializers.CharField()
    list_name = serializers.CharField()
    status = serializers.ChoiceField(choices=Notification.Status.choices)
    priority = serializers.ChoiceField(choices=PRIORITY_NAMES)
    retry_count = serializers.IntegerField()
    last_error = serializers.CharField(
        allow_blank=True,
        help_text="The latest failure in words. Never a receiver's response body; for a site key, addresses, "
        "numbers and URLs in it are masked as targets are.",
    )
    site_enqueued_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    delivered_locally_at = serializers.DateTimeField(
        allow_null=True, help_text="When the site delivered it through its own local relay (the site's clock)."
    )
    suppressed_by = serializers.CharField(
        allow_blank=True,
        help_text="Why it was never sent: duplicate:<notification id>, silence:<silence id> (silence:mw<id>: a "
        "maintenance window) or digest:<digest's notification id>; blank when it was not suppressed. Kept when an "
        "operator delivers it anyway.",
    )
    dedup_key = serializers.CharField(allow_blank=True, help_text="The key duplicates are recognised by.")
    occurrences = serializers.IntegerField(
        help_text="How many times its alarm was raised while it stood for its duplicates, itself included (1: no "
        "duplicate)."
    )
    last_occurrence_at = serializers.DateTimeField(allow_null=True, help_text="When its last duplicate came.")
    held_for_digest = serializers.DateTimeField(
        allow_null=True, help_text="Held by a flood: when its digest is made (it is then Suppressed)."
    )
    delivery_summary = serializers.CharField(
        allow_blank=True,
        help_text='Per-target outcome in words, e.g. "delivered to 118 of 120, 2 refused (550)"; empty until an '
        "attempt recorded outcomes.",
    )
    target_counts = inline_serializer(
        "TargetCounts",
        {
            "total": serializers.IntegerField(),
            "delivered": serializers.IntegerField(help_text="Accepted: never sent again."),
            "refused": serializers.IntegerField(help_text="Refused for good (SMTP 5xx): never sent again."),
            "deferred": serializers.IntegerField(help_text="Refused for now or not reached: retried."),
            "ambiguous": serializers.IntegerField(
                help_text="Handed over without an answer: retried once with the same Message-ID."
            ),
            "unknown": serializers.IntegerField(help_text="Handed over twice without an answer: not retried."),
            "refused_codes": serializers.ListField(child=serializers.IntegerField()),
        },
        allow_null=True,
        help_text="Targets by outcome; null until an attempt recorded outcomes.",
    )
    targets = TargetSerializer(many=True, help_text="Per target: its outcome and, for SMS, the provider's status.")
    asks_ack = serializers.BooleanField(
        help_text="Whether it asks for acknowledgement (decided at ingest from the list's ack_required_from)."
    )
    acknowledged_at = serializers.DateTimeField(allow_null=True, help_text="Null until someone acknowledges it.")
    acknowledged_by = serializers.CharField(
        allow_null=True,
        help_text="Who acknowledged it. For a site key masked as targets are (an address o***@example.com, a "
        "number +49***456, a name J***), except what the site itself said (via site).",
    )
    acknowledged_via = serializers.ChoiceField(
        choices=["link", "sms", "teams", "console", "api", "site"], allow_null=True
    )
    acknowledged_note = serializers.CharField(allow_null=True)
    cleared_at = serializers.DateTimeField(
        allow_null=True, help_text="When the site said the alarm returned to normal; null until then."
    )
    cleared_note = serializers.CharField(allow_null=True)
    escalations = inline_serializer(
        "EscalationStep",
        {
            "step": serializers.IntegerField(),
            "notification_id": serializers.UUIDField(),
            "list_name": serializers.CharField(),
            "type": serializers.CharField(),
            "status": serializers.ChoiceField(choices=Notification.Status.choices),
            "created_at": serializers.DateTimeField(),
        },
        many=True,
        help_text="The escalation steps taken so far (docs/escalation.md): each child notification, in step "
        "order; empty for a notification that has not escalated.",
    )

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return notification_status_record(instance)


# Declared as a mapping: a Serializer subclass cannot have a field named "errors".
BATCH_ITEM_RESULT_FIELDS: dict[str, serializers.Field] = {
    "notification_id": serializers.CharField(allow_null=True),
    "result": serializers.ChoiceField(choices=["created", "replayed", "rejected"]),
    "status": StatusRecordSerializer(required=False),
    "error": serializers.CharField(required=False, help_text="Why the item was rejected, as a code."),
    "errors": serializers.DictField(required=False, help_text="Why the item was rejected, per field."),
}


# --- views ----------------------------------------------------------------------------------


class StrictFilterForm(forms.Form):
    """A filter given with an empty value is a mistake to report, not "no filter"; times are
    compared in UTC."""

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        for name in self.fields:
            if name in self.data and self.data.get(name) == "":
                self.add_error(name, "Must not be empty.")
        for name, value in list(cleaned.items()):
            if isinstance(value, datetime):
                # Compared in UTC: PostgreSQL takes no offset beyond ±15:59 (ISO-8601 allows
                # ±23:59), and some instants near year 1 have no UTC time at all.
                try:
                    cleaned[name] = value.astimezone(UTC)
                except (OverflowError, ValueError):
                    self.add_error(name, "Is out of range.")
        return cleaned


class NotificationFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Notification.Status.choices)
    type = django_filters.ChoiceFilter(choices=TYPE_CHOICES)
    priority = django_filters.ChoiceFilter(choices=[(name, name) for name in PRIORITY_NAMES], method="priority_named")
    list_name = django_filters.CharFilter()
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Notification
        fields = ["status", "type", "priority", "list_name", "created_after", "created_before"]
        form = StrictFilterForm

    def priority_named(self, queryset: Any, name: str, value: str) -> Any:
        return queryset.filter(priority=Notification.Priority.named(value))


class NewestFirstCursorPagination(CursorPagination):
    ordering = "-created_at"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def decode_cursor(self, request: Request) -> Any:
        """Like DRF's, but a cursor whose position is not a creation time (a tampered cursor)
        is invalid — 404 "Invalid cursor", as for any undecodable cursor — instead of reaching
        the database; the position is compared in UTC."""
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None:
            return cursor
        try:
            position = datetime.fromisoformat(str(cursor.position))
            if position.tzinfo is None:
                raise ValueError("no timezone")
            position = position.astimezone(UTC)
        except (TypeError, ValueError, OverflowError):
            raise exceptions.NotFound(self.invalid_cursor_message) from None
        return cursor._replace(position=position.isoformat())  # type: ignore[arg-type]  # DRF's stub says int

    def get_page_size(self, request: Request) -> int:
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
    # A post draws from the notification budgets itself (per notification); a read one read token.
    site_rate_scope = {"POST": None}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation has no site
            return Notification.objects.none()
        return Notification.objects.filter(source_site_id=_site(self.request).site_id)

    @extend_schema(
        responses={
            200: StatusRecordSerializer(many=True),
            404: OpenApiResponse(ErrorSerializer, description="Invalid cursor"),
            **{code: ERROR_RESPONSES[code] for code in (400, 401, 403, 429, 503)},
        }
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
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
    def post(self, request: Request) -> Response:
        site_notifications_throttle(site=_site(request), items=[request.data])
        site_id = _site(request).site_id
        item, rejection = notification_validate(request.data, site_id=site_id)
        if rejection is not None:
            return _rejected(rejection)
        assert item is not None
        (outcome,) = notifications_ingest(site_id=site_id, inputs=[item])
        if outcome.result == "conflict":
            return Response(IDEMPOTENCY_CONFLICT, status=422)
        code = status.HTTP_201_CREATED if outcome.result == "created" else status.HTTP_200_OK
        return Response(notification_status_record(outcome.notification), status=code)


class NotificationBatchView(APIView):
    site_rate_scope = None  # draws from the notification budgets itself: one token per item

    @extend_schema(
        # Items are validated one by one and rejected individually (docs/api.md), so the
        # envelope accepts any JSON value per item; each should be a NotificationIn.
        request=inline_serializer(
            "BatchIn",
            {
                "notifications": serializers.ListField(
                    child=serializers.JSONField(), help_text="Each item as the body of POST /api/v1/notifications/."
                )
            },
        ),
        responses={
            200: inline_serializer(
                "BatchOut", {"results": inline_serializer("BatchItemResult", BATCH_ITEM_RESULT_FIELDS, many=True)}
            ),
            **ERROR_RESPONSES,
        },
    )
    def post(self, request: Request) -> Response:
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
        site_notifications_throttle(site=_site(request), items=items)

        site_id = _site(request).site_id
        results: list[dict[str, Any]] = [{} for _ in items]
        valid: list[NotificationInput] = []
        positions: list[int] = []
        for index, raw in enumerate(items):
            item, rejection = notification_validate(raw, site_id=site_id)
            if rejection is not None:
                raw_id = raw.get("notification_id") if isinstance(raw, dict) else None
                results[index] = {
                    "notification_id": raw_id if isinstance(raw_id, str) else None,
                    "result": "rejected",
                    "error": rejection.error,
                    "errors": rejection.errors,
                }
            else:
                assert item is not None
                valid.append(item)
                positions.append(index)
        outcomes = notifications_ingest(site_id=site_id, inputs=valid)
        for index, outcome in zip(positions, outcomes, strict=False):
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


class IsActiveSiteOrStaff(IsActiveSite):
    """A site key of an active site, or a staff user."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.user, Site):
            return super().has_permission(request, view)
        return bool(getattr(request.user, "is_staff", False))


class NotificationDetailView(APIView):
    """One status record: a site reads its own notifications (recipients masked), staff any
    notification as stored. The site key is tried first, so an anonymous caller is still asked
    for one (``WWW-Authenticate: Api-Key``)."""

    authentication_classes = [SiteKeyAuthentication, StaffKeyAuthentication, SessionAuthentication]
    permission_classes = [IsActiveSiteOrStaff]

    @extend_schema(
        parameters=[OpenApiParameter("notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        responses={
            200: StatusRecordSerializer,
            404: OpenApiResponse(ErrorSerializer, description="No such notification for this site"),
            **{code: ERROR_RESPONSES[code] for code in (401, 403, 429, 503)},
        },
    )
    def get(self, request: Request, notification_id: Any) -> Response:
        """The status record of one of the calling site's notifications (staff: of any)."""
        if not isinstance(request.user, Site):
            notification = Notification.objects.filter(pk=notification_id).first()
            if notification is None:
                raise exceptions.NotFound("No notification with this id.", code="not_found")
            return Response(notification_status_record(notification, staff=True))
        notification = Notification.objects.filter(pk=notification_id, source_site_id=_site(request).site_id).first()
        if notification is None:
            raise exceptions.NotFound("No notification with this id for this site.", code="not_found")
        return Response(notification_status_record(notification))


# --- KPIs (staff only) ------------------------------------------------------------------------


class KpiView(APIView):
    """Delivery KPIs, global and per source site (docs/operations.md). Staff only, with a token or
    a console session: the token first, so an anonymous caller gets 401 with a WWW-Authenticate
    challenge; a non-staff user gets 403."""

    authentication_classes = [StaffKeyAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    throttle_classes = []

    @extend_schema(
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="KPIs: global, per_site, channels, computed_at, flood (the flood report)",
            ),
            401: OpenApiResponse(ErrorSerializer, description="Not authenticated"),
            403: OpenApiResponse(ErrorSerializer, description="Not staff"),
            503: ERROR_RESPONSES[503],
        }
    )
    def get(self, request: Request) -> Response:
        # The flood report reads a day and a week of rows: here, not in the cached KPIs the
        # metrics endpoint reads.
        return Response({**site_kpis_add(kpis_compute()), "flood": flood_report()})


# --- operator actions (staff only) -------------------------------------------------------------

ACTION_PERMISSIONS = {
    "retry": "notifications.retry_notification",
    "discard": "notifications.discard_notification",
    "requeue": "notifications.requeue_notification",
    # Deliver anyway: permissioned like Retry (it sends what would not have been sent).
    "release": "notifications.retry_notification",
}
ACTION_FIELDS = {"retry": set(), "discard": {"reason"}, "requeue": set(), "release": set()}
ACTION_APPLIES = {
    "retry": "Parked (Retry) or Retrying (Retry now)",
    "discard": "Pending, Retrying or Parked",
    "requeue": "Discarded",
    "release": "Suppressed, or Pending and held for a flood digest",
}

ActionResultSerializer = inline_serializer(
    "ActionResult",
    {
        "action": serializers.CharField(help_text="retry, retry_now, discard, requeue or release"),
        "notification": StatusRecordSerializer(),
    },
)
ConflictSerializer = inline_serializer(
    "ActionConflict",
    {"error": serializers.CharField(), "detail": serializers.CharField(), "status": serializers.CharField()},
)


class NotificationActionView(APIView):
    """An operator action on one notification (docs/api.md). Staff with the action's
    permission, by token (``Authorization: Token …``) or console session (with its CSRF
    token) — never HTTP Basic."""

    authentication_classes = [StaffKeyAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    throttle_classes = []
    action = ""

    def post(self, request: Request, notification_id: Any) -> Response:
        if not request.user.has_perm(ACTION_PERMISSIONS[self.action]):
            raise exceptions.PermissionDenied(f"You may not {self.action} notifications.")
        data = request.data if request.data is not None else {}
        if not isinstance(data, dict):
            return _invalid({"non_field_errors": ["The body must be a JSON object."]})
        unknown = sorted(set(data) - ACTION_FIELDS[self.action])
        if unknown:
            return _invalid({name[:100]: ["Unknown field."] for name in unknown})
        reason = data.get("reason", "")
        if self.action == "discard" and (not isinstance(reason, str) or not reason.strip()):
            return _invalid({"reason": ["A non-blank reason is required to discard a notification."]})
        if isinstance(reason, str) and len(reason) > 2000:
            return _invalid({"reason": ["At most 2000 characters."]})
        outcome = notification_act(
            notification_id=notification_id, action=self.action, user=request.user, reason=reason
        )
        if outcome.notification is None:
            raise exceptions.NotFound("No notification with this id.", code="not_found")
        status_now = outcome.notification.status
        if outcome.applied is None:
            detail = (
                "The notification is being delivered right now (or changed meanwhile); try again in a moment."
                if outcome.busy
                else f"{self.action.capitalize()} applies to a notification that is {ACTION_APPLIES[self.action]}; "
                f"this one is {status_now}."
            )
            return Response({"error": "conflict", "detail": detail, "status": status_now}, status=409)
        record = notification_status_record(outcome.notification, staff=True)
        return Response({"action": outcome.applied, "notification": record})


def _action_schema(action: str) -> Any:
    request = inline_serializer("DiscardIn", {"reason": serializers.CharField()}) if action == "discard" else None
    return extend_schema(
        operation_id=f"notification_{action}",
        parameters=[OpenApiParameter("notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        request=request,
        responses={
            200: ActionResultSerializer,
            400: ERROR_RESPONSES[400],
            401: OpenApiResponse(ErrorSerializer, description="Not authenticated"),
            403: OpenApiResponse(ErrorSerializer, description="Not staff, or lacks the action's permission"),
            404: OpenApiResponse(ErrorSerializer, description="No such notification"),
            409: OpenApiResponse(ConflictSerializer, description="The action does not apply to the current status"),
            503: ERROR_RESPONSES[503],
        },
    )


class NotificationRetryView(NotificationActionView):
    action = "retry"

    @_action_schema("retry")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Retry a Parked notification, or retry a Retrying one now."""
        return super().post(request, notification_id)


class NotificationDiscardView(NotificationActionView):
    action = "discard"

    @_action_schema("discard")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Discard a Pending, Retrying or Parked notification, with a reason."""
        return super().post(request, notification_id)


class NotificationRequeueView(NotificationActionView):
    action = "requeue"

    @_action_schema("requeue")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Requeue a Discarded notification."""
        return super().post(request, notification_id)


# --- acknowledgement and clearing (site key or staff) --------------------------------------------

AckInSerializer = inline_serializer(
    "AckIn",
    {
        "by": serializers.CharField(
            required=False,
            max_length=200,
            help_text="Site key only: who acknowledged it at the site (an operator at the HMI). Default: the "
            "site's name. Staff: always the staff user.",
        ),
        "note": serializers.CharField(required=False, max_length=2000, allow_blank=True),
    },
)
ClearInSerializer = inline_serializer(
    "ClearIn", {"note": serializers.CharField(required=False, max_length=2000, allow_blank=True)}
)
AckResultSerializer = inline_serializer(
    "AckResult",
    {
        "changed": serializers.BooleanField(
            help_text="This request recorded it; false: it already was (the record says by whom and when)."
        ),
        "notification": StatusRecordSerializer(),
    },
)


class NotificationAckView(APIView):
    """Acknowledge (``ack``) or clear (``clear``) one notification (docs/acknowledgement.md). A site
    key acts on its own notifications only (another site's id is 404, as for the status record);
    staff may acknowledge any notification (``via: api``) but not clear one: clearing says the
    alarm returned to normal at the plant, which only the site knows."""

    authentication_classes = [SiteKeyAuthentication, StaffKeyAuthentication, SessionAuthentication]
    permission_classes = [IsActiveSiteOrStaff]
    action = "ack"

    def post(self, request: Request, notification_id: Any) -> Response:
        site = request.user if isinstance(request.user, Site) else None
        if site is None and self.action == "clear":
            raise exceptions.PermissionDenied("Only the site that raised a notification clears it (site key).")
        if site is None and not request.user.has_perm("notifications.view_notification"):
            raise exceptions.PermissionDenied("You may not see notifications.")
        data: Any = request.data if request.data is not None else {}
        errors = _ack_body_errors(
            data, fields={"note", "by"} if self.action == "ack" and site is not None else {"note"}
        )
        if errors:
            return _invalid(errors)
        note = data.get("note", "")
        if self.action == "clear":
            assert site is not None
            outcome = acknowledgement.clear(notification_id, note=note, site_id=site.site_id)
        elif site is not None:
            by = (data.get("by") or "").strip() or site.name or site.site_id
            outcome = acknowledgement.acknowledge(notification_id, via="site", by=by, note=note, site_id=site.site_id)
        else:
            outcome = acknowledgement.acknowledge(
                notification_id, via="api", by=request.user.get_username(), note=note, user=request.user
            )
        if outcome.notification is None:
            detail = "No notification with this id" + (" for this site." if site is not None else ".")
            raise exceptions.NotFound(detail, code="not_found")
        record = notification_status_record(outcome.notification, staff=site is None)
        return Response({"changed": outcome.changed, "notification": record})


def _ack_body_errors(data: Any, *, fields: set[str]) -> dict[str, list[str]]:
    """What is wrong with the body of an ack or clear request, per field ({} when nothing)."""
    if not isinstance(data, dict):
        return {"non_field_errors": ["The body must be a JSON object."]}
    errors: dict[str, list[str]] = {name[:100]: ["Unknown field."] for name in sorted(set(data) - fields)}
    for name, limit in (("note", 2000), ("by", 200)):
        value = data.get(name)
        if name in data and not isinstance(value, str):
            errors[name] = ["Must be a string."]
        elif isinstance(value, str) and len(value) > limit:
            errors[name] = [f"At most {limit} characters."]
        elif isinstance(value, str) and "\x00" in value:
            errors[name] = ["Must not contain NUL characters."]
    return errors


def _ack_schema(action: str) -> Any:
    return extend_schema(
        operation_id=f"notification_{action}",
        parameters=[OpenApiParameter("notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        request=AckInSerializer if action == "ack" else ClearInSerializer,
        responses={
            200: AckResultSerializer,
            400: ERROR_RESPONSES[400],
            401: OpenApiResponse(ErrorSerializer, description="Not authenticated"),
            403: OpenApiResponse(ErrorSerializer, description="Site deactivated, or not allowed"),
            404: OpenApiResponse(ErrorSerializer, description="No such notification (for this site)"),
            503: ERROR_RESPONSES[503],
        },
    )


class NotificationAcknowledgeView(NotificationAckView):
    action = "ack"

    @_ack_schema("ack")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Acknowledge a notification: the site's HMI (site key) or a staff user."""
        return super().post(request, notification_id)


class NotificationClearView(NotificationAckView):
    action = "clear"

    @_ack_schema("clear")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Clear a notification: the alarm returned to normal at the site (site key)."""
        return super().post(request, notification_id)


class NotificationReleaseView(NotificationActionView):
    action = "release"

    @_action_schema("release")
    def post(self, request: Request, notification_id: Any) -> Response:
        """Deliver a Suppressed notification anyway (or one held for a flood digest): it goes out on its own."""
        return super().post(request, notification_id)
