"""Sites in the admin: register and deactivate sites, see when each was last heard from,
issue keys (the plaintext is shown once) and revoke them."""

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from rest_framework_api_key.models import APIKey

from sites.models import Site, SiteAPIKey
from sites.services import SiteKeyError, site_key_issue, site_key_revoke

# Central authenticates sites with SiteAPIKey only; the library's generic APIKey model is
# unused, and listing it beside site keys would suggest keys that authenticate nothing.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


class SiteAPIKeyInline(admin.TabularInline):
    model = SiteAPIKey
    fields = ("prefix", "name", "created", "expiry_date", "state", "revoke_link")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name = "API key"
    verbose_name_plural = "API keys (issue new keys with the button above; revocation cannot be undone)"

    @admin.display(description="state")
    def state(self, key):
        if key.revoked:
            return "revoked"
        if key.has_expired:
            return "expired"
        return "live"

    @admin.display(description="")
    def revoke_link(self, key):
        if key.revoked:
            return ""
        url = reverse("admin:sites_site_revoke_key", args=[key.site_id, key.prefix])
        return format_html('<a href="{}" class="revoke-key-link">Revoke…</a>', url)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("site_id", "name", "active", "last_seen_at", "live_keys")
    list_filter = ("active",)
    search_fields = ("site_id", "name")
    readonly_fields = ("created_at", "last_seen_at")
    inlines = [SiteAPIKeyInline]

    class Media:
        css = {"all": ["notifications/admin.css"]}

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            live_keys=Count("api_keys", filter=Q(api_keys__revoked=False))
        )

    @admin.display(description="unrevoked keys", ordering="live_keys")
    def live_keys(self, site):
        return site.live_keys

    def get_urls(self):
        return [
            path("<path:object_id>/issue-key/", self.admin_site.admin_view(self.issue_key_view), name="sites_site_issue_key"),
            path(
                "<path:object_id>/revoke-key/<str:prefix>/",
                self.admin_site.admin_view(self.revoke_key_view),
                name="sites_site_revoke_key",
            ),
            *super().get_urls(),
        ]

    def _site_or_deny(self, request, object_id):
        if not self.has_change_permission(request):
            raise PermissionDenied
        return self.get_object(request, unquote(object_id))

    def _context(self, request, site, title, **extra):
        return {**self.admin_site.each_context(request), "title": title, "opts": self.opts, "original": site, **extra}

    def issue_key_view(self, request, object_id):
        """POST only: the new key's plaintext is in this one response and nowhere else."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        site = self._site_or_deny(request, object_id)
        if site is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        name = f"{site.site_id} key {timezone.now():%Y-%m-%d %H:%M}"
        api_key, plaintext = site_key_issue(site=site, name=name)
        self.log_change(request, site, f"Issued API key {api_key.prefix}.")
        response = TemplateResponse(
            request,
            "admin/sites/site/key_issued.html",
            self._context(request, site, f"New API key for {site.site_id}", api_key=api_key, plaintext=plaintext),
        )
        response["Cache-Control"] = "no-store"
        return response

    def revoke_key_view(self, request, object_id, prefix):
        site = self._site_or_deny(request, object_id)
        if site is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
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
