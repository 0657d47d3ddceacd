"""The site-facing API for agents' own state (docs/api.md, "Sites"): heartbeats, parked
reports, command acknowledgements and watchdog pings. Site-key authentication, like ingest. Views validate
with a serializer, call one sites.services function and render."""

from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications.acknowledgement import acknowledged_by_site_masked
from notifications.api_errors import ERROR_RESPONSES, ErrorSerializer
from notifications.channel_targets import text_site_masked
from notifications.list_names import list_name_normalize, list_name_problem, text_control_problem
from notifications.vocabulary import ADAPTER_PATHS
from sites.models import Site, SiteCommand, SiteParkedNotification, Watchdog
from sites.rate_limits import AGENT, WATCHDOG
from sites.services import (
    SiteParkedReportError,
    site_command_acknowledge,
    site_heartbeat_record,
    site_parked_report,
)
from sites.watchdogs import watchdog_ping

MAX_REPORT_ITEMS = 1000
MAX_TEXT = 10_000


class TextField(serializers.CharField):
    """A JSON string of valid Unicode (no unpaired surrogates, no NUL: the database stores
    neither), never a number or a boolean turned into one."""

    default_error_messages = {"unicode": "Must be valid Unicode (no unpaired surrogates)."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            self.fail("unicode")
        return str(super().to_internal_value(data))


class CountField(serializers.IntegerField):
    """A JSON integer (not a numeric string, not a boolean)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class FlagField(serializers.BooleanField):
    """A JSON boolean (not a number or a string DRF would read as one)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class IdField(serializers.UUIDField):
    """A UUID given as a JSON string (DRF would also take an integer, or a boolean as one)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class ServerErrorsSerializer(serializers.Serializer):
    """Rows central answered 5xx to more than once, retried by the agent with back-off."""

    rows = CountField(min_value=0, max_value=2**31 - 1)
    since = serializers.DateTimeField(allow_null=True, required=False, default=None)
    last_error = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="", trim_whitespace=False)


class FallbackSerializer(serializers.Serializer):
    """The agent's local fallback relay (sent only when one is configured)."""

    configured = FlagField(required=False, default=True)
    active = FlagField()
    delivered = CountField(min_value=0, max_value=2**31 - 1, required=False, default=0)
    failing = CountField(min_value=0, max_value=2**31 - 1, required=False, default=0)
    last_error = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="", trim_whitespace=False)
    last_error_at = serializers.DateTimeField(allow_null=True, required=False, default=None)


class HeartbeatSerializer(serializers.Serializer):
    """What the agent says about itself; fields it does not send keep their defaults (older
    agents send none of capabilities, server_errors and fallback)."""

    agent_version = TextField(max_length=64, allow_blank=True, required=False, default="")
    buffered = CountField(min_value=0, max_value=2**31 - 1)
    parked = CountField(min_value=0, max_value=2**31 - 1)
    oldest_buffered_at = serializers.DateTimeField(allow_null=True, required=False, default=None)
    last_forward_at = serializers.DateTimeField(allow_null=True, required=False, default=None)
    last_error = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="", trim_whitespace=False)
    capabilities = serializers.ListField(child=TextField(max_length=64), max_length=50, required=False, default=list)
    server_errors = ServerErrorsSerializer(required=False, allow_null=True, default=None)
    fallback = FallbackSerializer(required=False, allow_null=True, default=None)


class CommandSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    action = serializers.ChoiceField(choices=SiteCommand.Action.choices)
    notification_id = serializers.UUIDField()
    reason = serializers.CharField(allow_blank=True)
    # Only in "acknowledged" commands.
    acknowledged_at = serializers.DateTimeField(required=False)
    acknowledged_via = serializers.CharField(required=False)
    acknowledged_by = serializers.CharField(required=False, help_text="Masked as targets are for sites.")
    note = serializers.CharField(required=False, allow_blank=True)


class ParkedItemSerializer(serializers.Serializer):
    """A row parked at the site. Text longer than central's column is cut, never refused."""

    notification_id = IdField()
    type = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    list_name = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    subject = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    source_instance_id = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    source_script = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    site_enqueued_at = serializers.DateTimeField(allow_null=True, required=False, default=None)
    reason = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")
    retry_count = CountField(min_value=0, max_value=2**31 - 1, required=False, default=0)
    parked_at = serializers.DateTimeField(allow_null=True, required=False, default=None)


