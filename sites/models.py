"""Sites (the remote plants that raise notifications) and their API keys."""

import uuid
from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, validate_slug
from django.db import models
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey, APIKeyManager

from notifications.vocabulary import TYPE_CHOICES


def rate_burst_validate(value: int) -> None:
    """A site's burst holds at least the largest batch: a larger batch could never be accepted."""
    largest = settings.OUTBOX_BATCH_MAX_ITEMS
    if value < largest:
        raise ValidationError(
            f"Must be at least the largest batch a site may send (OUTBOX_BATCH_MAX_ITEMS, {largest})."
        )


class Site(models.Model):
    site_id = models.CharField(max_length=64, unique=True, validators=[validate_slug])
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # This site's own notification rate limit (sites.rate_limits); empty: the installation's.
    rate_limit = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        verbose_name="rate limit (notifications per second)",
        help_text="Notifications per second this site may send, sustained, counted over every web process "
        "(a batch of N counts N). Empty: the default, OUTBOX_SITE_RATE_LIMIT. 0: no limit for this site. "
        "Critical notifications have a budget of their own.",
    )
    rate_burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[rate_burst_validate],
        verbose_name="rate burst (notifications)",
        help_text="How many notifications this site may send at once before the rate applies; at least the largest "
        "batch (OUTBOX_BATCH_MAX_ITEMS). Empty: the default, OUTBOX_SITE_RATE_BURST.",
    )

    # DRF treats the authenticated principal as request.user; a site key always authenticates.
    is_authenticated = True
    is_anonymous = False

    class Meta:
        ordering = ["site_id"]

    def __str__(self) -> str:
        return self.site_id


class SiteAPIKeyManager(APIKeyManager):
    def get_usable_keys(self) -> models.QuerySet:
        return super().get_usable_keys().select_related("site")


class SiteAPIKey(AbstractAPIKey):
    """A hashed, revocable, optionally expiring key; a site may hold several during rotation."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="api_keys")
    # When the key last authenticated a request, written at most once a minute per key
    # (sites.authentication) so that ingest does not pay a write per request.
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[SiteAPIKeyManager] = SiteAPIKeyManager()

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "site API key"
        verbose_name_plural = "site API keys"


class StaffAPIKeyManager(APIKeyManager):
    def get_usable_keys(self) -> models.QuerySet:
        return super().get_usable_keys().select_related("user")


class StaffAPIKey(AbstractAPIKey):
    """A staff user's key for the staff API (``Authorization: Token <key>``): stored hashed (the
    key is shown once, when issued), named, expiring, revocable. Its user is fixed when it is
    issued: a key is never handed to someone else."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="staff_api_keys")
    # Every staff key expires (the library's keys may not).
    expiry_date = models.DateTimeField(
        verbose_name="expires", help_text="Once the key expires, requests with it are refused."
    )
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[StaffAPIKeyManager] = StaffAPIKeyManager()

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "staff API key"
        verbose_name_plural = "staff API keys"


class SiteHeartbeat(models.Model):
    """The latest heartbeat of a site's agent (one row per site, replaced by each heartbeat)."""

    site = models.OneToOneField(Site, on_delete=models.CASCADE, related_name="heartbeat", primary_key=True)
    received_at = models.DateTimeField()
    agent_version = models.CharField(max_length=64, blank=True)
    buffered = models.PositiveIntegerField(default=0)
    parked = models.PositiveIntegerField(default=0)
    oldest_buffered_at = models.DateTimeField(null=True, blank=True)
    last_forward_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # What newer agents add (each only when it says something): what the agent supports
    # ("acknowledged"), the rows central answered 5xx to more than once ({"rows", "since",
    # "last_error"}), and its local fallback relay ({"configured", "active", "delivered",
    # "failing", "last_error", "last_error_at"}). Empty or None from agents that do not send them.
    capabilities = models.JSONField(default=list, blank=True)
    server_errors = models.JSONField(null=True, blank=True)
    fallback = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "site heartbeat"

    def __str__(self) -> str:
        return f"{self.site_id} at {self.received_at:%Y-%m-%d %H:%M:%S}"


