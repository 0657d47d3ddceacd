"""The outbox page's list filters and search. Every choice list comes from a small table or a
constant, never from a DISTINCT over the outbox, and no filter counts rows (no facets)."""

import uuid
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db import connection
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.text import smart_split, unescape_string_literal

from notifications import db
from notifications.ack_kpis import unacknowledged_q
from notifications.console import cause_q
from notifications.list_names import list_name_key
from notifications.models import PRIORITY_NAMES, Notification, NotificationList
from notifications.vocabulary import TYPE_CHOICES
from sites.models import Site

Status = Notification.Status


def stuck_before() -> datetime:
    """Non-terminal rows queued since before this instant are stuck (display only)."""
    return timezone.now() - timedelta(seconds=settings.OUTBOX_STUCK_AGE)


def queued_since(notification: Notification) -> datetime:
    """When ``notification`` was last put in the queue: its last operator Retry or Requeue,
    else its creation. Stuck age counts from here, so a row just retried is not stuck."""
    return notification.requeued_at or notification.created_at


def stuck_q(before: datetime) -> Q:
    """Non-terminal rows queued (created, or last retried or requeued) before ``before``."""
    return Q(status__in=Notification.NON_TERMINAL, created_at__lt=before) & (
        Q(requeued_at__isnull=True) | Q(requeued_at__lt=before)
    )


ID_PREFIX_MIN = 6  # hex digits: "3f2a9c" and the 8 shown in the table find rows by id prefix


