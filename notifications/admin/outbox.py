"""The Notification Outbox page: the list, a notification's detail, and the operator actions
Retry, Retry now, Discard (with a reason) and Requeue (which go through notifications.operations).

Notification rows are read-only here for everyone. The page is built for tables of millions of
rows: no full COUNT(*) (see OutboxPaginator), no date drill-down, no facet counts, no per-row
queries, and the KPI tiles are one aggregate query (notifications.kpis).
"""

import json
from collections.abc import Callable
from datetime import UTC, date, timedelta
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import Count, QuerySet, Window
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from notifications import db
from notifications.admin.acknowledgement import AcknowledgementAdmin
from notifications.admin.common import DiscardForm, ReadOnlyRecords, json_block, missing_object_redirect
from notifications.admin.filters import (
    AcknowledgementFilter,
    CreatedRangeFilter,
    DeliveryFilter,
    ListNameFilter,
    ParkedCauseFilter,
    PriorityFilter,
    RequeuedAtFilter,
    SourceSiteFilter,
    StatusFilter,
    StuckFilter,
    SuppressionFilter,
    TypeFilter,
    outbox_search,
    queued_since,
    stuck_before,
)
from notifications.admin.outbox_views import OutboxConsoleViews, redrive_link
from notifications.admin.silences import flood_report_page, silence_links
from notifications.console import error_specific, parked_for_lists_now_existing, retried_at
from notifications.console_time import console_time, console_time_short
from notifications.email_preview import EmailPreview, email_preview_build, type_data_shorten
from notifications.kpis import kpis_compute
from notifications.models import DeliveryAttempt, Notification
from notifications.operations import (
    DISCARDABLE,
    ActionResult,
    notification_discard,
    notification_release,
    notification_requeue,
    notification_retry,
    notification_retry_now,
)
from notifications.vocabulary import targets_summary
from sites.models import Site

Status = Notification.Status

# One action never loads more ids than this; "select all" across millions of rows must be
# narrowed with filters first.
ACTION_MAX_ROWS = 10_000