class SiteKeyRefusal(models.Model):
    """Requests central refused although they carried one of a site's keys (by its prefix): a
    revoked or expired key, a wrong secret behind a known prefix, or a deactivated site. One
    row per key prefix, counted; the site's page shows them, since the refused agent cannot
    say so itself (its heartbeat is refused too)."""

    class Reason(models.TextChoices):
        REVOKED = "revoked", "key revoked"
        EXPIRED = "expired", "key expired"
        WRONG_SECRET = "wrong_secret", "wrong secret for this key prefix"
        SITE_INACTIVE = "site_inactive", "site deactivated"

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="key_refusals")
    prefix = models.CharField(max_length=16, unique=True)
    reason = models.CharField(max_length=16, choices=Reason.choices)  # the latest refusal's
    count = models.PositiveBigIntegerField(default=0)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    last_client = models.CharField(max_length=64, blank=True)

    class Meta:
        verbose_name = "refused key attempt"
        ordering = ["-last_at"]

    def __str__(self) -> str:
        return f"{self.prefix} of {self.site_id}: {self.count} refused"


class SiteParkedNotification(models.Model):
    """A notification parked at a site (central refused it, or the site's retries ran out), as
    the site's agent reported it. ``state`` says whether it is still parked there or left that
    state (retried or discarded, by an operator here or at the site)."""

    class State(models.TextChoices):
        PARKED = "parked", "Parked at the site"
        RETRIED = "retried", "Retried"
        DISCARDED = "discarded", "Discarded"

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="parked_notifications")
    notification_id = models.UUIDField()
    type = models.CharField(max_length=64, blank=True)
    list_name = models.CharField(max_length=200, blank=True)
    subject = models.CharField(max_length=255, blank=True)
    source_instance_id = models.CharField(max_length=200, blank=True)
    source_script = models.CharField(max_length=200, blank=True)
    site_enqueued_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    parked_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PARKED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    reported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "notification parked at a site"
        verbose_name_plural = "parked at sites"
        constraints = [
            models.UniqueConstraint(fields=["site", "notification_id"], name="sites_parked_one_per_site_and_id")
        ]
        indexes = [models.Index(fields=["state", "parked_at"], name="sites_parked_state_idx")]
        permissions = [
            ("retry_siteparkednotification", "Can retry a notification parked at a site"),
            ("discard_siteparkednotification", "Can discard a notification parked at a site"),
        ]

    def __str__(self) -> str:
        return f"{self.notification_id} at {self.site_id}"


