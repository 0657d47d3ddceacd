"""Sites in the admin: register and deactivate sites, see when each was last heard from and what
its agent reported (backlog, parked rows, a "silent" badge, or "direct" for a site without an
agent), issue keys (the plaintext is shown once) and revoke them, see its watchdogs
(sites.watchdogs_admin). "Parked at sites" lists notifications parked at the sites, with Retry
and Discard (with a reason) sent to the site's agent as commands; "Site commands" is their
history (pending / done / failed)."""

import uuid
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from rest_framework_api_key.models import APIKey

from notifications.admin.common import ReadOnlyRecords
from notifications.clock import database_now
from notifications.models import Notification
from sites import staff_keys_admin  # noqa: F401  (registers the staff API keys' admin)
from sites.models import Site, SiteAPIKey, SiteCommand, SiteHeartbeat, SiteParkedNotification
from sites.services import (
    SiteCommandError,
    SiteKeyError,
    site_commands_issue,
    site_is_silent,
    site_key_issue,
    site_key_revoke,
)
from sites.watchdogs_admin import WatchdogInline

# Central authenticates sites with SiteAPIKey only; the library's generic APIKey model is
# unused, and listing it beside site keys would suggest keys that authenticate nothing.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


class SiteAPIKeyInline(admin.TabularInline):
    model = SiteAPIKey
    fields = ("prefix", "name", "created", "expiry_date", "last_used_at", "state", "revoke_link")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name = "API key"
    verbose_name_plural = "API keys (issue new keys with the button above; revocation cannot be undone)"

    @admin.display(description="state")
    def state(self, key: SiteAPIKey) -> str:
        if key.revoked:
            return "revoked"
        if key.has_expired:
            return "expired"
        return "live"

    @admin.display(description="")
    def revoke_link(self, key: SiteAPIKey) -> str:
        if key.revoked:
            return ""
        url = reverse("admin:sites_site_revoke_key", args=[key.site_id, key.prefix])
        return format_html('<a href="{}" class="revoke-key-link">Revoke…</a>', url)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class IssueKeyForm(forms.Form):
    """The optional name and expiry of a key being issued (defaults: a dated name, no expiry)."""

    name = forms.CharField(
        required=False,
        max_length=SiteAPIKey._meta.get_field("name").max_length,
        error_messages={"max_length": "The key name can be at most %(limit_value)d characters long."},
    )
    expiry_date = forms.DateTimeField(
        required=False,
        label="Expires (UTC)",
        error_messages={"invalid": "Enter the expiry as a date and time, e.g. 2027-01-31 18:00."},
    )

    def clean_expiry_date(self) -> Any:
        expiry = self.cleaned_data.get("expiry_date")
        if expiry is not None and expiry <= timezone.now():
            raise forms.ValidationError(
                "The expiry must be in the future; a key that expired at once would be useless."
            )
        return expiry


def _when(moment: Any) -> str:
    return "—" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S}"


def _fallback_line(fallback: Any) -> str:
    """The agent's local fallback relay as its heartbeat reported it, in one line."""
    if not isinstance(fallback, dict):
        return format_html("{}", "no local fallback relay configured")
    state = (
        "active: central unreachable, urgent notifications go to the local relay"
        if fallback.get("active")
        else ("configured, not active")
    )
    error = ""
    if fallback.get("last_error"):
        error = format_html(" · last error {}: {}", fallback.get("last_error_at") or "?", fallback["last_error"])
    return format_html(
        '<span class="site-fallback">local fallback relay {} · {} delivered locally · {} failing{}</span>',
        state,
        fallback.get("delivered", 0),
        fallback.get("failing", 0),
        error,
    )


