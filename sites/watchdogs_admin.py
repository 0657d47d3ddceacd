"""Watchdogs in the console (sites.watchdogs): every site's watchdogs with their state, interval,
list and last ping, and the notifications they raised — read-only for Operators and
Administrators; Administrators may **retire** a watchdog (it is no longer judged; a ping made
later brings it back). The site's page lists its watchdogs too, and "Watchdog notifications"
is the record of every notification raised for a watchdog or a silent site."""

from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from notifications.admin.common import ReadOnlyRecords
from notifications.console_time import console_time
from notifications.models import Notification
from sites.models import Watchdog, WatchdogAlert
from sites.watchdogs import watchdogs_retire

STATE_CSS: dict[str, str] = {
    Watchdog.State.OK: "delivered",
    Watchdog.State.SILENT: "parked",
    Watchdog.State.RETIRED: "discarded",
}
MAX_ACTION_ROWS = 10_000


def watchdog_state_badge(watchdog: Watchdog) -> str:
    return format_html(
        '<span class="outbox-badge outbox-status-{} watchdog-{}">{}</span>',
        STATE_CSS.get(watchdog.state, "other"),
        watchdog.state,
        watchdog.get_state_display(),
    )


def notification_link(notification_id: Any, text: str) -> str:
    url = reverse("admin:notifications_notification_change", args=[notification_id])
    return format_html('<a href="{}">{}</a>', url, text)


class WatchdogAlertInline(admin.TabularInline):
    model = WatchdogAlert
    fk_name = "watchdog"
    fields = ("raised_at", "kind", "list_name", "type", "notification")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "notifications raised"

    @admin.display(description="notification")
    def notification(self, alert: WatchdogAlert) -> str:
        return notification_link(alert.notification_id, str(alert.notification_id))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WatchdogInline(admin.TabularInline):
    """The site page's watchdogs (read-only; retire them from the Watchdogs list)."""

    model = Watchdog
    fields = ("name_link", "state_column", "every_seconds", "list_name", "type", "last_ping_at", "silent_since")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "watchdogs (dead-man switches of the site's scripts)"

    @admin.display(description="name")
    def name_link(self, watchdog: Watchdog) -> str:
        url = reverse("admin:sites_watchdog_change", args=[watchdog.pk])
        return format_html('<a href="{}">{}</a>', url, watchdog.name)

    @admin.display(description="state")
    def state_column(self, watchdog: Watchdog) -> str:
        return watchdog_state_badge(watchdog)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Watchdog)
class WatchdogAdmin(ReadOnlyRecords, admin.ModelAdmin):
    list_display = (
        "site",
        "name",
        "state_column",
        "every_column",
        "list_name",
        "type",
        "last_ping_column",
        "state_changed_column",
        "raised_column",
    )
    list_display_links = ("name",)
    list_filter = ("state", "site", "type")
    search_fields = ("name", "list_name", "site__site_id")
    search_help_text = "Words in the watchdog's name, its list or its site."
    list_select_related = ("site",)
    list_per_page = 100
    actions = ["retire_selected"]
    fields = (
        "site",
        "name",
        "state_column",
        "every_seconds",
        "list_name",
        "type",
        "last_ping_at",
        "silent_since",
        "state_changed_at",
        "created_at",
        "retired_at",
        "retired_by",
    )
    readonly_fields = fields
    inlines = [WatchdogAlertInline]

    class Media:
        css = {"all": ["notifications/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Watchdog]:
        return super().get_queryset(request).annotate(raised=Count("alerts"))

    def has_retire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("sites.retire_watchdog")

    @admin.display(description="state", ordering="state")
    def state_column(self, watchdog: Watchdog) -> str:
        return watchdog_state_badge(watchdog)

    @admin.display(description="every", ordering="every_seconds")
    def every_column(self, watchdog: Watchdog) -> str:
        return f"{watchdog.every_seconds} s"

    @admin.display(description="last ping", ordering="last_ping_at")
    def last_ping_column(self, watchdog: Watchdog) -> str:
        return console_time(watchdog.last_ping_at)

    @admin.display(description="since", ordering="state_changed_at")
    def state_changed_column(self, watchdog: Watchdog) -> str:
        return console_time(watchdog.state_changed_at)

    @admin.display(description="notifications raised", ordering="raised")
    def raised_column(self, watchdog: Any) -> int:
        return int(watchdog.raised)

    @admin.action(description="Retire (stop watching; a later ping brings it back)", permissions=["retire"])
    def retire_selected(self, request: HttpRequest, queryset: QuerySet[Watchdog]) -> None:
        ids = list(queryset.values_list("pk", flat=True)[:MAX_ACTION_ROWS])
        retired, skipped = watchdogs_retire(watchdog_ids=ids, user=cast(User, request.user))
        self.message_user(
            request,
            f"Retired {retired} watchdog(s); {skipped} skipped (already retired). They are no longer watched; a ping "
            "made later brings a watchdog back.",
            messages.SUCCESS if retired else messages.WARNING,
        )


@admin.register(WatchdogAlert)
class WatchdogAlertAdmin(ReadOnlyRecords, admin.ModelAdmin):
    """Every notification raised for a watchdog or a silent site, with its status at central."""

    list_display = ("raised_at", "site", "kind", "watchdog", "list_name", "type", "notification_column")
    list_filter = ("kind", "site")
    list_select_related = ("site", "watchdog")
    search_fields = ("list_name", "watchdog__name")
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet[WatchdogAlert]:
        central = Notification.objects.filter(pk=OuterRef("notification_id")).values("status")[:1]
        return super().get_queryset(request).annotate(central_status=Subquery(central))

    @admin.display(description="notification (status at central)")
    def notification_column(self, alert: Any) -> str:
        return notification_link(alert.notification_id, alert.central_status or "purged")