class UnparkedItemSerializer(serializers.Serializer):
    """A row that left the parked state at the site."""

    notification_id = IdField()
    outcome = serializers.ChoiceField(
        choices=[SiteParkedNotification.State.RETRIED, SiteParkedNotification.State.DISCARDED]
    )
    changed_at = serializers.DateTimeField(allow_null=True, required=False, default=None)


class ParkedReportSerializer(serializers.Serializer):
    parked = serializers.ListField(
        child=ParkedItemSerializer(), max_length=MAX_REPORT_ITEMS, required=False, default=list
    )
    unparked = serializers.ListField(
        child=UnparkedItemSerializer(), max_length=MAX_REPORT_ITEMS, required=False, default=list
    )


class AckSerializer(serializers.Serializer):
    result = serializers.ChoiceField(choices=[SiteCommand.State.DONE, SiteCommand.State.FAILED])
    detail = TextField(max_length=MAX_TEXT, allow_blank=True, required=False, default="")


class CommandStateSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    action = serializers.ChoiceField(choices=SiteCommand.Action.choices)
    notification_id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=SiteCommand.State.choices)
    detail = serializers.CharField(allow_blank=True)


class OneLineField(TextField):
    """A one-line text (no line breaks or other control characters), not blank."""

    default_error_messages = {"control": "{problem}", "blank": "Must not be blank."}

    def to_internal_value(self, data: Any) -> str:
        text = super().to_internal_value(data)
        if "\r" in text or "\n" in text:
            self.fail("control", problem="Must not contain line breaks (CR or LF).")
        problem = text_control_problem(text)
        if problem:
            self.fail("control", problem=problem)
        if not text.strip():
            self.fail("blank")
        return text


class ListNameField(OneLineField):
    """A notification list's name, in the form and with the checks of ingest."""

    def to_internal_value(self, data: Any) -> str:
        name = list_name_normalize(super().to_internal_value(data))
        if len(name) > 200:
            self.fail("max_length", max_length=200)
        problem = list_name_problem(name)
        if problem:
            self.fail("control", problem=problem)
        return name


@extend_schema_field(OpenApiTypes.DATETIME)
class TimestampField(serializers.Field):
    """An ISO-8601 timestamp with a timezone, as ingest takes them; returned in UTC."""

    default_error_messages = {
        "invalid": "Is not an ISO-8601 timestamp, e.g. 2026-11-21T10:00:00Z.",
        "naive": "Must include a timezone (e.g. a trailing Z for UTC).",
    }

    def to_internal_value(self, data: Any) -> datetime:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            parsed = datetime.fromisoformat(data)
        except ValueError:
            self.fail("invalid")
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            self.fail("naive")
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            self.fail("invalid")

    def to_representation(self, value: datetime) -> str:
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class WatchdogPingSerializer(serializers.Serializer):
    """One ping of a watchdog: the script is alive. The interval, list and channel are the
    ping's (the latest ping says them)."""

    name = OneLineField(max_length=200, trim_whitespace=False, help_text="Names the watchdog within the site.")
    every_seconds = CountField(
        min_value=1, max_value=Watchdog.MAX_EVERY_SECONDS, help_text="The script pings at least this often."
    )
    list_name = ListNameField(max_length=1000, help_text="Who hears when the pings stop.")
    type = serializers.ChoiceField(choices=sorted(ADAPTER_PATHS), required=False, default="email")
    pinged_at = TimestampField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the site pinged (its clock). Central takes min(pinged_at, its own clock); default: now.",
    )


class WatchdogStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=Watchdog.State.choices)
    last_ping_at = serializers.DateTimeField()
    every_seconds = serializers.IntegerField()
    list_name = serializers.CharField()
    type = serializers.CharField()


SITE_ERRORS = {code: ERROR_RESPONSES[code] for code in (400, 401, 403, 413, 415, 429, 503)}


def _validated(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["Must be a JSON object."]})
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _site(request: Request) -> Site:
    # The site-key authentication makes the Site the request's principal (IsActiveSite checked it).
    return cast(Site, request.user)