class SiteCommand(models.Model):
    """A command for a site's agent, waiting for (pending) or executed by (done / failed) it:
    an operator's Retry or Discard of a site-parked notification, or ``acknowledged``, the news
    that a person acknowledged one of the site's notifications at central (sites.services,
    created when a heartbeat of an agent that takes them comes in). Handed to the agent in every
    heartbeat answer until the agent acknowledges it; the agent executes each command at most
    once. An ``acknowledged`` command not taken by ``expires_at`` is expired, never handed out."""

    class Action(models.TextChoices):
        RETRY = "retry", "Retry"
        DISCARD = "discard", "Discard"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        EXPIRED = "expired", "Expired"

    # The operators' actions: their own lane in a heartbeat answer, ahead of the acknowledgements.
    OPERATOR_ACTIONS = (Action.RETRY, Action.DISCARD)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="commands")
    notification_id = models.UUIDField()
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField(blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sent_at = models.DateTimeField(null=True, blank=True)  # last handed to the agent
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    # An "acknowledged" command's acknowledgement (acknowledged_at, acknowledged_via,
    # acknowledged_by, note; masked when handed to the site), and when it stops being handed out.
    details = models.JSONField(default=dict, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "site command"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["site", "state", "created_at"], name="sites_command_pending_idx"),
            models.Index(fields=["site", "notification_id"], name="sites_command_row_idx"),
        ]
        constraints = [
            # A notification's acknowledgement is sent to its site once (never a second command).
            models.UniqueConstraint(
                fields=["site", "notification_id"],
                condition=models.Q(action="acknowledged"),
                name="sites_command_one_acknowledged",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.notification_id} at {self.site_id} ({self.state})"


class SiteRateBucket(models.Model):
    """One rate budget of one site (sites.rate_limits): the tokens left when it was last
    refilled, shared by every web process. ``scope`` names the budget: ``notifications``,
    ``critical``, or a kind of other request (``agent``, ``watchdog``, ``ack``, ``read``,
    ``requests``). Processes take tokens in chunks and spend them locally."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="rate_buckets")
    scope = models.CharField(max_length=16)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    # How many tokens the last draw took (its answer: UPDATE … RETURNING sees only new values).
    granted = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["site", "scope"], name="sites_rate_bucket_unique")]

    def __str__(self) -> str:
        return f"{self.site_id} {self.scope}: {self.tokens:.1f}"


# --- watchdogs (sites.watchdogs) -----------------------------------------------------------------


class WatchdogState(models.TextChoices):
    """Whether a watchdog is pinging (ok), has missed two intervals (silent), or is no longer
    watched (retired). Also ``Watchdog.State``."""

    OK = "ok", "ok"
    SILENT = "silent", "silent"
    RETIRED = "retired", "retired"


class Watchdog(models.Model):
    """A dead-man switch of a site script: the script pings it at least every ``every_seconds``;
    when two intervals pass without a ping, central raises one notification for ``list_name``
    and ``type``, and one more when it pings again (sites.watchdogs). Created by its first
    ping; the latest ping says its interval, list and channel."""

    State = WatchdogState
    MAX_EVERY_SECONDS = 7 * 24 * 3600  # a week: the longest interval a dead-man switch is useful for

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="watchdogs")
    name = models.CharField(max_length=200)
    every_seconds = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_EVERY_SECONDS)],
        help_text="The script promises a ping at least this often.",
    )
    list_name = models.CharField(max_length=200, help_text="Who hears when the pings stop.")
    type = models.CharField(max_length=32, choices=TYPE_CHOICES, default="email")
    state = models.CharField(max_length=16, choices=State.choices, default=State.OK)
    last_ping_at = models.DateTimeField(help_text="The latest ping central has (never moves backwards).")
    # The last ping before the watchdog fell silent: the silence's key (its notifications' ids).
    silent_since = models.DateTimeField(null=True, blank=True)
    # The site's heartbeat at which the watchdog was first found past its deadline; a later
    # heartbeat without a newer ping confirms the silence (sites.watchdogs).
    overdue_heard_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)  # a username, kept if the user goes

    class Meta:
        ordering = ["site", "name"]
        constraints = [
            models.UniqueConstraint(fields=["site", "name"], name="sites_watchdog_one_per_site_and_name"),
            models.CheckConstraint(condition=models.Q(state__in=WatchdogState.values), name="sites_watchdog_state"),
            models.CheckConstraint(condition=models.Q(every_seconds__gte=1), name="sites_watchdog_every_positive"),
        ]
        permissions = [("retire_watchdog", "Can retire a watchdog (stop watching it)")]

    def __str__(self) -> str:
        return f"{self.site_id}/{self.name}"


class SiteSilence(models.Model):
    """A time a site with watchdogs fell silent (its agent stopped heart-beating): while it lasts,
    its watchdogs are not judged one by one, and one "site silent" notification goes to each list
    they report to (sites.watchdogs)."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="silences")
    since = models.DateTimeField(help_text="The site's last heartbeat before it fell silent.")
    noticed_at = models.DateTimeField(default=timezone.now)
    back_at = models.DateTimeField(null=True, blank=True, help_text="The heartbeat that ended the silence.")

    class Meta:
        verbose_name = "site silence"
        verbose_name_plural = "site silences"
        ordering = ["-since"]
        constraints = [models.UniqueConstraint(fields=["site", "since"], name="sites_silence_one_per_heartbeat")]

    def __str__(self) -> str:
        return f"{self.site_id} silent since {self.since:%Y-%m-%d %H:%M:%S}"


class WatchdogAlert(models.Model):
    """A notification central raised about a watchdog or a silent site: which one, to whom and
    when (the notification itself is an ordinary row of the outbox)."""

    class Kind(models.TextChoices):
        SILENT = "silent", "watchdog silent"
        RECOVERED = "recovered", "watchdog pinging again"
        SITE_SILENT = "site_silent", "site silent"
        SITE_BACK = "site_back", "site heard from again"

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="watchdog_alerts")
    watchdog = models.ForeignKey(Watchdog, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    silence = models.ForeignKey(SiteSilence, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    notification_id = models.UUIDField(unique=True)
    list_name = models.CharField(max_length=200)
    type = models.CharField(max_length=32)
    raised_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "watchdog notification"
        ordering = ["-raised_at"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.site_id} → {self.list_name}"
