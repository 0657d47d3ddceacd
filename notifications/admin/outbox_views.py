"""The outbox page's further views (docs/console.md): Parked rows grouped by cause with their
bulk Retry and Discard, the redrive view that follows one Retry to the end, the CSV export of
the filtered rows, and the console's time-zone choice.

A mixin of NotificationAdmin: it uses the admin's permissions, reporting and change list.
"""

import csv
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from notifications.admin.common import DiscardForm, IncidentNoteForm
from notifications.console import parked_cause_rows, parked_groups, redrive_progress, retried_at, waiting_breakdown
from notifications.console_time import COOKIE, COOKIE_MAX_AGE, console_time, zone_parse
from notifications.health import channels_unhealthy
from notifications.incident_notes import incident_note_add, incident_notes, incident_notes_latest
from notifications.models import Notification
from notifications.operations import ActionResult, notification_discard, notification_retry
from notifications.vocabulary import ADAPTER_PATHS, targets_summary

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    _Base = ModelAdmin[Notification]
else:
    _Base = object

# A CSV export stops after this many rows (and says so in its last line): narrow the filters.
EXPORT_MAX_ROWS = 100_000
EXPORT_COLUMNS = (
    "notification_id",
    "status",
    "type",
    "list_name",
    "subject",
    "source_site_id",
    "source_instance_id",
    "source_script",
    "created_at",
    "requeued_at",
    "last_attempt_at",
    "delivered_at",
    "discarded_at",
    "retry_count",
    "last_error",
    "discarded_by",
    "discard_reason",
    "recipients",
)
# The stored columns of the export; "recipients" is the one-line summary of resolved_targets.
EXPORT_FIELDS = (*EXPORT_COLUMNS[:-1], "resolved_targets")


class _Echo:
    """A file-like object whose write returns the line, for csv.writer into a stream."""

    def write(self, value: str) -> str:
        return value


# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection"): = + - @, a TAB or
# a CR first, and their full-width forms, which some spreadsheets fold to the ASCII ones.
FORMULA_STARTS = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")


def csv_cell_safe(value: Any) -> Any:
    """``value`` as a CSV cell a spreadsheet will not run: text that starts with a formula
    character, also after leading white space (which spreadsheets skip), gets a ``'`` in front."""
    if isinstance(value, str) and (value[:1] in FORMULA_STARTS or value.lstrip()[:1] in FORMULA_STARTS):
        return "'" + value
    return value


