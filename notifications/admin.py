"""The operations console: the Notification Outbox page, notification detail, operator actions,
and the delivery configuration (notification lists, SMTP).

Notification rows are read-only here for everyone; the only writes are Retry and Discard,
which go through notifications.operations. The outbox page is built for tables of millions of
rows: no full COUNT(*) (see OutboxPaginator), no date drill-down, no facet counts, no per-row
queries, and the KPI tiles are one aggregate query (notifications.kpis).
"""

import json
import uuid
from datetime import datetime, time, timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count, F
from django.db.models.lookups import Lookup
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.text import smart_split, unescape_string_literal

from notifications.adapters import TYPE_CHOICES
from notifications.kpis import kpis_compute
from notifications.models import DeliveryAttempt, EmailRecipient, Notification, NotificationList, SmtpConfiguration
from notifications.operations import notification_discard, notification_retry, smtp_configuration_send_test
from sites.models import Site

Status = Notification.Status

# One action never loads more ids than this; "select all" across millions of rows must be
# narrowed with filters first.
ACTION_MAX_ROWS = 10_000


def stuck_before(now=None):
    """Non-terminal rows created before this instant are stuck (display only, DESIGN §6)."""
    return (now or timezone.now()) - timedelta(seconds=settings.OUTBOX_STUCK_AGE)


def outbox_kpis():
    """The KPI tiles' data (one aggregate query, owned by notifications.kpis)."""
    return kpis_compute()


# --- Paging without COUNT(*) ---------------------------------------------------------------


class OutboxPaginator(Paginator):
    """Counts exactly up to ``exact_limit`` matching rows; beyond that, on PostgreSQL, uses the
    planner's row estimate, so a page never scans the whole table just to number its pages.

    ``is_estimate`` says whether ``count`` is an estimate (the template marks it with "≈").
    """

    exact_limit = 10_000

    is_estimate = False

    @cached_property
    def count(self):
        rows = self.object_list.order_by().values("pk")
        capped = rows[: self.exact_limit + 1].count()
        if capped <= self.exact_limit:
            return capped
        if connection.vendor != "postgresql":
            return rows.count()  # SQLite is the small embedded database: exact is affordable
        self.is_estimate = True
        return max(capped, _planner_estimate(rows))


def _planner_estimate(queryset):
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


# --- Search ---------------------------------------------------------------------------------


class ILike(Lookup):
    """``lhs ILIKE rhs``: unlike Django's ``icontains`` (UPPER(…) LIKE UPPER(…)) this can use the
    trigram GIN index on subject (migration 0002). Used as a filter expression only."""

    lookup_name = "ilike"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} ILIKE {rhs}", (*lhs_params, *rhs_params)


def _like_escape(term):
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def subject_search(queryset, search_term):
    """Rows whose subject contains every word of ``search_term`` (case-insensitive); a search
    that is exactly a notification id finds that notification."""
    try:
        return queryset.filter(pk=uuid.UUID(search_term.strip()))
    except ValueError:
        pass
    for word in smart_split(search_term):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        if not word:
            continue
        if connection.vendor == "postgresql":
            queryset = queryset.filter(ILike(F("subject"), f"%{_like_escape(word)}%"))
        else:
            queryset = queryset.filter(subject__icontains=word)
    return queryset


# --- Filters --------------------------------------------------------------------------------

QUEUED = "queued"


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(QUEUED, "Queued (Pending or Retrying)"), *Status.choices]

    def queryset(self, request, queryset):
        if self.value() == QUEUED:
            return queryset.filter(status__in=Notification.NON_TERMINAL)
        if self.value() in Status.values:
            return queryset.filter(status=self.value())
        return queryset


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        minutes = settings.OUTBOX_STUCK_AGE // 60
        return [("1", f"Stuck only (queued over {minutes} min)" if minutes else "Stuck only")]

    def queryset(self, request, queryset):
        if self.value() == "1":
            return queryset.filter(status__in=Notification.NON_TERMINAL, created_at__lt=stuck_before())
        return queryset


class TypeFilter(admin.SimpleListFilter):
    title = "type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        return TYPE_CHOICES

    def queryset(self, request, queryset):
        return queryset.filter(type=self.value()) if self.value() else queryset