def command_record(command: SiteCommand) -> dict[str, Any]:
    """A command as the agent receives it in a heartbeat answer. The operator's reason is free
    text that may quote a recipient (from a last_error, say): masked as the status record's
    targets are. An ``acknowledged`` command adds the acknowledgement: ``acknowledged_at``,
    ``acknowledged_via``, ``acknowledged_by`` masked as in the site's status record, and
    ``note`` with addresses and numbers masked like the reason."""
    record = {
        "id": str(command.pk),
        "action": command.action,
        "notification_id": str(command.notification_id),
        "reason": text_site_masked(command.reason),
    }
    if command.action == SiteCommand.Action.ACKNOWLEDGED:
        details = command.details
        via = details.get("acknowledged_via") or ""
        record.update(
            {
                "acknowledged_at": details.get("acknowledged_at"),
                "acknowledged_via": via,
                "acknowledged_by": acknowledged_by_site_masked(
                    acknowledged_by=details.get("acknowledged_by") or "", acknowledged_via=via
                ),
                "note": text_site_masked(details.get("note") or ""),
            }
        )
    return record


class HeartbeatView(APIView):
    site_rate_scope = AGENT  # the agent's own budget: never drawn by notifications

    @extend_schema(
        request=HeartbeatSerializer,
        responses={
            200: OpenApiResponse(
                inline_serializer("HeartbeatAnswer", {"commands": CommandSerializer(many=True)}),
                description="Stored; the commands waiting for this site (until acknowledged)",
            ),
            **SITE_ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        """The site agent's state; answered with the operator commands waiting for it."""
        commands = site_heartbeat_record(site=_site(request), report=_validated(HeartbeatSerializer, request))
        return Response(
            {"commands": [command_record(command) for command in commands]},
            headers={"X-Outbox-Silent-After": str(settings.OUTBOX_SITE_SILENT_AFTER)},
        )


class ParkedReportView(APIView):
    site_rate_scope = AGENT  # the agent's own budget: never drawn by notifications

    @extend_schema(
        request=ParkedReportSerializer,
        responses={
            200: OpenApiResponse(
                inline_serializer(
                    "ParkedReportAnswer", {"parked": serializers.IntegerField(), "unparked": serializers.IntegerField()}
                ),
                description="Applied (idempotent by notification id)",
            ),
            **SITE_ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        """Rows parked at the site, and rows that left that state (retried or discarded)."""
        data = _validated(ParkedReportSerializer, request)
        try:
            parked, unparked = site_parked_report(site=_site(request), parked=data["parked"], unparked=data["unparked"])
        except SiteParkedReportError as error:
            raise exceptions.ValidationError(
                # Keyed by the item's position, as DRF names a list item's errors.
                {"parked": {str(index): {"notification_id": [problem]} for index, problem in error.problems.items()}}
            ) from None
        return Response({"parked": parked, "unparked": unparked})


class CommandAckView(APIView):
    site_rate_scope = AGENT  # the agent's own budget: never drawn by notifications

    @extend_schema(
        parameters=[OpenApiParameter("command_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        request=AckSerializer,
        responses={
            200: OpenApiResponse(CommandStateSerializer, description="Recorded (the first result wins)"),
            404: OpenApiResponse(ErrorSerializer, description="No such command for this site"),
            **SITE_ERRORS,
        },
    )
    def post(self, request: Request, command_id: Any) -> Response:
        """The agent's result of one command: done or failed, with a detail."""
        data = _validated(AckSerializer, request)
        command = site_command_acknowledge(
            site=_site(request), command_id=command_id, result=data["result"], detail=data["detail"]
        )
        if command is None:
            raise exceptions.NotFound("No command with this id for this site.", code="not_found")
        return Response(
            {
                "id": str(command.pk),
                "action": command.action,
                "notification_id": str(command.notification_id),
                "state": command.state,
                "detail": command.detail,
            }
        )


class WatchdogPingView(APIView):
    """Watchdog pings: a budget of their own in the site rate limits, never drawn by notifications."""

    site_rate_scope = WATCHDOG

    @extend_schema(
        request=WatchdogPingSerializer,
        responses={
            200: OpenApiResponse(WatchdogStateSerializer, description="Recorded; the watchdog as central has it"),
            **SITE_ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        """One ping of a watchdog of the calling site (created by its first ping)."""
        data = _validated(WatchdogPingSerializer, request)
        watchdog = watchdog_ping(site=_site(request), **data)
        return Response(
            {
                "name": watchdog.name,
                "state": watchdog.state,
                "last_ping_at": watchdog.last_ping_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                "every_seconds": watchdog.every_seconds,
                "list_name": watchdog.list_name,
                "type": watchdog.type,
            }
        )