def silent_badge(heartbeat: SiteHeartbeat | None, *, now: Any, last_seen_at: Any = None) -> str:
    """The "silent" badge for a site whose agent has sent heartbeats but none for
    OUTBOX_SITE_SILENT_AFTER; empty for a site heard from in time. A site whose agent never sent
    one posts directly: "direct" and its last post (``last_seen_at``), never silent."""
    if heartbeat is None:
        if last_seen_at is None:
            return format_html('<span class="site-never-heard">{}</span>', "not heard from yet")
        return format_html(
            '<span class="outbox-badge outbox-direct site-direct" title="{}">direct</span> last post {} UTC',
            "No agent heartbeats: this site posts to central directly, so it is never shown silent",
            _when(last_seen_at),
        )
    if not site_is_silent(last_heartbeat_at=heartbeat.received_at, now=now):
        return ""
    title = f"Last heartbeat {_when(heartbeat.received_at)} UTC"
    return format_html('<span class="outbox-badge outbox-status-parked site-silent" title="{}">silent</span>', title)


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = (
        "site_id",
        "name",
        "active",
        "silent_column",
        "heartbeat_column",
        "backlog_column",
        "parked_column",
        "agent_version_column",
        "last_seen_at",
        "live_keys",
    )
    list_filter = ("active",)
    search_fields = ("site_id", "name")
    readonly_fields = ("created_at", "last_seen_at", "agent_state", "agent_details", "refused_keys")
    inlines = [SiteAPIKeyInline, WatchdogInline]

    class Media:
        css = {"all": ["notifications/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Site]:
        return (
            super()
            .get_queryset(request)
            .select_related("heartbeat")
            .annotate(live_keys=Count("api_keys", filter=Q(api_keys__revoked=False)))
        )

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        self._now = database_now()  # one clock for every row's silent badge
        return super().changelist_view(request, extra_context)

    @staticmethod
    def _heartbeat(site: Site) -> SiteHeartbeat | None:
        try:
            return site.heartbeat
        except SiteHeartbeat.DoesNotExist:
            return None

    @admin.display(description="unrevoked keys", ordering="live_keys")
    def live_keys(self, site: Any) -> int:
        return site.live_keys

    @admin.display(description="silent / direct")
    def silent_column(self, site: Site) -> str:
        if not site.active:
            return ""
        now = getattr(self, "_now", None) or database_now()
        return silent_badge(self._heartbeat(site), now=now, last_seen_at=site.last_seen_at)

    @admin.display(description="last heartbeat (UTC)", ordering="heartbeat__received_at")
    def heartbeat_column(self, site: Site) -> str:
        heartbeat = self._heartbeat(site)
        return _when(None if heartbeat is None else heartbeat.received_at)

    @admin.display(description="backlog at site", ordering="heartbeat__buffered")
    def backlog_column(self, site: Site) -> Any:
        heartbeat = self._heartbeat(site)
        return "—" if heartbeat is None else heartbeat.buffered

    @admin.display(description="parked at site", ordering="heartbeat__parked")
    def parked_column(self, site: Site) -> Any:
        heartbeat = self._heartbeat(site)
        if heartbeat is None:
            return "—"
        if not heartbeat.parked:
            return 0
        url = reverse("admin:sites_siteparkednotification_changelist") + f"?site__id__exact={site.pk}"
        return format_html('<a href="{}">{}</a>', url, heartbeat.parked)

    @admin.display(description="agent")
    def agent_version_column(self, site: Site) -> str:
        heartbeat = self._heartbeat(site)
        return "" if heartbeat is None else heartbeat.agent_version

    @admin.display(description="agent (latest heartbeat)")
    def agent_state(self, site: Site) -> str:
        heartbeat = self._heartbeat(site)
        if heartbeat is None:
            return format_html(
                "{} No heartbeat received from this site's agent: it is never shown silent.",
                silent_badge(None, now=None, last_seen_at=site.last_seen_at),
            )
        badge = silent_badge(heartbeat, now=database_now()) if site.active else ""
        return format_html(
            "{} {} UTC · agent {} · {} buffered (oldest {}) · {} parked · last forward {} UTC{}",
            badge,
            _when(heartbeat.received_at),
            heartbeat.agent_version or "?",
            heartbeat.buffered,
            _when(heartbeat.oldest_buffered_at),
            heartbeat.parked,
            _when(heartbeat.last_forward_at),
            format_html(" · last error: {}", heartbeat.last_error) if heartbeat.last_error else "",
        )

    @admin.display(description="agent reports")
    def agent_details(self, site: Site) -> str:
        """What newer agents add to their heartbeat: what they support, rows central answered
        5xx to again and again, their local fallback relay."""
        heartbeat = self._heartbeat(site)
        if heartbeat is None:
            return "—"
        lines: list[str] = [format_html("capabilities: {}", ", ".join(heartbeat.capabilities) or "none reported")]
        errors = heartbeat.server_errors if isinstance(heartbeat.server_errors, dict) else None
        if errors and errors.get("rows"):
            lines.append(
                format_html(
                    '<span class="site-server-errors">{} row{} answered 5xx by central again and again since {} '
                    "(retried with back-off, never parked): {}</span>",
                    errors.get("rows"),
                    "" if errors.get("rows") == 1 else "s",
                    errors.get("since") or "?",
                    errors.get("last_error") or "no error text",
                )
            )
        else:
            lines.append(format_html("{}", "no row answered 5xx by central"))
        lines.append(_fallback_line(heartbeat.fallback))
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

    @admin.display(description="refused key attempts")
    def refused_keys(self, site: Site) -> str:
        """Requests refused although they carried one of this site's keys, per key prefix (the
        agent cannot report them: its heartbeat is refused too)."""
        refusals = list(site.key_refusals.all()) if site.pk else []
        if not refusals:
            return "None."
        return format_html(
            '<table class="outbox-targets" id="site-key-refusals"><thead><tr><th>key prefix</th><th>refused</th>'
            "<th>why (latest)</th><th>first (UTC)</th><th>last (UTC)</th><th>last client address</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (r.prefix, r.count, r.get_reason_display(), _when(r.first_at), _when(r.last_at), r.last_client)
                    for r in refusals
                ),
            ),
        )

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/issue-key/",
                self.admin_site.admin_view(self.issue_key_view),
                name="sites_site_issue_key",
            ),
            path(
                "<path:object_id>/revoke-key/<str:prefix>/",
                self.admin_site.admin_view(self.revoke_key_view),
                name="sites_site_revoke_key",
            ),
            *super().get_urls(),
        ]

    def _site_or_deny(self, request: HttpRequest, object_id: str) -> Site | None:
        if not self.has_change_permission(request):
            raise PermissionDenied
        return self.get_object(request, unquote(object_id))

    def _missing(self, request: HttpRequest, object_id: str) -> HttpResponse:
        # Django's own answer for a missing object (message + redirect); django-stubs do not
        # declare this ModelAdmin method.
        return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]

    def _context(self, request: HttpRequest, site: Site, title: str, **extra: Any) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "title": title, "opts": self.opts, "original": site, **extra}

    def issue_key_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST only: the new key's plaintext is in this one response and nowhere else."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        site = self._site_or_deny(request, object_id)
        if site is None:
            return self._missing(request, object_id)
        form = IssueKeyForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(str(error) for errors in form.errors.values() for error in errors)
            self.message_user(request, f"No key was issued: {problems}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:sites_site_change", args=[site.pk]))
        name = form.cleaned_data["name"].strip() or f"{site.site_id} key {timezone.now():%Y-%m-%d %H:%M}"
        api_key, plaintext = site_key_issue(site=site, name=name, expiry_date=form.cleaned_data["expiry_date"])
        self.log_change(request, site, f"Issued API key {api_key.prefix}.")
        response = TemplateResponse(
            request,
            "admin/sites/site/key_issued.html",
            self._context(request, site, f"New API key for {site.site_id}", api_key=api_key, plaintext=plaintext),
        )
        response["Cache-Control"] = "no-store"
        return response

    def revoke_key_view(self, request: HttpRequest, object_id: str, prefix: str) -> HttpResponse:
        site = self._site_or_deny(request, object_id)
        if site is None:
            return self._missing(request, object_id)
        api_key = site.api_keys.filter(prefix=prefix).first()
        if api_key is None:
            self.message_user(request, f"Site {site.site_id} has no key with prefix {prefix}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:sites_site_change", args=[site.pk]))
        if request.method != "POST":
            return TemplateResponse(
                request,
                "admin/sites/site/revoke_confirmation.html",
                self._context(request, site, f"Revoke key {prefix}?", api_key=api_key),
            )
        try:
            site_key_revoke(prefix=prefix)
        except SiteKeyError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.log_change(request, site, f"Revoked API key {prefix}.")
            self.message_user(request, f"Revoked key {prefix} of {site.site_id}; requests with it are now refused.")
        return HttpResponseRedirect(reverse("admin:sites_site_change", args=[site.pk]))