def _id_prefix_range(word: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The smallest and largest ids starting with ``word`` when it is an id prefix (6–32 hex
    digits, dashes allowed where an id has them), else None."""
    digits = word.replace("-", "").lower()
    if not (ID_PREFIX_MIN <= len(digits) <= 32) or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def outbox_search(queryset: QuerySet[Notification], search_term: str) -> QuerySet[Notification]:
    """Rows matching every word of ``search_term`` (case-insensitive): each word must occur in
    the subject, list name, last error, source instance or script; a word that is an id prefix
    (6+ hex digits, like the 8 shown in the table) also matches ids starting with it; a search
    that is exactly a notification id finds that notification. Quotes keep words together.
    ``to:<address>`` finds the rows delivered (or owed) to that recipient (:func:`recipient_q`)."""
    try:
        return queryset.filter(pk=uuid.UUID(search_term.strip()))
    except ValueError:
        pass
    for word in smart_split(search_term):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        if not word:
            continue
        if word.lower().startswith("to:") and len(word) > 3:
            queryset = queryset.filter(recipient_q(word[3:]))
            continue
        condition: Any = db.text_contains_ignoring_case(word)
        bounds = _id_prefix_range(word)
        if bounds is not None:
            condition = Q(pk__gte=bounds[0], pk__lte=bounds[1]) | condition
        queryset = queryset.filter(condition)
    return queryset


def recipient_q(address: str) -> Q:
    """Rows one of whose targets is ``address`` (as given, or in lower case): on PostgreSQL a
    containment test the GIN index of the targets answers (notif_targets_gin_idx, 0035);
    elsewhere a search of the targets' text."""
    address = address.strip()
    if connection.vendor == "postgresql":
        return Q(resolved_targets__contains=[{"target": address}]) | Q(
            resolved_targets__contains=[{"target": address.lower()}]
        )
    return Q(resolved_targets__icontains=f'"{address}"')


# Kept for callers of the earlier name.
subject_search = outbox_search


QUEUED = "queued"
LIST_NAMES_IN_USE_MAX = 500


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


class SuppressionFilter(admin.SimpleListFilter):
    """Why rows were held back (docs/suppression.md). Besides the listed choices it takes an
    exact reason, e.g. ``silence:4`` (what one silence suppressed) or ``digest:<id>``."""

    title = "suppression"
    parameter_name = "suppressed_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("duplicate", "Duplicates"),
            ("silence", "Silenced (silences, maintenance windows)"),
            ("digest", "Folded into a flood digest"),
            ("held", "Held for a flood digest now"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == "held":
            return queryset.filter(held_for_digest__isnull=False, status=Status.PENDING)
        if value in ("duplicate", "silence", "digest"):
            return queryset.filter(suppressed_by__startswith=f"{value}:")
        return queryset.filter(suppressed_by=value)


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        minutes = settings.OUTBOX_STUCK_AGE // 60
        return [("1", f"Stuck only (queued over {minutes} min)" if minutes else "Stuck only")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "1":
            return queryset.filter(stuck_q(stuck_before()))
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


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in PRIORITY_NAMES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        priority = Notification.Priority.named(self.value() or "")
        return queryset if priority is None else queryset.filter(priority=priority)


class AcknowledgementFilter(admin.SimpleListFilter):
    """Rows by acknowledgement: asking and not yet acknowledged nor cleared (a partial index
    holds exactly these), acknowledged, or cleared."""

    title = "acknowledgement"
    parameter_name = "ack"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("unacknowledged", "Unacknowledged"), ("acknowledged", "Acknowledged"), ("cleared", "Cleared")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "unacknowledged":
            return queryset.filter(unacknowledged_q())
        if value == "acknowledged":
            return queryset.filter(acknowledged_at__isnull=False)
        if value == "cleared":
            return queryset.filter(cleared_at__isnull=False)
        return queryset


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
    """The configured lists, and the names used by Parked rows that name no configured list
    ("Night-Shift (no such list)"): a row for an unknown list parks at its first attempt, and
    those are the rows an operator looks for. The names in use come from a small partial index
    of Parked rows (migration 0012_console_outbox), never from the whole history."""

    title = "list"
    parameter_name = "list"
    field = "list_name"

    def known_values(self) -> list[tuple[str, str]]:
        configured = list(NotificationList.objects.values_list("name", flat=True))
        keys = {list_name_key(name) for name in configured}
        used = (
            Notification.objects.filter(status=Status.PARKED)
            .values_list("list_name", flat=True)
            .distinct()
            .order_by()[:LIST_NAMES_IN_USE_MAX]
        )
        unknown = sorted({name for name in used if list_name_key(name) not in keys})
        return [(name, name) for name in configured] + [(name, f"{name} (no such list)") for name in unknown]


PRESETS = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
PRESET_LABELS = {"15m": "15 min", "1h": "1 h", "24h": "24 h", "7d": "7 d"}


class CreatedRangeFilter(admin.ListFilter):
    """Created-at: a preset ("last 15 min / 1 h / 24 h / 7 d", relative to each page load, so an
    auto-refreshing page keeps up) or a from/to range, as inputs rather than the date
    drill-down, which runs a DISTINCT over dates of the whole table. Bounds without a zone are
    in the console's zone (UTC unless the operator chose theirs). A date alone means the whole
    day; "to" is inclusive."""

    title = "created"
    template = "admin/notifications/notification/created_range_filter.html"
    from_param, to_param, within_param = "created_from", "created_to", "created_within"

    def __init__(
        self, request: HttpRequest, params: dict[str, list[str]], model: type[Model], model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.bounds: dict[str, datetime] = {}
        self.within: str = ""
        if self.within_param in params:
            raw = params.pop(self.within_param)[-1].strip()
            self.used_parameters[self.within_param] = raw
            if raw in PRESETS:
                self.within = raw
            elif raw:
                messages.warning(
                    request, f"Ignored the created-within preset {raw!r}: use one of {', '.join(PRESETS)}."
                )
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
            try:
                moment = timezone.make_aware(moment, timezone.get_current_timezone())
            except (OverflowError, ValueError):
                return None
        # Compared in UTC: PostgreSQL takes no offset beyond ±15:59 (ISO-8601 allows ±23:59),
        # and some instants near year 1 have no UTC time at all.
        try:
            return moment.astimezone(UTC)
        except (OverflowError, ValueError):
            return None

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [self.from_param, self.to_param, self.within_param]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.within:
            queryset = queryset.filter(created_at__gte=timezone.now() - PRESETS[self.within])
        if self.from_param in self.bounds:
            queryset = queryset.filter(created_at__gte=self.bounds[self.from_param])
        if self.to_param in self.bounds:
            raw = str(self.used_parameters[self.to_param])
            # A date-only "to" already points at the next midnight: exclusive; a moment is inclusive.
            lookup = "created_at__lt" if _is_date(raw) else "created_at__lte"
            queryset = queryset.filter(**{lookup: self.bounds[self.to_param]})
        return queryset

    def choices(self, changelist: ChangeList) -> Any:
        own = (self.from_param, self.to_param, self.within_param)
        keep = [
            (name, value) for name, values in changelist.filter_params.items() if name not in own for value in values
        ]
        yield {
            "from_param": self.from_param,
            "to_param": self.to_param,
            "from_value": _as_local_input(str(self.used_parameters.get(self.from_param, "")), end=False),
            "to_value": _as_local_input(str(self.used_parameters.get(self.to_param, "")), end=True),
            "hidden": keep,
            "active": bool(self.bounds) or bool(self.within),
            "zone": timezone.get_current_timezone_name(),
            "presets": [
                {
                    "label": label,
                    "selected": self.within == key,
                    "url": changelist.get_query_string(
                        {self.within_param: key}, remove=[self.from_param, self.to_param]
                    ),
                }
                for key, label in PRESET_LABELS.items()
            ],
            "clear_url": changelist.get_query_string(remove=list(own)),
        }


def _as_local_input(raw: str, *, end: bool) -> str:
    """A bound as a datetime-local input shows it ("YYYY-MM-DDTHH:MM[:SS]"); a date alone as
    its first (from) or last (to) second; anything else (a typo) as given, to be corrected."""
    if _is_date(raw):
        return f"{raw}T23:59:59" if end else f"{raw}T00:00"
    try:
        moment = parse_datetime(raw)
    except ValueError:
        return raw
    if moment is None:
        return raw
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return moment.strftime("%Y-%m-%dT%H:%M:%S" if moment.second else "%Y-%m-%dT%H:%M")


def _is_date(raw: str) -> bool:
    try:
        return parse_date(raw) is not None
    except ValueError:
        return False


class _HiddenFilter(admin.ListFilter):
    """A filter reached by links from other console views: in the sidebar only while it is
    applied (showing its value and a link that removes it)."""

    parameter_name = ""
    template = "admin/notifications/notification/link_filter.html"

    def __init__(
        self, request: HttpRequest, params: dict[str, list[str]], model: type[Model], model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        if self.parameter_name in params:
            self.used_parameters[self.parameter_name] = params.pop(self.parameter_name)[-1]

    def value(self) -> str | None:
        value = self.used_parameters.get(self.parameter_name)
        return None if value is None else str(value)

    def has_output(self) -> bool:
        return True  # Django applies only the filters that have output; the template shows nothing unless applied

    def choices(self, changelist: ChangeList) -> Any:
        value = self.value()
        if value is not None:
            yield {"value": value, "clear_url": changelist.get_query_string(remove=[self.parameter_name])}

    def expected_parameters(self) -> list[str | None]:
        return [self.parameter_name]


class ParkedCauseFilter(_HiddenFilter):
    """Parked rows of one cause (the parked-by-cause view links here)."""

    title = "cause"
    parameter_name = "cause"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(cause_q(value))


class RequeuedAtFilter(_HiddenFilter):
    """The rows of one Retry or Requeue, by its instant (the redrive view links here)."""

    title = "retried at"
    parameter_name = "requeued_at"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        try:
            at = parse_datetime(value.strip())
        except ValueError:
            at = None
        if at is None or timezone.is_naive(at):
            messages.warning(
                request, f"Ignored the retried-at filter {value!r}: use an ISO 8601 instant with its offset."
            )
            return queryset
        return queryset.filter(requeued_at=at)
