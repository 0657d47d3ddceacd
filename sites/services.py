"""Business rules for sites and their API keys."""

from django.db import transaction

from sites.models import Site, SiteAPIKey


class SiteKeyError(Exception):
    """A key operation that cannot be done; the message says why."""


def site_key_issue(*, site, name="", expiry_date=None):
    """Create a new key for ``site``; returns ``(api_key, plaintext)``. The plaintext is shown
    once and never stored; existing keys stay valid (rotation)."""
    return SiteAPIKey.objects.create_key(site=site, name=name or f"{site.site_id} key", expiry_date=expiry_date)


@transaction.atomic
def site_key_revoke(*, prefix):
    """Revoke the key whose prefix is ``prefix``; returns it. Revocation cannot be undone."""
    api_key = SiteAPIKey.objects.select_for_update().filter(prefix=prefix).select_related("site").first()
    if api_key is None:
        raise SiteKeyError(f"No API key with prefix {prefix!r}.")
    if not api_key.revoked:
        api_key.revoked = True
        api_key.save(update_fields=["revoked"])
    return api_key


def site_get(*, site_id):
    site = Site.objects.filter(site_id=site_id).first()
    if site is None:
        raise SiteKeyError(f"No site with site_id {site_id!r}. Create it in the admin or with outbox_config import.")
    return site
