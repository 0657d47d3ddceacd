"""Sites (the remote plants that raise notifications) and their API keys."""

from django.core.validators import validate_slug
from django.db import models
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey, BaseAPIKeyManager


class Site(models.Model):
    site_id = models.CharField(max_length=64, unique=True, validators=[validate_slug])
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    # DRF treats the authenticated principal as request.user; a site key always authenticates.
    is_authenticated = True
    is_anonymous = False

    class Meta:
        ordering = ["site_id"]

    def __str__(self):
        return self.site_id


class SiteAPIKeyManager(BaseAPIKeyManager):
    def get_usable_keys(self):
        return super().get_usable_keys().select_related("site")


class SiteAPIKey(AbstractAPIKey):
    """A hashed, revocable, optionally expiring key; a site may hold several during rotation."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="api_keys")

    objects = SiteAPIKeyManager()

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "site API key"
        verbose_name_plural = "site API keys"

