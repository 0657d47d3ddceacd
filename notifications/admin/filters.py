"""The outbox page's list filters and search. Every choice list comes from a small table or a
constant, never from a DISTINCT over the outbox, and no filter counts rows (no facets)."""

import uuid
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.text import smart_split, unescape_string_literal

from notifications import db
from notifications.adapters import TYPE_CHOICES
from notifications.models import Notification, NotificationList
from sites.models import Site

Status = Notification.Status


def stuck_before() -> datetime:
    """Non-terminal rows created before this instant are stuck (display only)."""
    return timezone.now() - timedelta(seconds=settings.OUTBOX_STUCK_AGE)


def subject_search(queryset: QuerySet[Notification], search_term: str) -> QuerySet[Notification]:
    """Rows whose subject contains every word of ``search_term`` (case-insensitive); a search
    that is exactly a notification id finds that notification."""
    try:
        return queryset.filter(pk=uuid.UUID(search_term.strip()))
    except ValueError:
        pass
    for word in smart_split(search_term):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        if word:
            queryset = queryset.filter(db.contains_ignoring_case("subject", word))
    return queryset


QUEUED = "queued"


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(QUEUED, "Queued (Pending or Retrying)"), *Status.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == QUEUED:
            return queryset.filter(status__in=Notification.NON_TERMINAL)
        if self.value() in Status.values:
            return queryset.filter(status=self.value())
        return queryset


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        minutes = settings.OUTBOX_STUCK_AGE // 60
        return [("1", f"Stuck only (queued over {minutes} min)" if minutes else "Stuck only")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "1":
            return queryset.filter(status__in=Notification.NON_TERMINAL, created_at__lt=stuck_before())
        return queryset


class DeliveryFilter(admin.SimpleListFilter):
    """Rows by how their targets stand: delivered partially (some refused it for good), or still
    owed to some targets while others have it."""

    title = "targets"
    parameter_name = "targets"
    PARTIAL = "partial"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.PARTIAL, "Delivered partially (some refused it for good)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == self.PARTIAL:
            return queryset.filter(status=Status.DELIVERED, targets_refused__gt=0)
        return queryset


class TypeFilter(admin.SimpleListFilter):
    title = "type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return TYPE_CHOICES

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(type=self.value()) if self.value() else queryset


class _ValueFromTableFilter(admin.SimpleListFilter):
    """Choices come from a small configuration table, never from DISTINCT over the outbox;
    a value no longer in that table (a deleted site) still filters when given in the URL."""

    field = ""

    def known_values(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        choices = list(self.known_values())
        current = self.value()
        if current and current not in {value for value, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class SourceSiteFilter(_ValueFromTableFilter):
    title = "source site"
    parameter_name = "site"
    field = "source_site_id"

    def known_values(self) -> list[tuple[str, str]]:
        return [(site_id, f"{site_id} ({name})") for site_id, name in Site.objects.values_list("site_id", "name")]


class ListNameFilter(_ValueFromTableFilter):
    title = "list"
    parameter_name = "list"
    field = "list_name"

    def known_values(self) -> list[tuple[str, str]]:
        return [(name, name) for name in NotificationList.objects.values_list("name", flat=True)]


class CreatedRangeFilter(admin.ListFilter):
    """Created-at from/to (UTC), as two inputs rather than the date drill-down, which runs a
    DISTINCT over dates of the whole table. A date alone means the whole day; "to" is inclusive."""

    title = "created (UTC)"
    template = "admin/notifications/notification/created_range_filter.html"
    from_param, to_param = "created_from", "created_to"

    def __init__(
        self, request: HttpRequest, params: dict[str, list[str]], model: type[Model], model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.bounds: dict[str, datetime] = {}
        for name in (self.from_param, self.to_param):
            if name in params:
                raw = params.pop(name)[-1].strip()
                self.used_parameters[name] = raw
                if raw:
                    bound = self._parse(raw, end=name == self.to_param)
                    if bound is None:
                        messages.warning(
                            request, f"Ignored the created-at bound {raw!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM."
                        )
                    else:
                        self.bounds[name] = bound

    @staticmethod
    def _parse(raw: str, *, end: bool) -> datetime | None:
        moment: datetime | None
        try:
            day = parse_date(raw)
            if day is not None:
                moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
            else:
                moment = parse_datetime(raw)
        except ValueError:
            return None
        if moment is None:
            return None
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment, timezone.get_current_timezone())
        # Compared in UTC: PostgreSQL takes no offset beyond ±15:59 (ISO-8601 allows ±23:59),
        # and some instants near year 1 have no UTC time at all.
        try:
            return moment.astimezone(UTC)
        except (OverflowError, ValueError):
            return None

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [self.from_param, self.to_param]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.from_param in self.bounds:
            queryset = queryset.filter(created_at__gte=self.bounds[self.from_param])
        if self.to_param in self.bounds:
            raw = str(self.used_parameters[self.to_param])
            # A date-only "to" already points at the next midnight: exclusive; a moment is inclusive.
            lookup = "created_at__lt" if _is_date(raw) else "created_at__lte"
            queryset = queryset.filter(**{lookup: self.bounds[self.to_param]})
        return queryset

    def choices(self, changelist: ChangeList) -> Any:
        keep = [
            (name, value)
            for name, values in changelist.filter_params.items()
            if name not in (self.from_param, self.to_param)
            for value in values
        ]
        yield {
            "from_param": self.from_param,
            "to_param": self.to_param,
            "from_value": self.used_parameters.get(self.from_param, ""),
            "to_value": self.used_parameters.get(self.to_param, ""),
            "hidden": keep,
            "active": bool(self.bounds),
            "clear_url": changelist.get_query_string(remove=[self.from_param, self.to_param]),
        }


def _is_date(raw: str) -> bool:
    try:
        return parse_date(raw) is not None
    except ValueError:
        return False