# --- Parked at sites ---------------------------------------------------------------------------

Parked = SiteParkedNotification.State
COMMAND_CSS: dict[str, str] = {"pending": "retrying", "done": "delivered", "failed": "parked", "expired": "discarded"}
STATE_CSS: dict[str, str] = {Parked.PARKED: "parked", Parked.RETRIED: "pending", Parked.DISCARDED: "discarded"}


class ParkedStateFilter(admin.SimpleListFilter):
    """Rows still parked at their site unless asked otherwise."""

    title = "state"
    parameter_name = "state"
    ALL = "all"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*Parked.choices, (self.ALL, "All")]

    def _current(self) -> str:
        value = self.value()
        return value if value in (*Parked.values, self.ALL) else Parked.PARKED

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        current = self._current()
        return queryset if current == self.ALL else queryset.filter(state=current)

    def choices(self, changelist: Any) -> Any:
        for value, label in self.lookup_choices:
            yield {
                "selected": self._current() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }


class CommandStateFilter(admin.SimpleListFilter):
    title = "latest command"
    parameter_name = "command"
    NONE = "none"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*SiteCommand.State.choices, (self.NONE, "No command")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == self.NONE:
            return queryset.filter(command_state__isnull=True)
        if self.value() in SiteCommand.State.values:
            return queryset.filter(command_state=self.value())
        return queryset