class OutboxConsoleViews(_Base):
    """Views added to the outbox admin; see the module docstring."""

    action_max_rows: int

    # Provided by NotificationAdmin.
    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        raise NotImplementedError

    def has_discard_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        raise NotImplementedError

    def _report(self, request: HttpRequest, verb: str, result: ActionResult, *, not_applicable: str) -> None:
        raise NotImplementedError

    # --- parked by cause

    def parked_groups_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        groups, partial = parked_groups()
        can_add_list = request.user.has_perm("notifications.add_notificationlist")
        add_list_url = reverse("admin:notifications_notificationlist_add")
        outbox_url = reverse("admin:notifications_notification_changelist")
        notes = incident_notes_latest(subjects=[f"parked:{group.key}" for group in groups])
        rows = [
            {
                "group": group,
                "add_list_links": [
                    (name, f"{add_list_url}?{urlencode({'name': name})}") for name in group.missing_lists
                ]
                if can_add_list
                else [],
                "rows_url": f"{outbox_url}?{urlencode({'status': 'Parked', 'cause': group.cause})}",
                "note_subject": f"parked:{group.key}",
                "notes": notes.get(f"parked:{group.key}"),
            }
            for group in groups
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Parked notifications by cause",
            "opts": self.opts,
            "rows": rows,
            "partial": partial,
            "total": sum(group.count for group in groups),
            "can_retry": self.has_retry_permission(request),
            "can_discard": self.has_discard_permission(request),
            "action_max_rows": self.action_max_rows,
            "can_note": self.has_view_permission(request),
            "note_back": request.get_full_path(),
        }
        return TemplateResponse(request, "admin/notifications/notification/parked_groups.html", context)

    def _cause_ids(self, request: HttpRequest) -> tuple[str, list[Any]] | None:
        cause = request.POST.get("cause")
        if cause is None:
            return None
        ids = list(parked_cause_rows(cause).order_by("created_at").values_list("pk", flat=True)[: self.action_max_rows])
        return cause, ids

    def channel_breakdown_view(self, request: HttpRequest) -> HttpResponseBase:
        """Where an open channel hits: its waiting rows by site and by list, each a link to
        those rows (the status line's and the open-channel box's link)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        channel = request.GET.get("channel", "")
        if channel not in ADAPTER_PATHS:
            return HttpResponseBadRequest("Choose a channel: ?channel=email, teams, webhook, sms or apprise.")
        breakdown = waiting_breakdown(channel=channel)
        health = [
            {**row, "since": parse_datetime(row["since"]) if row["since"] else None}
            for row in channels_unhealthy()
            if row["channel"] == channel
        ]
        outbox = reverse("admin:notifications_notification_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Waiting for {channel}: where it hits",
            "opts": self.opts,
            "channel": channel,
            "breakdown": breakdown,
            "health": health[0] if health else None,
            "rows_url": f"{outbox}?{urlencode({'type': channel, 'status': 'queued'})}",
            **self.incident_notes_context(request, subject=f"channel:{channel}"),
        }
        return TemplateResponse(request, "admin/notifications/notification/channel_breakdown.html", context)

    # --- incident notes (on an open channel or a parked group)

    def incident_notes_context(self, request: HttpRequest, *, subject: str) -> dict[str, Any]:
        """The notes on ``subject`` (newest first) and the form to add one."""
        return {
            "note_subject": subject,
            "notes": incident_notes(subject=subject),
            "note_form": IncidentNoteForm(),
            "can_note": self.has_view_permission(request),
            "note_back": request.get_full_path(),
        }

    def incident_note_add_view(self, request: HttpRequest) -> HttpResponseBase:
        """Adds a note on an open channel or a parked group, then goes back to the page. A note
        changes no notification (it is not an acknowledgement)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=False):
            back = reverse("admin:notifications_notification_changelist")
        form = IncidentNoteForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(
                f"{name}: {' '.join(str(error) for error in errors)}" for name, errors in form.errors.items()
            )
            self.message_user(request, f"The note was not saved ({problems}).", messages.ERROR)
            return HttpResponseRedirect(back)
        incident_note_add(subject=form.cleaned_data["subject"], text=form.cleaned_data["text"], user=request.user)
        self.message_user(request, "Note added; the next shift sees it here.", messages.SUCCESS)
        return HttpResponseRedirect(back)

    def parked_retry_view(self, request: HttpRequest) -> HttpResponseBase:
        """Retry every Parked row of one cause (up to the action limit), then follow them; with
        ``confirm=ask`` (the groups' "Retry all") a confirmation page first."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_retry_permission(request):
            raise PermissionDenied
        found = self._cause_ids(request)
        if found is None:
            return HttpResponseBadRequest("The cause to retry is missing.")
        cause, ids = found
        back = reverse("admin:notifications_notification_parked")
        if not ids:
            self.message_user(request, "No Parked notification has that cause any more.", messages.WARNING)
            return HttpResponseRedirect(back)
        if request.POST.get("confirm") == "ask":
            # "Retry all" of a group asks first: hundreds of messages go out again at once.
            context = {
                **self.admin_site.each_context(request),
                "title": "Retry parked notifications?",
                "opts": self.opts,
                "cause": cause,
                "count": len(ids),
                "action_max_rows": self.action_max_rows,
            }
            return TemplateResponse(request, "admin/notifications/notification/parked_retry.html", context)
        result = notification_retry(notification_ids=ids, user=request.user)
        self._report(request, "Retried", result, not_applicable="not Parked any more, or being delivered")
        at = retried_at(ids) if result.changed else None
        if at is None:
            return HttpResponseRedirect(back)
        if len(ids) == self.action_max_rows and parked_cause_rows(cause).exists():
            self.message_user(
                request,
                f"At most {self.action_max_rows:,} rows are retried at once; more with this cause remain Parked.",
                messages.WARNING,
            )
        return HttpResponseRedirect(redrive_url(at))

    def parked_discard_view(self, request: HttpRequest) -> HttpResponseBase:
        """Discard every Parked row of one cause, with a reason (a confirmation page first)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_discard_permission(request):
            raise PermissionDenied
        found = self._cause_ids(request)
        if found is None:
            return HttpResponseBadRequest("The cause to discard is missing.")
        cause, ids = found
        form = DiscardForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            result = notification_discard(notification_ids=ids, user=request.user, reason=form.cleaned_data["reason"])
            self._report(request, "Discarded", result, not_applicable="not Parked any more, or being delivered")
            return HttpResponseRedirect(reverse("admin:notifications_notification_parked"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Discard parked notifications?",
            "opts": self.opts,
            "cause": cause,
            "count": len(ids),
            "action_max_rows": self.action_max_rows,
            "form": form,
        }
        return TemplateResponse(request, "admin/notifications/notification/parked_discard.html", context)

    # --- redrive

    def redrive_view(self, request: HttpRequest) -> HttpResponse:
        """Live counts of the rows one Retry sent back: waiting → delivered / parked."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        raw = request.GET.get("at", "")
        try:
            at = parse_datetime(raw)
        except ValueError:
            at = None
        if at is None or timezone.is_naive(at):
            return HttpResponseBadRequest(
                "The redrive to show is missing or unreadable: 'at' must be the ISO 8601 instant of a Retry, "
                "with its offset (follow the link shown after a Retry)."
            )
        progress = redrive_progress(at)
        context = {
            **self.admin_site.each_context(request),
            "title": "Redrive progress",
            "opts": self.opts,
            "progress": progress,
            "at_text": console_time(at),
            "rows_url": reverse("admin:notifications_notification_changelist") + "?" + urlencode({"requeued_at": raw}),
            "refresh_url": request.get_full_path(),
        }
        template = "redrive_counts.html" if request.GET.get("fragment") else "redrive.html"
        return TemplateResponse(request, f"admin/notifications/notification/{template}", context)

    # --- CSV export

    def export_view(self, request: HttpRequest) -> HttpResponseBase:
        """The rows the outbox page shows with the same filters and search, as CSV (streamed,
        at most EXPORT_MAX_ROWS rows, newest first), UTF-8 with a byte-order mark, each row with
        its per-recipient summary ("delivered to 1 of 3, 2 refused (552)")."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        rows = changelist.get_queryset(request).values_list(*EXPORT_FIELDS)

        def lines() -> Iterator[str]:
            writer = csv.writer(_Echo())
            # A byte-order mark first: Excel reads the file as UTF-8 only with it (else ポンプ is garbled).
            yield "\ufeff" + writer.writerow(EXPORT_COLUMNS)
            for written, row in enumerate(rows[: EXPORT_MAX_ROWS + 1].iterator(chunk_size=2000)):
                if written == EXPORT_MAX_ROWS:
                    yield writer.writerow(
                        [f"# stopped at {EXPORT_MAX_ROWS:,} rows: narrow the filters to export the rest"]
                    )
                    return
                summary = targets_summary(row[-1])
                values = [*row[:-1], summary["text"] if summary else ""]
                yield writer.writerow([csv_cell_safe(_export_value(value)) for value in values])

        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="outbox-{stamp}.csv"'
        response["Cache-Control"] = "no-store"
        return response

    # --- the console's time zone

    def timezone_view(self, request: HttpRequest) -> HttpResponseBase:
        """Stores the zone timestamps are shown in: "UTC", or the browser's zone (an IANA name
        the page's script fills in)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=False):
            back = reverse("admin:notifications_notification_changelist")
        name = request.POST.get("zone", "").strip()
        zone = zone_parse(name)
        response = HttpResponseRedirect(back)
        if zone is None:
            self.message_user(
                request,
                f"Unknown time zone {name!r}: times stay as they were. Use UTC or an IANA zone name like Europe/Zurich"
                " (the page fills in your browser's zone when scripts run).",
                messages.ERROR,
            )
            return response
        response.set_cookie(COOKIE, str(zone.key), max_age=COOKIE_MAX_AGE, samesite="Lax", httponly=True)
        self.message_user(request, f"Times are now shown in {zone.key}.", messages.SUCCESS)
        return response


def redrive_url(at: datetime) -> str:
    return reverse("admin:notifications_notification_redrive") + "?" + urlencode({"at": at.isoformat()})


def redrive_link(at: datetime) -> str:
    return format_html('<a href="{}" class="outbox-redrive-link">Follow their progress</a>', redrive_url(at))


def _export_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if value is None:
        return ""
    return value
