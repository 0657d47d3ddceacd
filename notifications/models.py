"""The outbox: one durable audit row per notification, its delivery attempts, and the
delivery configuration (notification lists and the SMTP server)."""

import uuid

from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from notifications.adapters import TYPE_CHOICES
from notifications.fields import EncryptedTextField


class Notification(models.Model):
    """One notification raised at a site. Never edited by hand; deleted only by the purge."""

    class Status(models.TextChoices):
        PENDING = "Pending"
        RETRYING = "Retrying"
        DELIVERED = "Delivered"
        PARKED = "Parked"
        DISCARDED = "Discarded"

    NON_TERMINAL = (Status.PENDING, Status.RETRYING)
    TERMINAL = (Status.DELIVERED, Status.PARKED, Status.DISCARDED)

    notification_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    type = models.CharField(max_length=32, choices=TYPE_CHOICES, default="email")
    list_name = models.CharField(max_length=200)
    subject = models.CharField(max_length=255, blank=True)
    body = models.TextField(blank=True)
    type_data = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    retry_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    resolved_targets = models.JSONField(default=list, blank=True)

    # Provenance. The site id is a plain string stamped from the credential, not a foreign
    # key: the audit row must outlive the Site record.
    source_site_id = models.CharField(max_length=64)
    source_instance_id = models.CharField(max_length=200, blank=True)
    source_script = models.CharField(max_length=200, blank=True)

    site_enqueued_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    # The claim is a lease, not a status: a row whose lease expired is due again.
    claimed_by = models.CharField(max_length=64, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    # sha256 of the submitted content; a replay must match it (idempotency).
    fingerprint = models.CharField(max_length=64)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Dispatch: due rows, non-terminal only, so the index stays small when the table
            # is mostly terminal.
            models.Index(
                fields=["next_attempt_at"],
                name="notif_due_idx",
                condition=models.Q(status__in=["Pending", "Retrying"]),
            ),
            # KPIs and the console: per-status and per-site counts, newest first.
            models.Index(fields=["status", "created_at"], name="notif_status_created_idx"),
            models.Index(
                fields=["source_site_id", "status", "created_at"], name="notif_site_status_idx"
            ),
            models.Index(fields=["-created_at"], name="notif_created_idx"),
            # "Delivered in the last interval".
            models.Index(
                fields=["delivered_at"],
                name="notif_delivered_idx",
                condition=models.Q(status="Delivered"),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["Pending", "Retrying", "Delivered", "Parked", "Discarded"]),
                name="notif_status_valid",
            ),
            models.CheckConstraint(condition=models.Q(retry_count__gte=0), name="notif_retry_count_nonneg"),
        ]
        permissions = [
            ("retry_notification", "Can retry parked notifications"),
            ("discard_notification", "Can discard parked notifications"),
        ]

    def __str__(self):
        return f"{self.notification_id} {self.status} {self.subject[:40]}"

    @property
    def is_terminal(self):
        return self.status in self.TERMINAL


class DeliveryAttempt(models.Model):
    """One delivery attempt of one notification: recorded before the network call, finished after."""

    class Outcome(models.TextChoices):
        IN_PROGRESS = "in_progress"
        SUCCESS = "success"
        TRANSIENT = "transient"
        PERMANENT = "permanent"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempts")
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.IN_PROGRESS)
    error = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)  # adapter detail, e.g. SMTP reply code
    worker = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["started_at"]

    def __str__(self):
        return f"{self.notification_id} {self.outcome} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class NotificationList(models.Model):
    """A named set of targets; resolved when a notification is delivered, not when ingested."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(Lower("name"), name="notification_list_name_ci_unique")]

    def __str__(self):
        return self.name


class EmailRecipient(models.Model):
    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="email_recipients")
    email = models.EmailField(max_length=254)

    class Meta:
        ordering = ["email"]
        constraints = [
            models.UniqueConstraint("notification_list", Lower("email"), name="email_recipient_unique_per_list")
        ]

    def __str__(self):
        return self.email


class SmtpConfiguration(models.Model):
    """The single SMTP server email is delivered through; also holds the email retry policy."""

    class Security(models.TextChoices):
        NONE = "none", "None (plain SMTP)"
        STARTTLS = "starttls", "STARTTLS"
        TLS = "tls", "Implicit TLS (SMTPS)"

    SINGLETON_PK = 1

    host = models.CharField(max_length=255)
    port = models.PositiveIntegerField(default=587)
    security = models.CharField(max_length=16, choices=Security.choices, default=Security.STARTTLS)
    username = models.CharField(max_length=255, blank=True)
    password = EncryptedTextField(blank=True, help_text="Stored encrypted; never exported or shown.")
    from_address = models.EmailField()
    timeout_seconds = models.PositiveIntegerField(default=10)
    max_retries = models.PositiveIntegerField(default=10)
    retry_interval_seconds = models.PositiveIntegerField(default=60)

    class Meta:
        verbose_name = "SMTP configuration"
        verbose_name_plural = "SMTP configuration"
        constraints = [
            models.CheckConstraint(condition=models.Q(pk=1), name="smtp_configuration_singleton"),
            models.CheckConstraint(condition=models.Q(port__gte=1, port__lte=65535), name="smtp_port_range"),
            models.CheckConstraint(condition=models.Q(timeout_seconds__gte=1), name="smtp_timeout_positive"),
        ]

    def save(self, *args, **kwargs):
        self.pk = self.SINGLETON_PK
        super().save(*args, **kwargs)

    @classmethod
    def current(cls):
        """The configuration, or None when email delivery has not been configured."""
        return cls.objects.filter(pk=cls.SINGLETON_PK).first()

    def __str__(self):
        return f"{self.host}:{self.port} ({self.security})"