def _latest_command(field: str) -> Subquery:
    return Subquery(
        SiteCommand.objects.filter(
            site=OuterRef("site"),
            notification_id=OuterRef("notification_id"),
            action__in=SiteCommand.OPERATOR_ACTIONS,
        )
        .order_by("-created_at")
        .values(field)[:1]
    )


class DiscardAtSiteForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=2000,
        help_text="Why this notification is given up; recorded with the command and in the history.",
    )


class SiteRecordAdmin(ReadOnlyRecords, admin.ModelAdmin):
    """A record kept for a site's notification (a report from the site, a command to it):
    read-only in the console (operators act only through commands), found by a full
    notification id or the admin's search fields."""

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        try:
            return queryset.filter(notification_id=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)


@admin.register(SiteParkedNotification)
class SiteParkedNotificationAdmin(SiteRecordAdmin):
    list_display = (
        "short_id",
        "site",
        "state_badge",
        "command_column",
        "subject",
        "list_name",
        "type",
        "reason_excerpt",
        "retry_count",
        "parked_column",
        "at_central",
    )
    list_display_links = ("short_id",)
    list_filter = (ParkedStateFilter, CommandStateFilter, "site", "type")
    search_fields = ("subject", "list_name", "reason", "source_instance_id", "source_script")
    search_help_text = "Words in the subject, list, reason or source; or a full notification id."
    list_per_page = 100
    actions = ["retry_at_site", "discard_at_site"]
    fields = (
        "notification_id",
        "site",
        "state",
        "state_changed_at",
        "subject",
        "list_name",
        "type",
        "reason",
        "retry_count",
        "parked_at",
        "site_enqueued_at",
        "source_instance_id",
        "source_script",
        "reported_at",
        "commands_history",
        "at_central",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["notifications/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[SiteParkedNotification]:
        return (
            super()
            .get_queryset(request)
            .select_related("site")
            .annotate(
                command_action=_latest_command("action"),
                command_state=_latest_command("state"),
                command_detail=_latest_command("detail"),
                # Only the site's own notification: a site cannot have another site's linked here.
                central_status=Subquery(
                    Notification.objects.filter(
                        pk=OuterRef("notification_id"), source_site_id=OuterRef("site__site_id")
                    ).values("status")[:1]
                ),
            )
        )

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sites.retry_siteparkednotification")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sites.discard_siteparkednotification")

    # --- columns

    @admin.display(description="id", ordering="notification_id")
    def short_id(self, row: SiteParkedNotification) -> str:
        return str(row.notification_id)[:8]

    @admin.display(description="state", ordering="state")
    def state_badge(self, row: SiteParkedNotification) -> str:
        return format_html(
            '<span class="outbox-badge outbox-status-{}">{}</span>',
            STATE_CSS.get(row.state, "other"),
            row.get_state_display(),
        )

    @admin.display(description="latest command")
    def command_column(self, row: Any) -> str:
        if not getattr(row, "command_state", None):
            return ""
        return format_html(
            '<span class="outbox-badge outbox-status-{} site-command-{}" title="{}">{} {}</span>',
            COMMAND_CSS.get(row.command_state, "other"),
            row.command_state,
            row.command_detail or "",
            row.command_action,
            row.command_state,
        )

    @admin.display(description="reason")
    def reason_excerpt(self, row: SiteParkedNotification) -> str:
        text = " ".join(row.reason.split())
        if len(text) <= 80:
            return text
        return format_html('<span title="{}">{}…</span>', text[:1000], text[:80])

    @admin.display(description="parked (UTC)", ordering="parked_at")
    def parked_column(self, row: SiteParkedNotification) -> str:
        return _when(row.parked_at)

    @admin.display(description="at central")
    def at_central(self, row: Any) -> str:
        status = getattr(row, "central_status", None)
        if status is None:
            return "—"
        url = reverse("admin:notifications_notification_change", args=[row.notification_id])
        return format_html('<a href="{}">{}</a>', url, status)

    @admin.display(description="commands")
    def commands_history(self, row: SiteParkedNotification) -> str:
        commands = SiteCommand.objects.filter(site=row.site, notification_id=row.notification_id).select_related(
            "created_by"
        )
        if not commands:
            return "—"
        return format_html(
            '<table class="outbox-targets"><thead><tr><th>issued (UTC)</th><th>by</th><th>action</th>'
            "<th>reason</th><th>state</th><th>detail</th><th>acknowledged (UTC)</th></tr></thead><tbody>{}</tbody>"
            "</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (
                        _when(c.created_at),
                        c.created_by or "",
                        c.get_action_display(),
                        c.reason,
                        c.get_state_display(),
                        c.detail,
                        _when(c.acknowledged_at),
                    )
                    for c in commands
                ),
            ),
        )

    # --- actions

    def _report(self, request: HttpRequest, verb: str, outcomes: list[Any]) -> None:
        sent = [o for o in outcomes if o.command is not None]
        refused = [o for o in outcomes if o.command is None]
        if sent:
            noun = "notification" if len(sent) == 1 else "notifications"
            self.message_user(
                request,
                f"{verb} sent to the site's agent for {len(sent)} {noun}; it is executed at the agent's next "
                "heartbeat (see the latest command column).",
                messages.SUCCESS,
            )
        for outcome in refused[:20]:
            self.message_user(
                request,
                f"{outcome.parked.notification_id} at {outcome.parked.site}: {outcome.error}.",
                messages.WARNING,
            )

    @admin.action(description="Retry at the site (send a command to its agent)", permissions=["retry"])
    def retry_at_site(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._report(
            request,
            "Retry",
            site_commands_issue(parked_ids=self._ids(queryset), action="retry", user=cast(User, request.user)),
        )

    @admin.action(description="Discard at the site… (needs a reason)", permissions=["discard"])
    def discard_at_site(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        ids = self._ids(queryset)
        form = DiscardAtSiteForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            try:
                outcomes = site_commands_issue(
                    parked_ids=ids, action="discard", user=cast(User, request.user), reason=form.cleaned_data["reason"]
                )
            except SiteCommandError as error:
                form.add_error("reason", str(error))
            else:
                self._report(request, "Discard", outcomes)
                return None
        rows = list(SiteParkedNotification.objects.filter(pk__in=ids).select_related("site")[:200])
        context = {
            **self.admin_site.each_context(request),
            "title": "Discard notifications parked at sites?",
            "opts": self.opts,
            "ids": ids,
            "rows": rows,
            "count": len(ids),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/sites/siteparkednotification/discard_confirmation.html", context)

    @staticmethod
    def _ids(queryset: QuerySet) -> list[int]:
        return list(queryset.values_list("pk", flat=True)[:MAX_ACTION_ROWS])


MAX_ACTION_ROWS = 10_000


@admin.register(SiteCommand)
class SiteCommandAdmin(SiteRecordAdmin):
    """The history of commands sent to sites' agents. Read-only: Retry and Discard are issued from
    "Parked at sites"; Acknowledged commands come from acknowledgements made at central."""

    list_display = (
        "created_at",
        "site",
        "action",
        "notification_id",
        "state_badge",
        "detail",
        "reason",
        "created_by",
        "sent_at",
        "acknowledged_at",
    )
    list_filter = ("state", "action", "site")
    search_fields = ("reason", "detail")
    list_select_related = ("site", "created_by")
    readonly_fields = (
        "id",
        "site",
        "notification_id",
        "action",
        "reason",
        "state",
        "detail",
        "created_at",
        "created_by",
        "sent_at",
        "acknowledged_at",
        "details",
        "expires_at",
    )
    fields = readonly_fields

    class Media:
        css = {"all": ["notifications/admin.css"]}

    @admin.display(description="state", ordering="state")
    def state_badge(self, command: SiteCommand) -> str:
        return format_html(
            '<span class="outbox-badge outbox-status-{}">{}</span>',
            COMMAND_CSS.get(command.state, "other"),
            command.get_state_display(),
        )
