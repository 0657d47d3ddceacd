"""The staff API of silences (docs/api.md, docs/suppression.md): ``GET|POST /api/v1/silences/``
and ``DELETE /api/v1/silences/{id}/``. Staff only, by token or console session, with the
model's permissions (view, add, delete)."""

from typing import Any

from django.db.models import Count, Q
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications.api_errors import ERROR_RESPONSES, ErrorSerializer
from notifications.db import database_now
from notifications.models import Notification, Silence
from notifications.suppression import SILENCE_MATCHERS, silence_end, silence_problems
from sites.authentication import StaffKeyAuthentication


class SilenceSerializer(serializers.ModelSerializer):
    """A silence as the API shows and takes it; ``created_by`` is the caller, ``starts_at``
    defaults to now."""

    starts_at = serializers.DateTimeField(required=False)
    active = serializers.SerializerMethodField()
    suppressed = serializers.SerializerMethodField()

    class Meta:
        model = Silence
        fields = [
            "id",
            "site",
            "list_name",
            "source_instance_id",
            "subject_contains",
            "starts_at",
            "ends_at",
            "reason",
            "created_by",
            "created_at",
            "include_high",
            "include_critical",
            "active",
            "suppressed",
        ]
        read_only_fields = ["id", "created_by", "created_at"]

    def get_active(self, silence: Silence) -> bool:
        now = self.context["now"]
        return bool(silence.starts_at <= now < silence.ends_at)

    def get_suppressed(self, silence: Silence) -> int:
        """How many notifications it has suppressed so far."""
        return int(self.context["suppressed"].get(silence.pk, 0))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        now = self.context["now"]
        attrs.setdefault("starts_at", now)
        problems = silence_problems(
            matchers={name: attrs.get(name, "") for name in SILENCE_MATCHERS},
            starts_at=attrs["starts_at"],
            ends_at=attrs["ends_at"],
            reason=attrs.get("reason", ""),
            now=now,
        )
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


def _suppressed_counts(silences: list[Silence]) -> dict[int, int]:
    reasons = {f"silence:{silence.pk}": silence.pk for silence in silences}
    rows = (
        Notification.objects.filter(suppressed_by__in=list(reasons))
        .values("suppressed_by")
        .annotate(n=Count("created_at"))
        .order_by()
    )
    return {reasons[row["suppressed_by"]]: row["n"] for row in rows}


def _invalid(errors: Any) -> Response:
    return Response({"error": "invalid", "detail": "Invalid input.", "errors": errors}, status=400)


class _StaffView(APIView):
    authentication_classes = [StaffKeyAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    throttle_classes = []

    def require(self, request: Request, permission: str, words: str) -> None:
        if not request.user.has_perm(f"notifications.{permission}"):
            raise exceptions.PermissionDenied(f"You may not {words}.")


class SilenceCollectionView(_StaffView):
    """The silences that are active or still to come (``?all=true``: every one), and new ones."""

    @extend_schema(
        operation_id="silences_list",
        parameters=[OpenApiParameter("all", bool, description="Also the silences that have ended.")],
        responses={200: SilenceSerializer(many=True), 401: ErrorSerializer, 403: ErrorSerializer},
    )
    def get(self, request: Request) -> Response:
        self.require(request, "view_silence", "view silences")
        now = database_now()
        silences = Silence.objects.all()
        if request.query_params.get("all", "").lower() not in ("1", "true", "yes"):
            silences = silences.filter(Q(ends_at__gt=now))
        chosen = list(silences.order_by("-starts_at")[:1000])
        context = {"now": now, "suppressed": _suppressed_counts(chosen)}
        return Response(SilenceSerializer(chosen, many=True, context=context).data)

    @extend_schema(
        operation_id="silences_create",
        request=SilenceSerializer,
        responses={
            201: SilenceSerializer,
            400: ERROR_RESPONSES[400],
            401: OpenApiResponse(ErrorSerializer, description="Not authenticated"),
            403: OpenApiResponse(ErrorSerializer, description="Not staff, or may not add silences"),
        },
    )
    def post(self, request: Request) -> Response:
        self.require(request, "add_silence", "add silences")
        now = database_now()
        if not isinstance(request.data, dict):
            return _invalid({"non_field_errors": ["The body must be a JSON object."]})
        unknown = sorted(set(request.data) - set(SilenceSerializer.Meta.fields))
        if unknown:
            return _invalid({str(name)[:100]: ["Unknown field."] for name in unknown})
        serializer = SilenceSerializer(data=request.data, context={"now": now, "suppressed": {}})
        if not serializer.is_valid():
            return _invalid(serializer.errors)
        silence = serializer.save(created_by=request.user.get_username()[:150])
        return Response(SilenceSerializer(silence, context={"now": now, "suppressed": {}}).data, status=201)


class SilenceDetailView(_StaffView):
    """End a silence: one that has started ends now (its record stays: suppressed rows name it);
    one still to come is deleted."""

    @extend_schema(
        operation_id="silences_end",
        responses={
            204: None,
            401: ErrorSerializer,
            403: ErrorSerializer,
            404: OpenApiResponse(ErrorSerializer, description="No such silence"),
            409: OpenApiResponse(ErrorSerializer, description="It has already ended"),
        },
    )
    def delete(self, request: Request, silence_id: int) -> Response:
        self.require(request, "delete_silence", "end silences")
        silence = Silence.objects.filter(pk=silence_id).first()
        if silence is None:
            raise exceptions.NotFound("No silence with this id.", code="not_found")
        if not silence_end(silence=silence):
            return Response({"error": "conflict", "detail": "This silence has already ended."}, status=409)
        return Response(status=status.HTTP_204_NO_CONTENT)