class OutboxPaginator(Paginator):
    """Counts exactly up to ``exact_limit`` matching rows, and only while counting them takes
    less than ``count_budget_ms`` (a search for a word in 20,000 of 10,000,000 rows reads each
    match; PostgreSQL cancels the count at the budget); beyond either, it uses the database's
    planner estimate where it has one (PostgreSQL), so a page never scans the whole table just
    to number its pages. The rows shown are always exact.

    Where the page's own query reads every match anyway (PostgreSQL's plan sorts all matches
    to take the page, as for a word found through the search index), the page ``number`` (from
    the request) is read first with the matches counted in the same pass: an exact count, and
    no second pass to count them. In the newest-first order, that page is looked for first
    among the matches created since the start of the UTC day ``recent_days`` ago: the search
    index holds each row's day, so only those days' matches are read (of 50,000 matches
    scattered over ten million rows, reading all costs 400 ms, the 3,400 of the last two days
    45 ms). When they hold the page and at least one match more (so the next page is never
    empty), the page comes from them, and the count is the planner's estimate, never below
    those matches, which ``recent`` records; otherwise all the matches are read (a search whose
    recent matches are too few to fill the page has few matches in all, as a rule).
    An estimate never falls below the rows that page shows.

    ``is_estimate`` says whether ``count`` is an estimate (the template marks it with "≈").
    """

    exact_limit = 10_000
    count_budget_ms = 100
    recent_days = 1

    is_estimate = False
    # Counting the matches was cancelled at count_budget_ms: the filters' matches are costly to
    # read, and the page's other counts of them (notifications.console's matches by site and
    # list) use the rows the page shows instead of spending their own budget to learn it again.
    count_cut = False
    recent: tuple[date, int] | None = None  # (since, matches since then) when the page came from there

    def __init__(self, *args: Any, number: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.number = number
        self._read: tuple[int, list[Any]] | None = None  # (page number, its rows), read with the count

    def page(self, number: Any) -> Any:
        if self._read is not None and self.validate_number(number) == self._read[0]:
            return Page(self._read[1], self._read[0], self)
        return super().page(number)

    @cached_property
    def count(self) -> int:
        counted = self._count_with_page()
        if counted is not None:
            return counted
        rows = cast(QuerySet[Any], self.object_list).order_by().values("pk")
        capped = db.count_within(rows[: self.exact_limit + 1], self.count_budget_ms)
        if capped is not None and capped <= self.exact_limit:
            return capped
        self.count_cut = capped is None
        estimate = db.planner_row_estimate(rows)
        if estimate is None:
            return rows.count()  # SQLite is the small embedded database: exact is affordable
        self.is_estimate = True
        return max(capped or 0, estimate, self._shown_at_least())

    def _requested(self) -> slice | None:
        """The rows of page ``number`` (the one the request asks for), if there is one."""
        if self.number is None or self.number < 1 or not isinstance(self.object_list, QuerySet):
            return None
        bottom = (self.number - 1) * self.per_page
        return slice(bottom, bottom + self.per_page)

    def _shown_at_least(self) -> int:
        """How many rows page ``number`` shows there are at least: its rows are read now (the
        ones it shows), so that an estimate below them (the planner can guess 1 for a search
        that matches 50,000 rows) neither hides the next page nor makes the admin take it for
        a single page, which it lists unpaginated (every match); one more when the page is
        full. 0 without a page number."""
        window = self._requested()
        if window is None:
            return 0
        rows = list(self.object_list[window])
        if not rows:
            return 0
        self._read = (cast(int, self.number), rows)
        return window.start + len(rows) + (1 if len(rows) == self.per_page else 0)

    def _count_with_page(self) -> int | None:
        """The exact count, read with page ``number``'s rows, where the page's query reads
        every match anyway; None otherwise (or when that page is past the end)."""
        window = self._requested()
        matches = cast(QuerySet[Any], self.object_list)
        if window is None or not db.plan_reads_every_match(matches[window]):
            return None
        if list(matches.query.order_by[:1]) == ["-created_at"]:
            counted = self._count_with_recent_page(matches, window)
            if counted is not None:
                return counted
        rows = list(matches.annotate(matching_rows=Window(Count("pk")))[window])
        if not rows:
            return None
        self._read = (cast(int, self.number), rows)
        return int(rows[0].matching_rows)

    def _count_with_recent_page(self, matches: QuerySet[Any], window: slice) -> int | None:
        """The estimated count, with page ``number``'s rows read from the matches of the last
        ``recent_days`` days if they hold more than the page needs; None if they do not."""
        since = timezone.now().astimezone(UTC).date() - timedelta(days=self.recent_days)
        recent = matches.alias(created_day=db.CreatedDay()).filter(created_day__gte=since)
        rows = list(recent.annotate(matching_rows=Window(Count("pk")))[window])
        if not rows or rows[0].matching_rows <= cast(int, window.stop):
            return None
        self._read = (cast(int, self.number), rows)
        self.is_estimate = True
        self.recent = (since, rows[0].matching_rows)
        return max(db.planner_row_estimate(matches.order_by().values("pk")) or 0, rows[0].matching_rows)


class OutboxChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        # The list never shows the large columns; do not read them for a page of 100 rows.
        return super().get_queryset(request, exclude_parameters).defer("body", "type_data", "resolved_targets")

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[Any]:
        """Sorted by priority, rows of one priority follow in creation order the same way
        (most urgent and newest first, or the reverse): the order of the index on
        (priority, created_at), rather than by id, which no index serves after priority."""
        ordering = list(super().get_ordering(request, queryset))
        if not ordering or ordering[0] not in ("priority", "-priority"):
            return ordering
        sign = "-" if ordering[0] == "-priority" else ""
        rest = [field for field in ordering[1:] if field not in ("created_at", "-created_at")]
        return [ordering[0], f"{sign}created_at", *rest]


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ("started_at", "duration_ms", "outcome", "failure_class", "error", "detail_display", "worker")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "delivery attempts"

    @admin.display(description="detail")
    def detail_display(self, attempt: DeliveryAttempt) -> str:
        """The adapter's detail as "name: value" lines (nested values as compact JSON)."""
        detail = attempt.detail
        if not detail:
            return "—"
        if not isinstance(detail, dict):
            return json_block(detail)
        lines = (
            (name.replace("_", " "), value if isinstance(value, str | int | float) else json.dumps(value, default=str))
            for name, value in detail.items()
        )
        return format_html_join("", '<div class="outbox-detail">{}: {}</div>', lines)

    # Attempts are part of the notification's audit record: whoever may view the notification
    # sees them; nobody edits them.
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("notifications.view_notification")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# Heads the HTML preview's document: nothing inside the frame may load or run (images, fonts,
# scripts, connections), inline styles excepted.
PREVIEW_POLICY = (
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
)

STATUS_CSS: dict[str, str] = {
    Status.PENDING: "pending",
    Status.RETRYING: "retrying",
    Status.DELIVERED: "delivered",
    Status.PARKED: "parked",
    Status.DISCARDED: "discarded",
    Status.SUPPRESSED: "suppressed",
}


@admin.register(Notification)
class NotificationAdmin(ReadOnlyRecords, OutboxConsoleViews, AcknowledgementAdmin, admin.ModelAdmin):
    list_display = (
        "short_id",
        "status_badge",
        "priority_badge",
        "list_column",
        "subject_column",
        "site_column",
        "created_column",
        "last_error_excerpt",
    )
    list_display_links = ("short_id",)
    list_filter = (
        StatusFilter,
        SuppressionFilter,
        DeliveryFilter,
        StuckFilter,
        PriorityFilter,
        AcknowledgementFilter,
        TypeFilter,
        SourceSiteFilter,
        ListNameFilter,
        CreatedRangeFilter,
        ParkedCauseFilter,
        RequeuedAtFilter,
    )
    search_fields = ("subject",)
    search_help_text = (
        "Press / to search. Every word must occur in the subject, list, last error, source instance or script; "
        "an id prefix (6+ hex digits) or a full id finds by id; to:address finds what was sent to a recipient."
    )
    action_max_rows = ACTION_MAX_ROWS
    # The orders with an index behind them: creation, and priority (then creation).
    sortable_by = ("created_column", "priority_badge")
    list_per_page = 100
    list_max_show_all = 1000
    paginator = OutboxPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_selected", "retry_now_selected", "discard_selected", "requeue_selected", "release_selected"]
    inlines = [DeliveryAttemptInline]

    fieldsets = (
        (
            None,
            {
                "fields": (
                    "notification_id",
                    "status_display",
                    "stuck_badge",
                    "priority_badge",
                    "type",
                    "list_name",
                    "subject",
                    "body",
                )
            },
        ),
        ("History", {"fields": ("timeline_display",)}),
        ("Acknowledgement", {"fields": ("acknowledgement_display", "cleared_display")}),
        (
            "Delivery",
            {
                "fields": (
                    "retry_count",
                    "channel_failures",
                    "last_error",
                    "delivery_summary_display",
                    "resolved_targets_display",
                    "type_data_display",
                    "last_attempt_at",
                    "next_attempt_at",
                    "delivered_at",
                    "delivered_locally_at",
                    "expired_at",
                    "claim_display",
                )
            },
        ),
        ("Discard", {"fields": ("discarded_at", "discarded_by", "discard_reason")}),
        (
            "Suppression",
            {"fields": ("suppression_display", "dedup_key", "occurrences_display", "held_for_digest")},
        ),
        (
            "Email as composed",
            {
                "fields": ("composed_headers_display", "message_parts_display", "html_preview_display"),
                "description": (
                    "Composed now, as delivery composes it: with the list's current recipient mode and the "
                    "current From address. The HTML is shown sanitised, in a sandboxed frame where nothing runs."
                ),
            },
        ),
        (
            "Provenance",
            {
                "fields": (
                    "source_site_display",
                    "source_instance_id",
                    "source_script",
                    "site_enqueued_at",
                    "created_at",
                    "fingerprint",
                )
            },
        ),
    )
    # Every field shown is read-only: the row is the audit record.
    readonly_fields = flatten_fieldsets(fieldsets)

    class Media:
        css = {"all": ["notifications/admin.css", "notifications/outbox.css"]}
        js = ["notifications/outbox.js"]

    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("notifications.retry_notification")

    def has_discard_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("notifications.discard_notification")

    def has_requeue_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("notifications.requeue_notification")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return OutboxChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> OutboxPaginator:
        try:
            number = int(request.GET.get(PAGE_VAR, 1))  # as the change list reads it
        except ValueError:
            number = 1
        return OutboxPaginator(queryset, per_page, orphans, allow_empty_first_page, number=number)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return outbox_search(queryset, search_term), False

    # --- columns

    @admin.display(description="id", ordering="notification_id")
    def short_id(self, obj: Notification) -> str:
        return str(obj.notification_id)[:8]

    @admin.display(description="status")
    def status_badge(self, obj: Notification) -> SafeString:
        badge = format_html(
            '<span class="outbox-badge outbox-status-{}">{}</span>', STATUS_CSS.get(obj.status, "other"), obj.status
        )
        # The list shows "stuck", "delivered locally", the duplicates ("×37, last 10:42") and
        # a digest hold beside the status (one column less).
        return format_html("{}{}{}{}", badge, self.stuck_badge(obj), local_delivery_badge(obj), suppression_badge(obj))

    @admin.display(description="status")
    def status_display(self, obj: Notification) -> SafeString:
        return format_html(
            '<span class="outbox-badge outbox-status-{}">{}</span>{}',
            STATUS_CSS.get(obj.status, "other"),
            obj.status,
            local_delivery_badge(obj),
        )

    @admin.display(description="suppressed")
    def suppression_display(self, obj: Notification) -> str:
        if not obj.suppressed_by:
            return "—"
        released = " (delivered anyway since)" if obj.status != Status.SUPPRESSED else ""
        return f"{obj.suppressed_reason}{released}"

    @admin.display(description="occurrences")
    def occurrences_display(self, obj: Notification) -> str:
        return occurrences_text(obj) or "1"

    @admin.display(description="priority", ordering="priority")
    def priority_badge(self, obj: Notification) -> SafeString:
        name = Notification.Priority(obj.priority).label
        if obj.priority == Notification.Priority.NORMAL:
            return format_html('<span class="outbox-priority-normal">{}</span>', name)
        return format_html('<span class="outbox-badge outbox-priority-{}">{}</span>', name, name)

    @admin.display(description="stuck")
    def stuck_badge(self, obj: Notification) -> str:
        # Computed from the row itself: no query per row. Counts from the last enqueue or
        # operator Retry/Requeue, not from creation.
        # A row held for a flood digest waits for its window's end on purpose.
        held = getattr(obj, "held_for_digest", None) is not None
        if obj.status in Notification.NON_TERMINAL and not held and queued_since(obj) < stuck_before():
            return format_html(
                ' <span class="outbox-badge outbox-stuck" title="{}">stuck</span>',
                "Queued longer than the stuck-age threshold (counted from the last enqueue or retry)",
            )
        return ""

    @admin.display(description="list")
    def list_column(self, obj: Notification) -> str:
        return clipped(obj.list_name, 18)

    @admin.display(description="subject")
    def subject_column(self, obj: Notification) -> str:
        return clipped(obj.subject, 60)

    @admin.display(description="site")
    def site_column(self, obj: Notification) -> str:
        return clipped(obj.source_site_id, 12)

    @admin.display(description="created", ordering="created_at")
    def created_column(self, obj: Notification) -> SafeString:
        return time_html(obj.created_at)

    @admin.display(description="retries")
    def retries_column(self, obj: Notification) -> int:
        return obj.retry_count

    @admin.display(description="last error")
    def last_error_excerpt(self, obj: Notification) -> str:
        # A row waiting on an open channel says so (its own last error is older news).
        waiting = getattr(self, "_open_channels", {}).get(obj.type)
        if waiting is not None and obj.status in Notification.NON_TERMINAL:
            return format_html('<span class="outbox-waiting">{}</span>', waiting)
        text = " ".join(error_specific(obj.last_error).split())
        if obj.retry_count:
            text = f"{text} ({obj.retry_count} attempt{'s' if obj.retry_count != 1 else ''})" if text else ""
        return clipped(text, 30, limit=2000)

    # --- detail fields

    @admin.display(description="targets")
    def delivery_summary_display(self, obj: Notification) -> str:
        summary = targets_summary(obj.resolved_targets)
        return summary["text"] if summary else "—"

    @admin.display(description="resolved targets")
    def resolved_targets_display(self, obj: Notification) -> str:
        targets = obj.resolved_targets
        if not targets:
            return "— (not delivered yet; targets are resolved at delivery time)"
        if isinstance(targets, dict):
            targets = [
                dict(target=key, **(value if isinstance(value, dict) else {"outcome": value}))
                for key, value in targets.items()
            ]
        if not (isinstance(targets, list) and all(isinstance(t, dict) for t in targets)):
            return json_block(obj.resolved_targets)
        columns: list[str] = []
        for target in targets:
            columns.extend(key for key in target if key not in columns)
        head = format_html_join("", "<th>{}</th>", ((c.replace("_", " "),) for c in columns))
        rows = format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((_cell(t.get(c)),) for c in columns)),) for t in targets),
        )
        return format_html(
            '<table class="outbox-targets"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows
        )

    @admin.display(description="type data")
    def type_data_display(self, obj: Notification) -> str:
        return json_block(type_data_shorten(obj.type_data)) if obj.type_data else "—"

    def _email_preview(self, obj: Notification) -> EmailPreview | None:
        """The composed email of ``obj`` (built once per page), or None for other types."""
        if obj.type != "email":
            return None
        if not hasattr(obj, "_outbox_email_preview"):
            obj._outbox_email_preview = email_preview_build(notification=obj)  # type: ignore[attr-defined]
        return cast(EmailPreview, obj._outbox_email_preview)  # type: ignore[attr-defined]

    @admin.display(description="headers")
    def composed_headers_display(self, obj: Notification) -> str:
        preview = self._email_preview(obj)
        if preview is None:
            return "—"
        if preview.problems:
            return format_html(
                '<ul class="errorlist">{}</ul>',
                format_html_join(
                    "", "<li>{}: {}</li>", ((name, " ".join(texts)) for name, texts in preview.problems.items())
                ),
            )
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", preview.headers)
        notes = format_html_join("", '<p class="outbox-preview-note">{}</p>', ((note,) for note in preview.notes))
        return format_html(
            '<table class="outbox-headers"><tbody>{}</tbody></table>{}<p class="outbox-preview-note">'
            "Recipient mode of the list now: {}</p>",
            rows,
            notes,
            preview.recipient_mode or "—",
        )

    @admin.display(description="parts")
    def message_parts_display(self, obj: Notification) -> str:
        preview = self._email_preview(obj)
        if preview is None or preview.problems:
            return "—"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((part,) for part in preview.parts)))

    @admin.display(description="HTML preview")
    def html_preview_display(self, obj: Notification) -> str:
        preview = self._email_preview(obj)
        if preview is None or not preview.html:
            return "— (no HTML part)"
        # Sanitised already; the empty sandbox also forbids scripts, forms, plugins and the
        # page's origin, and the policy inside the frame stops it fetching anything.
        document = PREVIEW_POLICY + preview.html
        return format_html(
            '<iframe class="outbox-html-preview" sandbox="" referrerpolicy="no-referrer" '
            'title="HTML part (sanitised)" srcdoc="{}"></iframe>',
            document,
        )

    @admin.display(description="claim")
    def claim_display(self, obj: Notification) -> str:
        if not obj.claimed_by:
            return "—"
        return f"{obj.claimed_by} until {console_time(obj.claimed_until)}" if obj.claimed_until else obj.claimed_by

    @admin.display(description="source site")
    def source_site_display(self, obj: Notification) -> str:
        site = Site.objects.filter(site_id=obj.source_site_id).only("pk", "name").first()
        if site is None:
            return f"{obj.source_site_id} (no longer registered)"
        url = reverse("admin:sites_site_change", args=[site.pk])
        return format_html('<a href="{}">{}</a> ({})', url, obj.source_site_id, site.name)

    # --- page context

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        kpis = kpis_compute()
        # Per request, like the other admins' per-page caches: the open channels' words for rows waiting on them.
        self._open_channels = {
            channel["channel"]: f"waiting for {channel['channel']} (open since "
            f"{console_time_short(channel['since'])}, {channel['rows_waiting']:,} waiting)"
            for channel in kpis["channels"]
        }
        extra_context = {
            **(extra_context or {}),
            "outbox_kpis": kpis,
            "zone_name": timezone.get_current_timezone_name(),
            "export_query": request.GET.urlencode(),
            "lists_now_existing": parked_for_lists_now_existing(),
            "can_retry": self.has_retry_permission(request),
            # The table gets the whole width: the collapsible app sidebar would push it past 1280 px.
            "is_nav_sidebar_enabled": False,
        }
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        status = obj.status if obj is not None else None
        extra_context = {
            **(extra_context or {}),
            "can_retry": status == Status.PARKED and self.has_retry_permission(request),
            "can_retry_now": status == Status.RETRYING and self.has_retry_permission(request),
            "can_discard": status in DISCARDABLE and self.has_discard_permission(request),
            "can_requeue": status == Status.DISCARDED and self.has_requeue_permission(request),
            "can_acknowledge": obj is not None
            and obj.acknowledged_at is None
            and self.has_acknowledge_permission(request, obj),
            "silence_links": silence_links(obj)
            if obj is not None and request.user.has_perm("notifications.add_silence")
            else [],
            "can_release": obj is not None
            and (status == Status.SUPPRESSED or obj.held_for_digest is not None)
            and self.has_retry_permission(request),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        pages = {
            "parked": self.parked_groups_view,
            "parked/retry": self.parked_retry_view,
            "parked/discard": self.parked_discard_view,
            "redrive": self.redrive_view,
            "export": self.export_view,
            "timezone": self.timezone_view,
            "flood": self.flood_report_view,
            "channel": self.channel_breakdown_view,
            "notes": self.incident_note_add_view,
        }
        views = {
            "retry": self.retry_view,
            "retry-now": self.retry_now_view,
            "discard": self.discard_view,
            "requeue": self.requeue_view,
            "acknowledge": self.acknowledge_view,
            "release": self.release_view,
        }
        return [
            *(
                path(
                    f"{page}/", self.admin_site.admin_view(view), name="{}_{}_{}".format(*info, page.replace("/", "_"))
                )
                for page, view in pages.items()
            ),
            *(
                path(
                    f"<path:object_id>/{action}/",
                    self.admin_site.admin_view(view),
                    name="{}_{}_{}".format(*info, action.replace("-", "_")),
                )
                for action, view in views.items()
            ),
            *super().get_urls(),
        ]

    # --- operator actions

    def _report(self, request: HttpRequest, verb: str, result: ActionResult, *, not_applicable: str) -> None:
        changed, skipped = result
        noun = "notification" if changed == 1 else "notifications"
        text = f"{verb} {changed} {noun}"
        if skipped:
            text += f"; skipped {skipped} that {'was' if skipped == 1 else 'were'} {not_applicable}"
        self.message_user(request, text + ".", messages.SUCCESS if changed else messages.WARNING)

    def _selected_ids(self, request: HttpRequest, queryset: QuerySet[Notification]) -> list[Any] | None:
        ids = list(queryset.values_list("pk", flat=True)[: ACTION_MAX_ROWS + 1])
        if len(ids) > ACTION_MAX_ROWS:
            self.message_user(
                request,
                f"More than {ACTION_MAX_ROWS:,} notifications selected; narrow the selection with the filters "
                "(for example status Parked) and try again.",
                messages.ERROR,
            )
            return None
        return ids

    @admin.action(description="Retry selected parked notifications", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = notification_retry(notification_ids=ids, user=request.user)
            self._report(request, "Retried", result, not_applicable="not Parked")
            at = retried_at(ids) if result.changed else None
            if at is not None:
                self.message_user(request, redrive_link(at), messages.INFO)

    @admin.action(description="Retry selected retrying notifications now", permissions=["retry"])
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = notification_retry_now(notification_ids=ids, user=request.user)
            self._report(request, "Retried now", result, not_applicable="not Retrying or being delivered")

    @admin.action(description="Discard selected notifications…", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> HttpResponse | None:
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        return self._discard(request, ids)

    @admin.action(description="Requeue selected discarded notifications", permissions=["requeue"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = notification_requeue(notification_ids=ids, user=request.user)
            self._report(request, "Requeued", result, not_applicable="not Discarded")
            at = retried_at(ids) if result.changed else None
            if at is not None:
                self.message_user(request, redrive_link(at), messages.INFO)

    @admin.action(description="Deliver selected suppressed notifications anyway", permissions=["retry"])
    def release_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = notification_release(notification_ids=ids, user=request.user)
            self._report(request, "Released", result, not_applicable="not Suppressed or held for a digest")

    def flood_report_view(self, request: HttpRequest) -> HttpResponse:
        return flood_report_page(self, request)

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._single_action(
            request,
            object_id,
            allowed=self.has_retry_permission(request),
            action=notification_release,
            verb="Released",
            not_applicable="not Suppressed or held for a digest",
        )

    def _discard(
        self, request: HttpRequest, ids: list[Any], *, single: Notification | None = None
    ) -> TemplateResponse | None:
        """The confirmation page (with the required reason), or the discard once confirmed."""
        form = DiscardForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            result = notification_discard(notification_ids=ids, user=request.user, reason=form.cleaned_data["reason"])
            self._report(
                request, "Discarded", result, not_applicable="not Pending, Retrying or Parked, or being delivered"
            )
            return None
        notifications = Notification.objects.filter(pk__in=ids).only(
            "notification_id", "status", "subject", "created_at"
        )
        discardable = [n for n in notifications if n.status in DISCARDABLE]
        context = {
            **self.admin_site.each_context(request),
            "title": "Discard notifications?",
            "opts": self.opts,
            "ids": ids,
            "discardable": discardable[:200],
            "discardable_count": len(discardable),
            "skipped_count": len(ids) - len(discardable),
            "single": single,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/notifications/notification/discard_confirmation.html", context)

    def _single_action(
        self,
        request: HttpRequest,
        object_id: str,
        *,
        allowed: bool,
        action: Callable[..., ActionResult],
        verb: str,
        not_applicable: str,
    ) -> HttpResponseBase:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not allowed:
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return missing_object_redirect(self, request, object_id)
        self._report(request, verb, action(notification_ids=[obj.pk], user=request.user), not_applicable=not_applicable)
        return HttpResponseRedirect(reverse("admin:notifications_notification_change", args=[obj.pk]))

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._single_action(
            request,
            object_id,
            allowed=self.has_retry_permission(request),
            action=notification_retry,
            verb="Retried",
            not_applicable="not Parked",
        )

    def retry_now_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._single_action(
            request,
            object_id,
            allowed=self.has_retry_permission(request),
            action=notification_retry_now,
            verb="Retried now",
            not_applicable="not Retrying or being delivered",
        )

    def requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._single_action(
            request,
            object_id,
            allowed=self.has_requeue_permission(request),
            action=notification_requeue,
            verb="Requeued",
            not_applicable="not Discarded",
        )

    def discard_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        if not self.has_discard_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return missing_object_redirect(self, request, object_id)
        response = self._discard(request, [obj.pk], single=obj)  # a GET shows the confirmation
        if response is not None:
            return response
        return HttpResponseRedirect(reverse("admin:notifications_notification_change", args=[obj.pk]))


def occurrences_text(obj: Notification) -> str:
    """ "×37, last 10:42" for a row that stood for duplicates (in the console's zone); else ""."""
    if obj.occurrences <= 1 or obj.last_occurrence_at is None:
        return ""
    last = timezone.localtime(obj.last_occurrence_at)
    return f"×{obj.occurrences}, last {last:%H:%M}"


def suppression_badge(obj: Notification) -> str:
    """The duplicates a row stood for, and a hold for a flood digest, as badges."""
    parts = []
    text = occurrences_text(obj)
    if text:
        parts.append(format_html(' <span class="outbox-badge outbox-occurrences">{}</span>', text))
    if obj.status == Status.PENDING and obj.held_for_digest is not None:
        parts.append(
            format_html(' <span class="outbox-badge outbox-held" title="{}">held</span>', "held for a flood digest")
        )
    if obj.status == Status.SUPPRESSED and obj.suppressed_by:
        parts.append(format_html(' <span class="outbox-reason">{}</span>', obj.suppressed_reason))
    return format_html_join("", "{}", ((part,) for part in parts))


def clipped(text: str, fits: int, *, limit: int = 1000) -> str:
    """``text`` on one line of a table cell. Longer than ``fits`` characters, it is a
    <details> whose summary is cut with an ellipsis and which opens (click, tap, Enter or Space)
    to the full text (up to ``limit`` characters), so it never needs a mouse hover."""
    if len(text) <= fits:
        return format_html('<span class="outbox-nowrap">{}</span>', text)
    shown = text[:limit] + ("…" if len(text) > limit else "")
    return format_html(
        '<details class="outbox-clip"><summary title="Show the full text">{}</summary>'
        '<div class="outbox-clip-full">{}</div></details>',
        text,
        shown,
    )


def time_html(value: Any) -> SafeString:
    """A timestamp as every console page shows it: seconds and zone, in the chosen zone."""
    if value is None:
        return format_html("{}", "—")
    return format_html('<time class="outbox-nowrap" datetime="{}">{}</time>', value.isoformat(), console_time(value))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def local_delivery_badge(obj: Notification) -> str:
    """The "delivered locally at the site" badge of a row whose site's agent delivered it through
    its own relay while central was unreachable (notifications.local_delivery); empty otherwise."""
    if obj.delivered_locally_at is None:
        return ""
    return format_html(
        ' <span class="outbox-badge outbox-local" title="{}">delivered locally at the site</span>',
        f"The site's agent sent it through its local relay at {console_time(obj.delivered_locally_at)}",
    )