class _ValueFromTableFilter(admin.SimpleListFilter):
    """Choices come from a small configuration table, never from DISTINCT over the outbox;
    a value no longer in that table (a deleted site) still filters when given in the URL."""

    field = None

    def known_values(self):
        raise NotImplementedError

    def lookups(self, request, model_admin):
        choices = list(self.known_values())
        current = self.value()
        if current and current not in {value for value, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class SourceSiteFilter(_ValueFromTableFilter):
    title = "source site"
    parameter_name = "site"
    field = "source_site_id"

    def known_values(self):
        return [(site_id, f"{site_id} ({name})") for site_id, name in Site.objects.values_list("site_id", "name")]


class ListNameFilter(_ValueFromTableFilter):
    title = "list"
    parameter_name = "list"
    field = "list_name"

    def known_values(self):
        return [(name, name) for name in NotificationList.objects.values_list("name", flat=True)]


class CreatedRangeFilter(admin.ListFilter):
    """Created-at from/to (UTC), as two inputs rather than the date drill-down, which runs a
    DISTINCT over dates of the whole table. A date alone means the whole day; "to" is inclusive."""

    title = "created (UTC)"
    template = "admin/notifications/notification/created_range_filter.html"
    from_param, to_param = "created_from", "created_to"

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.bounds = {}
        for name in (self.from_param, self.to_param):
            if name in params:
                raw = params.pop(name)[-1].strip()
                self.used_parameters[name] = raw
                if raw:
                    bound = self._parse(raw, end=name == self.to_param)
                    if bound is None:
                        messages.warning(request, f"Ignored the created-at bound {raw!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM.")
                    else:
                        self.bounds[name] = bound

    @staticmethod
    def _parse(raw, *, end):
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
        return moment

    def has_output(self):
        return True

    def expected_parameters(self):
        return [self.from_param, self.to_param]

    def queryset(self, request, queryset):
        if self.from_param in self.bounds:
            queryset = queryset.filter(created_at__gte=self.bounds[self.from_param])
        if self.to_param in self.bounds:
            raw = self.used_parameters[self.to_param]
            # A date-only "to" already points at the next midnight: exclusive; a moment is inclusive.
            lookup = "created_at__lt" if _is_date(raw) else "created_at__lte"
            queryset = queryset.filter(**{lookup: self.bounds[self.to_param]})
        return queryset

    def choices(self, changelist):
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


def _is_date(raw):
    try:
        return parse_date(raw) is not None
    except ValueError:
        return False


# --- The Notification Outbox page -----------------------------------------------------------


class OutboxChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        # The list never shows the large columns; do not read them for a page of 100 rows.
        return super().get_queryset(request, exclude_parameters).defer("body", "type_data", "resolved_targets")


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ("started_at", "duration_ms", "outcome", "error", "detail_display", "worker")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "delivery attempts"

    @admin.display(description="detail")
    def detail_display(self, attempt):
        return _json_block(attempt.detail) if attempt.detail else "—"

    # Attempts are part of the notification's audit record: whoever may view the notification
    # sees them; nobody edits them.
    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("notifications.view_notification")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _json_block(value):
    return format_html('<pre class="outbox-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False, default=str))


STATUS_CSS = {
    Status.PENDING: "pending",
    Status.RETRYING: "retrying",
    Status.DELIVERED: "delivered",
    Status.PARKED: "parked",
    Status.DISCARDED: "discarded",
}


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = (
        "short_id",
        "status_badge",
        "stuck_badge",
        "type",
        "list_column",
        "subject",
        "site_column",
        "created_column",
        "retries_column",
        "last_error_excerpt",
    )
    list_display_links = ("short_id",)
    list_filter = (StatusFilter, StuckFilter, TypeFilter, SourceSiteFilter, ListNameFilter, CreatedRangeFilter)
    search_fields = ("subject",)
    search_help_text = "Words in the subject (all must match), or a full notification id."
    sortable_by = ("created_column",)  # the only order with an index behind it
    list_per_page = 100
    list_max_show_all = 1000
    paginator = OutboxPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_selected", "discard_selected"]
    inlines = [DeliveryAttemptInline]

    fieldsets = (
        (None, {"fields": ("notification_id", "status_badge", "stuck_badge", "type", "list_name", "subject", "body")}),
        (
            "Delivery",
            {
                "fields": (
                    "retry_count",
                    "last_error",
                    "resolved_targets_display",
                    "type_data_display",
                    "last_attempt_at",
                    "next_attempt_at",
                    "delivered_at",
                    "claim_display",
                )
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
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    class Media:
        css = {"all": ["notifications/admin.css"]}

    # Rows are an audit record: nobody adds, edits or deletes them here (DESIGN §2, §5).
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm("notifications.retry_notification")

    def has_discard_permission(self, request, obj=None):
        return request.user.has_perm("notifications.discard_notification")

    def get_changelist(self, request, **kwargs):
        return OutboxChangeList

    def get_search_results(self, request, queryset, search_term):
        return subject_search(queryset, search_term), False

    # --- columns

    @admin.display(description="id", ordering="notification_id")
    def short_id(self, obj):
        return str(obj.notification_id)[:8]

    @admin.display(description="status")
    def status_badge(self, obj):
        return format_html(
            '<span class="outbox-badge outbox-status-{}">{}</span>', STATUS_CSS.get(obj.status, "other"), obj.status
        )

    @admin.display(description="stuck")
    def stuck_badge(self, obj):
        # Computed from the row itself: no query per row.
        if obj.status in Notification.NON_TERMINAL and obj.created_at < stuck_before():
            return format_html('<span class="outbox-badge outbox-stuck" title="{}">stuck</span>', "Queued longer than the stuck-age threshold")
        return ""

    @admin.display(description="list")
    def list_column(self, obj):
        return obj.list_name

    @admin.display(description="site")
    def site_column(self, obj):
        return obj.source_site_id

    @admin.display(description="created (UTC)", ordering="created_at")
    def created_column(self, obj):
        return format_html('<span class="outbox-nowrap">{}</span>', f"{obj.created_at:%Y-%m-%d %H:%M:%S}")

    @admin.display(description="retries")
    def retries_column(self, obj):
        return obj.retry_count

    @admin.display(description="last error")
    def last_error_excerpt(self, obj):
        text = " ".join(obj.last_error.split())
        if len(text) <= 60:
            return text
        return format_html('<span title="{}">{}…</span>', text[:1000], text[:60])

    # --- detail fields

    @admin.display(description="resolved targets")
    def resolved_targets_display(self, obj):
        targets = obj.resolved_targets
        if not targets:
            return "— (not delivered yet; targets are resolved at delivery time)"
        if isinstance(targets, dict):
            targets = [dict(target=key, **(value if isinstance(value, dict) else {"outcome": value})) for key, value in targets.items()]
        if not (isinstance(targets, list) and all(isinstance(t, dict) for t in targets)):
            return _json_block(obj.resolved_targets)
        columns = []
        for target in targets:
            columns.extend(key for key in target if key not in columns)
        head = format_html_join("", "<th>{}</th>", ((c.replace("_", " "),) for c in columns))
        rows = format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((_cell(t.get(c)),) for c in columns)),) for t in targets),
        )
        return format_html('<table class="outbox-targets"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows)

    @admin.display(description="type data")
    def type_data_display(self, obj):
        return _json_block(obj.type_data) if obj.type_data else "—"

    @admin.display(description="claim")
    def claim_display(self, obj):
        if not obj.claimed_by:
            return "—"
        return f"{obj.claimed_by} until {obj.claimed_until:%Y-%m-%d %H:%M:%S} UTC" if obj.claimed_until else obj.claimed_by

    @admin.display(description="source site")
    def source_site_display(self, obj):
        site = Site.objects.filter(site_id=obj.source_site_id).only("pk", "name").first()
        if site is None:
            return f"{obj.source_site_id} (no longer registered)"
        url = reverse("admin:sites_site_change", args=[site.pk])
        return format_html('<a href="{}">{}</a> ({})', url, obj.source_site_id, site.name)

    # --- page context

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "outbox_kpis": outbox_kpis(), "stuck_age_minutes": settings.OUTBOX_STUCK_AGE // 60}
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, unquote(object_id))
        parked = obj is not None and obj.status == Status.PARKED
        extra_context = {
            **(extra_context or {}),
            "can_retry": parked and self.has_retry_permission(request),
            "can_discard": parked and self.has_discard_permission(request),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("<path:object_id>/retry/", self.admin_site.admin_view(self.retry_view), name="%s_%s_retry" % info),
            path("<path:object_id>/discard/", self.admin_site.admin_view(self.discard_view), name="%s_%s_discard" % info),
            *super().get_urls(),
        ]

    # --- operator actions

    def _report(self, request, verb, changed, skipped):
        noun = "notification" if changed == 1 else "notifications"
        text = f"{verb} {changed} {noun}"
        if skipped:
            text += f"; skipped {skipped} that {'was' if skipped == 1 else 'were'} not Parked"
        self.message_user(request, text + ".", messages.SUCCESS if changed else messages.WARNING)

    def _selected_ids(self, request, queryset):
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
    def retry_selected(self, request, queryset):
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            self._report(request, "Retried", *notification_retry(notification_ids=ids, user=request.user))

    @admin.action(description="Discard selected parked notifications…", permissions=["discard"])
    def discard_selected(self, request, queryset):
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        if request.POST.get("post") != "yes":
            return self._discard_confirmation(request, ids)
        self._report(request, "Discarded", *notification_discard(notification_ids=ids, user=request.user))
        return None

    def _discard_confirmation(self, request, ids, *, single=None):
        notifications = Notification.objects.filter(pk__in=ids).only("notification_id", "status", "subject", "created_at")
        parked = [n for n in notifications if n.status == Status.PARKED]
        context = {
            **self.admin_site.each_context(request),
            "title": "Discard parked notifications?",
            "opts": self.opts,
            "ids": ids,
            "parked": parked[:200],
            "parked_count": len(parked),
            "skipped_count": len(ids) - len(parked),
            "single": single,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/notifications/notification/discard_confirmation.html", context)

    def retry_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_retry_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        self._report(request, "Retried", *notification_retry(notification_ids=[obj.pk], user=request.user))
        return HttpResponseRedirect(reverse("admin:notifications_notification_change", args=[obj.pk]))

    def discard_view(self, request, object_id):
        if not self.has_discard_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if request.method != "POST" or request.POST.get("post") != "yes":
            return self._discard_confirmation(request, [obj.pk], single=obj)
        self._report(request, "Discarded", *notification_discard(notification_ids=[obj.pk], user=request.user))
        return HttpResponseRedirect(reverse("admin:notifications_notification_change", args=[obj.pk]))


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# --- Delivery configuration -----------------------------------------------------------------


class NotificationListForm(forms.ModelForm):
    class Meta:
        model = NotificationList
        fields = ("name", "description")

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        clash = NotificationList.objects.filter(name__iexact=name).exclude(pk=self.instance.pk)
        if clash.exists():
            raise ValidationError(f"A list named {clash.first().name!r} already exists (list names ignore case).")
        return name


class EmailRecipientFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        seen = set()
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or form.cleaned_data.get("DELETE"):
                continue
            email = (form.cleaned_data.get("email") or "").strip().lower()
            if not email:
                continue
            if email in seen:
                form.add_error("email", f"{email} is already in this list (addresses ignore case).")
            seen.add(email)


class EmailRecipientInline(admin.TabularInline):
    model = EmailRecipient
    formset = EmailRecipientFormSet
    extra = 1
    fields = ("email",)


@admin.register(NotificationList)
class NotificationListAdmin(admin.ModelAdmin):
    form = NotificationListForm
    inlines = [EmailRecipientInline]
    list_display = ("name", "recipient_count", "description")
    search_fields = ("name", "email_recipients__email")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(recipient_count=Count("email_recipients"))

    @admin.display(description="email recipients", ordering="recipient_count")
    def recipient_count(self, obj):
        return obj.recipient_count


class SmtpConfigurationForm(forms.ModelForm):
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored password is never shown. Leave blank to keep it.",
    )
    clear_password = forms.BooleanField(required=False, label="Remove the stored password")

    class Meta:
        model = SmtpConfiguration
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["password"] = ""
        stored = "A password is stored." if self.instance.pk and self.instance.password else "No password is stored."
        self.fields["password"].help_text = f"{stored} {self.fields['password'].help_text}"

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("clear_password"):
            cleaned["password"] = ""
        elif not cleaned.get("password"):
            cleaned["password"] = self.instance.password if self.instance.pk else ""
        return cleaned


class SendTestForm(forms.Form):
    to = forms.EmailField(label="Send a test message to")


@admin.register(SmtpConfiguration)
class SmtpConfigurationAdmin(admin.ModelAdmin):
    form = SmtpConfigurationForm
    fieldsets = (
        ("Server", {"fields": ("host", "port", "security", "timeout_seconds")}),
        ("Authentication", {"fields": ("username", "password", "clear_password")}),
        ("Messages", {"fields": ("from_address",)}),
        ("Retry policy for email", {"fields": ("max_retries", "retry_interval_seconds")}),
    )

    def has_add_permission(self, request):
        # A singleton: once configured there is only something to change.
        return super().has_add_permission(request) and not SmtpConfiguration.objects.exists()

    def changelist_view(self, request, extra_context=None):
        config = SmtpConfiguration.current()
        if config is not None and self.has_view_or_change_permission(request):
            return HttpResponseRedirect(reverse("admin:notifications_smtpconfiguration_change", args=[config.pk]))
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        return [
            path(
                "<path:object_id>/send-test/",
                self.admin_site.admin_view(self.send_test_view),
                name="notifications_smtpconfiguration_send_test",
            ),
            *super().get_urls(),
        ]

    def send_test_view(self, request, object_id):
        if not self.has_change_permission(request):
            raise PermissionDenied
        config = self.get_object(request, unquote(object_id))
        if config is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        result = None
        if request.method == "POST":
            form = SendTestForm(request.POST)
            if form.is_valid():
                result = smtp_configuration_send_test(config=config, to=form.cleaned_data["to"])
                level = messages.SUCCESS if result.ok else messages.ERROR
                outcome = "accepted the test message" if result.ok else "did not accept the test message"
                self.message_user(request, f"{config.host}:{config.port} {outcome}: {result.reply}", level)
        else:
            form = SendTestForm(initial={"to": request.user.email})
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a test email",
            "opts": self.opts,
            "original": config,
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/notifications/smtpconfiguration/send_test.html", context)
