"""The outbox: one durable audit row per notification, its delivery attempts, the delivery
configuration (notification lists, the SMTP server, delivery policies) and the state workers
share about channels (their health) and about dispatch timing."""

import uuid
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Value
from django.db.models.functions import Lower
from django.utils import timezone

from notifications.backoff import STRATEGIES
from notifications.channel_targets import apprise_url_masked, url_masked
from notifications.db import ClaimIndex
from notifications.fields import EncryptedTextField
from notifications.secret_binding import secrets_bind_changed, teams_url_digest
from notifications.vocabulary import TYPE_CHOICES, FailureClass, FailureCode


class NotificationStatus(models.TextChoices):
    """Where a notification is in its life: Pending and Retrying wait for delivery; Delivered,
    Parked, Discarded and Suppressed are terminal (Suppressed: never sent, as a duplicate, under
    a silence or folded into a digest; ``suppressed_by`` says which). Also
    ``Notification.Status``."""

    PENDING = "Pending"
    RETRYING = "Retrying"
    DELIVERED = "Delivered"
    PARKED = "Parked"
    DISCARDED = "Discarded"
    SUPPRESSED = "Suppressed"


class NotificationPriority(models.IntegerChoices):
    """How urgent a notification is (ISA-18.2's alarm priorities): dispatch takes higher ones
    first. Stored as a small integer, larger is more urgent; the API speaks the labels. Also
    ``Notification.Priority``."""

    LOW = 0, "low"
    NORMAL = 1, "normal"
    HIGH = 2, "high"
    CRITICAL = 3, "critical"

    @classmethod
    def named(cls, name: str) -> "NotificationPriority | None":
        """The priority whose label is ``name`` (``"critical"`` …); None for any other value."""
        return _PRIORITY_BY_NAME.get(name)


_PRIORITY_BY_NAME = {priority.label: priority for priority in NotificationPriority}
# The labels, most urgent first: the order the API documents and the console lists them in.
PRIORITY_NAMES = tuple(priority.label for priority in sorted(NotificationPriority, reverse=True))


class AcknowledgedVia(models.TextChoices):
    """How a person acknowledged a notification (docs/acknowledgement.md). Also
    ``Notification.AcknowledgedVia``."""

    LINK = "link", "the link in the message"
    SMS = "sms", "an SMS reply"
    TEAMS = "teams", "the Teams card"
    CONSOLE = "console", "the console"
    API = "api", "the staff API"
    SITE = "site", "the site (its HMI)"


class AckRequiredFrom(models.TextChoices):
    """From which priority up a list's notifications ask for acknowledgement; ``none``: never."""

    CRITICAL = "critical", "critical only"
    HIGH = "high", "high and critical"
    NORMAL = "normal", "normal, high and critical"
    LOW = "low", "every notification"
    NONE = "none", "none"


# Defined beside the class, not in it: the model's Meta (indexes, constraints) needs them too.
NON_TERMINAL = (NotificationStatus.PENDING, NotificationStatus.RETRYING)
TERMINAL = (
    NotificationStatus.DELIVERED,
    NotificationStatus.PARKED,
    NotificationStatus.DISCARDED,
    NotificationStatus.SUPPRESSED,
)


class Notification(models.Model):
    """One notification raised at a site. Never edited by hand; deleted only by the purge."""

    Status = NotificationStatus
    AcknowledgedVia = AcknowledgedVia
    Priority = NotificationPriority
    NON_TERMINAL = NON_TERMINAL
    TERMINAL = TERMINAL
    BODY_MAX_LENGTH = 100_000  # the body is a TextField, which has no max_length; ingest enforces this

    notification_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    type = models.CharField(max_length=32, choices=TYPE_CHOICES, default="email")
    list_name = models.CharField(max_length=200)
    subject = models.CharField(max_length=255, blank=True)
    body = models.TextField(blank=True)
    type_data = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # A database default too, so that adding the column does not rewrite the table and rows
    # inserted by SQL that predates it are normal.
    priority = models.SmallIntegerField(
        choices=Priority.choices, default=Priority.NORMAL, db_default=Priority.NORMAL.value
    )
    retry_count = models.PositiveIntegerField(default=0)  # failed attempts
    # Of those, the ones that were the channel's fault (connection, timeout, auth, throttled):
    # they never count against the policy's max_attempts.
    channel_failures = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True)
    # The stable name of the last failure when it has one (vocabulary.FailureCode), so that
    # the console recognises it whatever the wording of last_error.
    failure_code = models.CharField(max_length=32, choices=FailureCode.choices, blank=True, default="", db_default="")
    # One entry per target with its outcome (notifications.vocabulary.TargetOutcome): who
    # has it, who refused it for good, who is still owed it (retried) and who may have it.
    resolved_targets = models.JSONField(default=list, blank=True)
    # Targets of resolved_targets that refused it for good: a Delivered row with any was
    # delivered partially (a KPI and a console filter; kept beside the JSON so both are cheap).
    # (A database default too: rows inserted with SQL that predates the column stay valid.)
    targets_refused = models.PositiveIntegerField(default=0, db_default=0)

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
    # When the site's agent delivered it through its local fallback relay while central was
    # unreachable (the site's clock; notifications.local_delivery). Central does not send such a
    # row again unless its list sets resend_after_local_delivery.
    delivered_locally_at = models.DateTimeField(null=True, blank=True)

    # (Every column added to this table has a database default or allows NULL, so that web
    # processes of the previous release keep inserting rows while a deployment migrates.)
    # Acknowledgement: a person has seen it (at most once: the first one stands). Clearing: the
    # alarm returned to normal at the plant; it stops escalation like an acknowledgement but is
    # not one. ``asks_ack``: whether it asks for acknowledgement, decided when central created
    # it from its list's ack_required_from (docs/acknowledgement.md).
    asks_ack = models.BooleanField(default=False, db_default=False)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    acknowledged_via = models.CharField(
        max_length=16, choices=AcknowledgedVia.choices, blank=True, default="", db_default=""
    )
    acknowledged_note = models.TextField(blank=True, default="", db_default="")
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_note = models.TextField(blank=True, default="", db_default="")
    # Escalation: a child names its parent and its step (not a foreign key: the audit rows outlive
    # each other); a parent holds when its next step is due (None: no step left, or stopped).
    escalation_of = models.UUIDField(null=True, blank=True)
    escalation_step = models.SmallIntegerField(null=True, blank=True)
    escalation_due_at = models.DateTimeField(null=True, blank=True)

    # Suppression (docs/suppression.md). ``suppressed_by``: why a Suppressed row was never sent,
    # "duplicate:<notification id>", "silence:<silence id>" or "digest:<digest's notification
    # id>"; blank otherwise. ``dedup_key``: the site's name for "the same alarm again".
    # ``occurrences``/``last_occurrence_at``: on the row its duplicates were suppressed against,
    # how many times the alarm was raised counting itself, and when last. ``held_for_digest``:
    # a Pending row held back by a flood (never claimed) until its digest is made at this time.
    suppressed_by = models.CharField(max_length=80, blank=True, default="", db_default="")
    dedup_key = models.CharField(max_length=200, blank=True, default="", db_default="")
    occurrences = models.PositiveIntegerField(default=1, db_default=1)
    last_occurrence_at = models.DateTimeField(null=True, blank=True)
    held_for_digest = models.DateTimeField(null=True, blank=True)

    # The claim is a lease, not a status: a row whose lease expired is due again.
    claimed_by = models.CharField(max_length=64, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    # sha256 of the submitted content; a replay must match it (idempotency).
    fingerprint = models.CharField(max_length=64)

    # Operator actions. The policy's maximum age counts from the last operator Retry or
    # Requeue when there was one (else from created_at): a row an operator sent back must not
    # expire again at once.
    requeued_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)  # parked because it grew too old
    discarded_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.CharField(
        max_length=150, blank=True, default="", db_default=""
    )  # a username, kept if the user goes
    discard_reason = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Dispatch: the open rows of each (site, priority, channel) in due order (rows
            # without a due time first), non-terminal only so that it stays small when the
            # table is mostly history. The fair claim enumerates its keys and reads each key's
            # due rows off it as one range (notifications.dispatch.fair).
            ClaimIndex(name="notif_claim_idx", condition=models.Q(status__in=list(NON_TERMINAL))),
            # KPIs and the console: per-status and per-site counts, newest first.
            models.Index(fields=["status", "created_at"], name="notif_status_created_idx"),
            models.Index(fields=["source_site_id", "status", "created_at"], name="notif_site_status_idx"),
            models.Index(fields=["-created_at"], name="notif_created_idx"),
            # The console's sort by priority, newest first within each.
            models.Index(fields=["priority", "created_at"], name="notif_priority_created_idx"),
            # "Delivered in the last interval".
            models.Index(
                fields=["delivered_at"],
                name="notif_delivered_idx",
                condition=models.Q(status=NotificationStatus.DELIVERED),
            ),
            # "Delivered partially in the last interval": a handful of rows, so a tiny index.
            models.Index(
                fields=["delivered_at"],
                name="notif_partial_idx",
                condition=models.Q(status=NotificationStatus.DELIVERED, targets_refused__gt=0),
            ),
            # Escalation: the parents whose next step is due soonest, and a parent's children.
            models.Index(
                fields=["escalation_due_at"],
                name="notif_escalation_due_idx",
                condition=models.Q(escalation_due_at__isnull=False),
            ),
            models.Index(
                fields=["escalation_of"],
                name="notif_escalation_of_idx",
                condition=models.Q(escalation_of__isnull=False),
            ),
            # Time to acknowledge: the rows acknowledged lately (notifications.ack_kpis).
            models.Index(
                fields=["acknowledged_at"],
                name="notif_acknowledged_idx",
                condition=models.Q(acknowledged_at__isnull=False),
            ),
            # Duplicates: the anchor, the last row of a site, list and dedup_key that was not
            # suppressed. Only such rows are in it: a chattering key's duplicates, suppressed
            # at ingest, are never read again to find it (migration 0039).
            models.Index(
                fields=["source_site_id", "list_name", "dedup_key", "-created_at"],
                name="notif_dedup_anchor_idx",
                condition=~models.Q(dedup_key="") & models.Q(suppressed_by=""),
            ),
            # What one silence, digest or anchor holds back ("silence:4"): the Silences page's
            # counts, its link and "Deliver anyway", newest first; with the status, a silence's
            # rows held now are counted from the index alone (migration 0040).
            models.Index(
                fields=["suppressed_by", "-created_at"],
                name="notif_suppressed_by_idx",
                condition=~models.Q(suppressed_by=""),
                include=["status"],
            ),
            # Flood digests: the held rows by when their digest is due (a handful at any time).
            models.Index(
                fields=["held_for_digest"],
                name="notif_held_idx",
                condition=models.Q(held_for_digest__isnull=False),
            ),
            # Parked rows with a stable failure code (the console's "the list exists now").
            models.Index(
                fields=["failure_code", "list_name"],
                name="notif_parked_code_idx",
                condition=models.Q(status=NotificationStatus.PARKED) & ~models.Q(failure_code=""),
            ),
            # The unacknowledged ones (the console's tile, the gauge), newest first.
            models.Index(
                fields=["priority", "created_at"],
                name="notif_unacknowledged_idx",
                condition=models.Q(asks_ack=True, acknowledged_at__isnull=True, cleared_at__isnull=True),
            ),
            # A site's recent acknowledgements, which travel back to its agent (sites.services).
            models.Index(
                fields=["source_site_id", "acknowledged_at"],
                name="notif_site_acknowledged_idx",
                condition=models.Q(acknowledged_at__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=NotificationStatus.values),
                name="notif_status_valid",
            ),
            models.CheckConstraint(condition=models.Q(retry_count__gte=0), name="notif_retry_count_nonneg"),
            models.CheckConstraint(
                condition=models.Q(priority__in=NotificationPriority.values), name="notif_priority_valid"
            ),
            # One child per parent and escalation step (notifications.escalation).
            models.UniqueConstraint(
                fields=["escalation_of", "escalation_step"],
                condition=models.Q(escalation_of__isnull=False),
                name="notif_escalation_step_unique",
            ),
        ]
        permissions = [
            ("retry_notification", "Can retry parked notifications and retry waiting ones now"),
            ("discard_notification", "Can discard queued or parked notifications"),
            ("requeue_notification", "Can requeue discarded notifications"),
        ]

    def __str__(self) -> str:
        return f"{self.notification_id} {self.status} {self.subject[:40]}"

    @property
    def suppressed_reason(self) -> str:
        """``suppressed_by`` in words ("a duplicate of …", "silence 4", "folded into digest …")."""
        kind, _, ref = self.suppressed_by.partition(":")
        words = {"duplicate": "a duplicate of", "silence": "silenced by silence", "digest": "folded into digest"}
        return f"{words.get(kind, kind)} {ref}".strip()


class NotificationCount(models.Model):
    """Notification counts by status, site, channel and time bucket (notifications.counts).

    On PostgreSQL, triggers on the notification table add one row of changes per key for
    every statement that inserts, changes or deletes notifications, in that statement's
    transaction; ``counts_fold`` later sums the rows of a key into one. The sum of ``n`` over
    a key therefore always equals the live count of the notifications with that key. Each
    notification counts in its totals key (bucket None) and, unless Discarded, in a bucketed
    key: the minute a Pending or Retrying row was queued (its last operator Retry or Requeue,
    else its creation), the hour a Delivered row was delivered or a Parked row parked (expiry,
    else last attempt, else creation). ``partial`` is part of the key: a Delivered row some
    target refused for good (``targets_refused`` > 0, delivered partially) counts apart from the
    others. SQLite has no triggers: there the table stays empty and the KPIs and trends count
    the rows themselves.
    """

    bucket = models.DateTimeField(null=True)  # None: the key's totals of every time
    status = models.CharField(max_length=16, choices=NotificationStatus.choices)
    source_site_id = models.CharField(max_length=64)
    type = models.CharField(max_length=32)
    expired = models.BooleanField()  # Parked for its age (expired_at set)
    # Delivered partially: Delivered, and some target refused it for good (targets_refused > 0).
    partial = models.BooleanField(default=False, db_default=False)
    n = models.BigIntegerField()
    folded = models.BooleanField(default=False)  # the sum of a key, not a statement's change

    class Meta:
        indexes = [
            # The trends and the stuck figure: counts of a status, by bucket.
            models.Index(fields=["status", "bucket"], name="notif_count_status_idx"),
            # The fold: every row of a bucketed key, every row of a totals key (the KPIs read these).
            models.Index(fields=["status", "source_site_id", "type", "expired", "bucket"], name="notif_count_key_idx"),
            models.Index(
                fields=["status", "source_site_id", "type", "expired"],
                name="notif_count_total_idx",
                condition=models.Q(bucket__isnull=True),
            ),
            models.Index(fields=["id"], name="notif_count_unfolded_idx", condition=models.Q(folded=False)),
        ]

    def __str__(self) -> str:
        bucket = "total" if self.bucket is None else f"{self.bucket:%Y-%m-%d %H:%M}"
        return f"{self.status} {self.source_site_id} {self.type} {bucket}: {self.n}"


class FailedAttemptCount(models.Model):
    """Failed delivery attempts by the hour they started, their notification's site and
    channel, and their failure class (notifications.counts): the dashboard's failed trend, and
    the KPIs' failures of the last interval by class. ``partial``: the attempt failed while some
    of the notification's targets had it (``DeliveryAttempt.targets_delivered`` > 0): a
    recipient's refusal inside a partial delivery, counted apart from outages.

    Kept on PostgreSQL by statement-level triggers on the attempts table, like
    ``NotificationCount``: each statement adds its changes per key, ``counts_fold`` sums them.
    An attempt is counted through its notification, so attempts are deleted before their
    notification (as the purge and Django's cascade do). Empty on SQLite."""

    bucket = models.DateTimeField()
    source_site_id = models.CharField(max_length=64)
    type = models.CharField(max_length=32)
    failure_class = models.CharField(max_length=32, default="", db_default="")
    partial = models.BooleanField(default=False, db_default=False)
    n = models.BigIntegerField()
    folded = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["bucket", "source_site_id", "type"], name="attempt_count_key_idx"),
            models.Index(fields=["id"], name="attempt_count_unfolded_idx", condition=models.Q(folded=False)),
        ]

    def __str__(self) -> str:
        return f"{self.source_site_id} {self.type} {self.bucket:%Y-%m-%d %H:00}: {self.n} failed ({self.failure_class})"


class AlarmRateCount(models.Model):
    """Notifications by the 10-minute interval they were created in and their list, every
    status counted (notifications.counts): the flood report's alarms per list per 10 minutes.
    Kept on PostgreSQL by statement-level triggers on the notification table, like
    ``NotificationCount``; empty on SQLite, where the report counts the rows."""

    bucket = models.DateTimeField()  # the interval's start; intervals start at the epoch
    list_name = models.CharField(max_length=200)
    n = models.BigIntegerField()
    folded = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["bucket", "list_name"], name="alarm_count_key_idx"),
            models.Index(fields=["id"], name="alarm_count_unfolded_idx", condition=models.Q(folded=False)),
        ]

    def __str__(self) -> str:
        return f"{self.list_name} {self.bucket:%Y-%m-%d %H:%M}: {self.n}"


class DeliveryAttempt(models.Model):
    """One delivery attempt of one notification: recorded before the network call, finished after."""

    class Outcome(models.TextChoices):
        IN_PROGRESS = "in_progress"
        SUCCESS = "success"
        TRANSIENT = "transient"
        PERMANENT = "permanent"
        # The message was handed over (the final dot sent) and the relay's answer never came:
        # the relay may hold it. Retried with the same Message-ID (docs/recipients.md).
        AMBIGUOUS = "ambiguous"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempts")
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.IN_PROGRESS)
    failure_class = models.CharField(max_length=32, choices=FailureClass.choices, blank=True)
    error = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)  # adapter detail, e.g. SMTP reply code
    worker = models.CharField(max_length=64, blank=True)
    # How many of the notification's targets had it once this attempt ended (the ones it
    # reached and the ones earlier attempts reached). A failed attempt with any failed for
    # the targets still owed it while others had it: part of a partial delivery, not an outage.
    targets_delivered = models.IntegerField(default=0, db_default=0)

    class Meta:
        ordering = ["started_at"]
        indexes = [
            # KPIs: failures per class within the interval, from a small index alone.
            models.Index(
                fields=["started_at", "failure_class"],
                name="attempt_failure_idx",
                condition=~models.Q(failure_class=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.notification_id} {self.outcome} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class RecipientMode(models.TextChoices):
    """How the members of a list are addressed by email. Also ``NotificationList.RecipientMode``."""

    BCC = "bcc", "Bcc: one message, no member sees another"
    INDIVIDUAL = "individual", "Individual: one message per member"
    TO = "to", "To: one message, every member sees all the others"


class NotificationList(models.Model):
    """A named set of targets; resolved when a notification is delivered, not when ingested."""

    RecipientMode = RecipientMode

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    recipient_mode = models.CharField(
        max_length=16,
        choices=RecipientMode.choices,
        default=RecipientMode.BCC,
        help_text=(
            "How email reaches the members. Bcc (the default): one message whose visible To: is "
            '"undisclosed-recipients"; every member is an envelope recipient and none sees '
            "another's address. Individual: one message per member, addressed to that member "
            "alone, each with its own outcome. To: one message listing every member in To: (all "
            "members see each other; use only where that is wanted)."
        ),
    )
    resend_after_local_delivery = models.BooleanField(
        default=False,
        db_default=False,
        help_text=(
            "A site whose link to central was down may already have delivered an urgent notification "
            "through its own local relay (the site agent's fallback). Off (the default): central records "
            "that and does not send it again. On: central delivers it to this list as well."
        ),
    )

    ack_required_from = models.CharField(
        "acknowledgement asked from",
        max_length=8,
        choices=AckRequiredFrom.choices,
        default=AckRequiredFrom.HIGH,
        db_default=AckRequiredFrom.HIGH,
        help_text="Notifications of this priority and above carry an acknowledgement link (email, Teams, SMS) "
        "and can escalate.",
    )
    # Ordered steps [{"after_seconds": 300, "list": "Shift-Leads", "type": "sms"}, …]: when a
    # notification that asks for acknowledgement is neither acknowledged nor cleared that long
    # after central created it, a child notification goes to that list by that channel.
    escalation = models.JSONField(default=list, blank=True, db_default=Value([], output_field=models.JSONField()))
    repeat_last_every_seconds = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="After the last escalation step, repeat it this often until someone acknowledges; 0: never.",
    )

    # Suppression (docs/suppression.md).
    dedup_window_seconds = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="A notification with the same dedup_key from the same site within this many seconds of the last "
        "one sent (and not acknowledged or cleared) is suppressed as its duplicate; 0: off.",
    )
    flood_threshold = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="More notifications than this from one site per flood window are held and sent as one digest "
        "at the window's end (critical ones always singly); 0: off.",
    )
    flood_window_seconds = models.PositiveIntegerField(
        default=60, db_default=60, validators=[MinValueValidator(1)], help_text="The flood window, in seconds."
    )

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(Lower("name"), name="notification_list_name_ci_unique")]

    def __str__(self) -> str:
        return self.name


class EmailRecipient(models.Model):
    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="email_recipients")
    email = models.EmailField(max_length=254)

    class Meta:
        ordering = ["email"]
        constraints = [
            models.UniqueConstraint("notification_list", Lower("email"), name="email_recipient_unique_per_list")
        ]

    def __str__(self) -> str:
        return self.email


class BoundSecrets:
    """For models holding credentials bound to a destination (notifications.secret_binding):
    a save that stores a credential anew binds it to the destination it is saved with; one
    that changes only the destination leaves the binding, and the credential is then not sent."""

    def save(self, *args: Any, **kwargs: Any) -> None:
        if "update_fields" in kwargs and kwargs["update_fields"] is not None:
            kwargs["update_fields"] = secrets_bind_changed(instance=self, update_fields=kwargs["update_fields"])
        else:
            secrets_bind_changed(instance=self, update_fields=None)
        super().save(*args, **kwargs)  # type: ignore[misc]


def _binding(secret: str) -> models.CharField:
    return models.CharField(
        max_length=64,
        blank=True,
        editable=False,
        help_text=f"Digest of the destination the {secret} was entered for (notifications.secret_binding).",
    )


class SmtpConfiguration(BoundSecrets, models.Model):
    """The single SMTP server email is delivered through; also holds email's retry timing for
    installations without an email delivery policy."""

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
    password_binding = _binding("password")
    from_address = models.EmailField()
    timeout_seconds = models.PositiveIntegerField(default=10)
    greeting_timeout_seconds = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1)],
        help_text=(
            "How long to wait for the server's greeting (its 220) after connecting. Relays that "
            "delay it on purpose (Postfix's postscreen, sendmail's greet_pause) need more than a few "
            "seconds; RFC 5321 allows 5 minutes. Also bounded by the claim's lease (OUTBOX_LEASE_SECONDS)."
        ),
    )
    data_timeout_seconds = models.PositiveIntegerField(
        default=600,
        validators=[MinValueValidator(1)],
        help_text=(
            "How long to wait for the server's answer once the whole message is sent. Giving up "
            "earlier leaves its outcome unknown (it may have been accepted) and the retry can make "
            "a second copy; RFC 5321 suggests 10 minutes. Also bounded by the claim's lease "
            "(OUTBOX_LEASE_SECONDS)."
        ),
    )
    # Identity and TLS trust (docs/relays.md).
    local_hostname = models.CharField(
        max_length=255,
        blank=True,
        help_text="The name sent with EHLO; blank: this host's fully qualified name. Relays that refuse "
        "non-FQDN HELO names need a real one here.",
    )
    ca_file = models.CharField(
        max_length=500,
        blank=True,
        help_text="Path of a PEM file of CA certificates trusted for the server's certificate, in addition "
        "to the system's (a private CA). Must exist on every worker host.",
    )
    client_cert = models.CharField(
        max_length=500, blank=True, help_text="Path of a PEM client certificate presented to the server."
    )
    client_key = models.CharField(
        max_length=500, blank=True, help_text="Path of the client certificate's private key (blank: in the same file)."
    )

    class AuthMethod(models.TextChoices):
        PASSWORD = "password", "Password (PLAIN, LOGIN or CRAM-MD5)"
        XOAUTH2 = "xoauth2", "OAuth 2.0 (XOAUTH2, Microsoft 365)"

    auth_method = models.CharField(max_length=16, choices=AuthMethod.choices, default=AuthMethod.PASSWORD)
    oauth_tenant_id = models.CharField("OAuth tenant id", max_length=100, blank=True)
    oauth_client_id = models.CharField("OAuth client id", max_length=100, blank=True)
    oauth_client_secret = EncryptedTextField(
        "OAuth client secret", blank=True, help_text="Stored encrypted; never exported or shown."
    )
    oauth_client_secret_binding = _binding("OAuth client secret")
    oauth_client_certificate = models.CharField(
        "OAuth client certificate",
        max_length=500,
        blank=True,
        help_text="Instead of a client secret: path of a PEM file with the app registration's certificate and its "
        "(unencrypted, RSA) private key.",
    )
    oauth_client_certificate_binding = _binding("OAuth client certificate path")
    oauth_authority = models.CharField(
        "OAuth authority",
        max_length=255,
        blank=True,
        help_text="Blank: https://login.microsoftonline.com. Another https URL for a national cloud.",
    )
    # Email's retry timing while no delivery policy for email is stored (DeliveryPolicy).
    max_retries = models.PositiveIntegerField(default=10)
    retry_interval_seconds = models.PositiveIntegerField(default=60)

    class Meta:
        verbose_name = "SMTP configuration"
        verbose_name_plural = "SMTP configuration"
        constraints = [
            models.CheckConstraint(condition=models.Q(pk=1), name="smtp_configuration_singleton"),
            models.CheckConstraint(condition=models.Q(port__gte=1, port__lte=65535), name="smtp_port_range"),
            models.CheckConstraint(condition=models.Q(timeout_seconds__gte=1), name="smtp_timeout_positive"),
            models.CheckConstraint(
                condition=models.Q(greeting_timeout_seconds__gte=1), name="smtp_greeting_timeout_positive"
            ),
            models.CheckConstraint(condition=models.Q(data_timeout_seconds__gte=1), name="smtp_data_timeout_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.security})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.pk = self.SINGLETON_PK
        super().save(*args, **kwargs)

    @classmethod
    def current(cls) -> "SmtpConfiguration | None":
        """The configuration, or None when email delivery has not been configured."""
        return cls.objects.filter(pk=cls.SINGLETON_PK).first()


STRATEGY_CHOICES = [(name, name) for name in STRATEGIES]


def default_retry_on() -> list[str]:
    """Retried by default: the channel's failures, the provider's temporary errors and the
    unexplained; parked at once: rejected recipients or content and configuration problems."""
    return [
        FailureClass.CONNECTION,
        FailureClass.TIMEOUT,
        FailureClass.AUTH,
        FailureClass.THROTTLED,
        FailureClass.PROVIDER_ERROR,
        FailureClass.UNKNOWN,
    ]


class DeliveryPolicy(models.Model):
    """How one channel retries, gives up, protects itself and paces its sending
    (docs/architecture.md). A channel without a row uses its adapter's default."""

    channel = models.CharField(max_length=32, choices=TYPE_CHOICES, unique=True)
    strategy = models.CharField(max_length=16, choices=STRATEGY_CHOICES, default="fixed")
    interval_seconds = models.PositiveIntegerField(default=60, help_text="The base delay between attempts.")
    max_interval_seconds = models.PositiveIntegerField(default=0, help_text="Cap of the delay; 0: no cap.")
    jitter = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="0–1: up to this fraction of each delay is taken away at random.",
    )
    max_attempts = models.PositiveIntegerField(
        default=10, help_text="Failed attempts before parking (channel failures do not count); 0: unlimited."
    )
    max_age_seconds = models.PositiveIntegerField(
        default=0, help_text="Undelivered rows older than this park as expired; 0: never."
    )
    retry_on = models.JSONField(default=default_retry_on, blank=True, help_text="Failure classes that are retried.")
    breaker_threshold = models.PositiveIntegerField(
        default=5, validators=[MinValueValidator(1)], help_text="Consecutive channel failures that open the channel."
    )
    breaker_cooldown_seconds = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1)], help_text="Wait before the first probe of an open channel."
    )
    breaker_max_cooldown_seconds = models.PositiveIntegerField(
        default=600,
        validators=[MinValueValidator(1)],
        help_text="The wait doubles after each failed probe, up to this.",
    )
    rate_per_minute = models.PositiveIntegerField(
        default=0, help_text="Most deliveries started per minute, across all workers; 0: no limit."
    )

    class Meta:
        verbose_name = "delivery policy"
        verbose_name_plural = "delivery policies"
        constraints = [
            models.CheckConstraint(condition=models.Q(jitter__gte=0, jitter__lte=1), name="policy_jitter_range"),
            models.CheckConstraint(condition=models.Q(strategy__in=STRATEGIES), name="policy_strategy_valid"),
            models.CheckConstraint(
                condition=models.Q(breaker_threshold__gte=1, breaker_cooldown_seconds__gte=1),
                name="policy_breaker_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(breaker_max_cooldown_seconds__gte=models.F("breaker_cooldown_seconds")),
                name="policy_breaker_cooldown_order",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel}: {self.strategy}"


class ChannelHealth(models.Model):
    """The circuit breaker (and rate bucket) of one channel endpoint, shared by every worker
    through the database; written only by notifications.health."""

    class State(models.TextChoices):
        CLOSED = "closed", "closed"
        OPEN = "open", "open"
        HALF_OPEN = "half_open", "half open"

    channel = models.CharField(max_length=32, choices=TYPE_CHOICES)
    endpoint = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CLOSED)
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    last_failure_class = models.CharField(max_length=32, choices=FailureClass.choices, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    cooldown_seconds = models.PositiveIntegerField(default=0)
    probe_after = models.DateTimeField(null=True, blank=True)
    probe_claimed_by = models.CharField(max_length=64, blank=True)
    probe_claimed_until = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveIntegerField(default=0)  # probes started since the channel opened
    rate_tokens = models.FloatField(default=0.0)
    rate_refilled_at = models.DateTimeField(null=True, blank=True)
    # The answers the endpoint gave lately that may be its own failure rather than the rows'
    # (notifications.failure_shape.ShapeTracker); {} while there are none.
    shape = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "channel health"
        verbose_name_plural = "channel health"
        ordering = ["channel", "endpoint"]
        constraints = [
            models.UniqueConstraint(fields=["channel", "endpoint"], name="channel_health_unique_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.endpoint}: {self.state}"


class DispatchTimer(models.Model):
    """Who waits for the next due time (a lease): one dispatch task at a time sleeps until the
    next retry is due, so waiting never ties up more than one worker."""

    SINGLETON_PK = 1

    holder = models.CharField(max_length=64, blank=True)
    until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="dispatch_timer_singleton")]

    def __str__(self) -> str:
        return f"{self.holder or 'nobody'} until {self.until}"


class DispatchRequest(models.Model):
    """The trigger's own state: a dispatch task has been asked for and has not started yet
    (notifications.trigger). One row, set by a conditional update before the task is queued
    and cleared by the task when it starts, so that requests coalesce into one waiting task
    without reading the task broker's storage.

    ``token`` names the request (the task carries it); ``requested_at`` is when it was made
    (the database clock), ``replace_after`` when a new request may take its place if its task
    has not started by then, and ``reissued`` how many times in a row a request was made
    again because no task of the one before had started in time."""

    SINGLETON_PK = 1

    token = models.CharField(max_length=32, blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)
    replace_after = models.DateTimeField(null=True, blank=True)
    reissued = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="dispatch_request_singleton")]

    def __str__(self) -> str:
        return f"requested at {self.requested_at}" if self.requested_at else "no request waiting"


class WorkerProcess(models.Model):
    """One worker process (a django-q2 task process) as it last reported itself: when it
    started, when it last ran something and what, and whether it is running a task now
    (notifications.workers). Written by the workers only; a row of a process not seen for a
    day is removed when a new process starts."""

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    cluster = models.CharField(max_length=100)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    last_action = models.CharField(max_length=300, blank=True)
    busy = models.BooleanField(default=False)  # running a task (from its start to its end)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "pid", "cluster"], name="worker_process_unique"),
        ]
        indexes = [models.Index(fields=["last_seen_at"], name="worker_process_seen_idx")]
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return f"{self.host}:{self.pid} ({self.cluster})"


# --- channels beyond email (docs/channels.md) ----------------------------------------------


class TeamsTarget(models.Model):
    """A Microsoft Teams Workflows webhook URL a list posts Adaptive Cards to. The URL's query
    carries the workflow's signature (the URL is the credential), so it is encrypted at rest,
    never exported, and shown masked. Encryption makes every stored form different, so a list
    holds a URL at most once by its digest (``url_digest``)."""

    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="teams_targets")
    url = EncryptedTextField("Workflows URL", help_text="Stored encrypted; shown masked.")
    url_digest = models.CharField(max_length=64, editable=False)

    class Meta:
        verbose_name = "Teams target"
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["notification_list", "url_digest"], name="teams_target_unique_per_list")
        ]

    def __str__(self) -> str:
        return url_masked(self.url)

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.url_digest = teams_url_digest(self.url)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "url" in update_fields and "url_digest" not in update_fields:
            kwargs["update_fields"] = [*update_fields, "url_digest"]
        super().save(*args, **kwargs)


class WebhookTarget(BoundSecrets, models.Model):
    """An HTTP endpoint a list posts signed JSON to (Standard Webhooks); the signing secret is
    encrypted at rest and never exported."""

    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="webhook_targets")
    url = models.URLField("URL", max_length=2000)
    secret = EncryptedTextField(help_text='The signing secret, "whsec_" + base64. Stored encrypted; never shown.')
    secret_binding = _binding("signing secret")

    class Meta:
        verbose_name = "webhook target"
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["notification_list", "url"], name="webhook_target_unique_per_list")
        ]

    def __str__(self) -> str:
        return url_masked(self.url)


class SmsTarget(models.Model):
    """A phone number (E.164) a list texts."""

    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="sms_targets")
    phone_number = models.CharField("phone number (E.164)", max_length=16)

    class Meta:
        verbose_name = "SMS target"
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["notification_list", "phone_number"], name="sms_target_unique_per_list")
        ]

    def __str__(self) -> str:
        return self.phone_number


class AppriseTarget(models.Model):
    """An Apprise URL (Slack, Telegram, ntfy, …). The URL usually holds the service's
    credentials, so it is encrypted at rest and never exported; ``display`` is Apprise's own
    masked form of it, kept for the console."""

    notification_list = models.ForeignKey(NotificationList, on_delete=models.CASCADE, related_name="apprise_targets")
    url = EncryptedTextField("Apprise URL", help_text="Stored encrypted; shown masked.")
    display = models.CharField(max_length=500, blank=True, editable=False)

    class Meta:
        verbose_name = "Apprise target"
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.display or "(Apprise URL)"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.display = apprise_url_masked(self.url)[:500]
        super().save(*args, **kwargs)


class ChannelConfiguration(BoundSecrets, models.Model):
    """Per-channel delivery settings for the channels beyond email: one row per channel.

    SMS needs one (the provider account); Teams, webhooks and Apprise work without one, with
    the default timeout."""

    class Channel(models.TextChoices):
        TEAMS = "teams"
        WEBHOOK = "webhook"
        SMS = "sms"
        APPRISE = "apprise"

    class Provider(models.TextChoices):
        TWILIO = "twilio", "Twilio"

    DEFAULT_TIMEOUT_SECONDS = 10
    TWILIO_API_BASE = "https://api.twilio.com"

    channel = models.CharField(max_length=32, choices=Channel.choices, unique=True)
    timeout_seconds = models.PositiveIntegerField(
        default=DEFAULT_TIMEOUT_SECONDS, validators=[MinValueValidator(1)], help_text="For every network call."
    )
    # SMS only.
    provider = models.CharField(max_length=16, choices=Provider.choices, blank=True)
    account_sid = models.CharField(max_length=64, blank=True)
    auth_token = EncryptedTextField(blank=True, help_text="Stored encrypted; never exported or shown.")
    auth_token_binding = _binding("auth token")
    from_number = models.CharField("from number (E.164)", max_length=16, blank=True)
    api_base = models.URLField(
        "API base URL",
        max_length=500,
        blank=True,
        default=TWILIO_API_BASE,
        help_text="Where the provider's REST API is; change only for a test double or a regional edge.",
    )
    max_segments = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(10)],
        help_text="Subject and body are cut to fit this many SMS segments.",
    )

    class Meta:
        verbose_name = "channel configuration"
        verbose_name_plural = "channel configuration"
        ordering = ["channel"]
        constraints = [
            models.CheckConstraint(condition=models.Q(timeout_seconds__gte=1), name="channel_timeout_positive"),
            models.CheckConstraint(
                condition=models.Q(max_segments__gte=1, max_segments__lte=10), name="channel_segments_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} configuration"


class ProviderMessage(models.Model):
    """A message a provider accepted for one target of a notification, by the provider's id,
    so that its status callbacks find the notification (and stay cheap to look up)."""

    provider = models.CharField(max_length=16)
    provider_id = models.CharField(max_length=64)
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="provider_messages")
    target_ref = models.CharField(max_length=32)
    provider_status = models.CharField(max_length=32, blank=True)
    provider_status_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "provider_id"], name="provider_message_unique_id"),
        ]
        indexes = [
            # SMS replies: the messages sent to one number lately (notifications.sms_replies).
            models.Index(fields=["provider", "target_ref", "created_at"], name="provider_message_target_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.provider_id}: {self.provider_status}"


# --- suppression (docs/suppression.md) ---------------------------------------------------------


class Silence(models.Model):
    """Quiet for a while (Alertmanager-style): a notification that matches every given matcher
    of an active silence when it is ingested is Suppressed ("silence:<id>"). Blank matchers
    match everything; high and critical notifications only when included."""

    site = models.CharField("site id", max_length=64, blank=True, help_text="Blank: every site.")
    list_name = models.CharField(max_length=200, blank=True, help_text="Blank: every list.")
    source_instance_id = models.CharField(max_length=200, blank=True, help_text="Blank: every source.")
    subject_contains = models.CharField(max_length=255, blank=True, help_text="Case-insensitive; blank: every subject.")
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    reason = models.TextField()
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    include_high = models.BooleanField(default=False)
    include_critical = models.BooleanField(default=False)

    class Meta:
        ordering = ["-starts_at"]
        indexes = [models.Index(fields=["ends_at"], name="silence_ends_idx")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")), name="silence_ends_after_start"
            )
        ]

    def __str__(self) -> str:
        scope = ", ".join(
            f"{name}={value}"
            for name, value in (
                ("site", self.site),
                ("list", self.list_name),
                ("source", self.source_instance_id),
                ("subject~", self.subject_contains),
            )
            if value
        )
        return f"silence {self.pk} ({scope or 'everything'}) until {self.ends_at:%Y-%m-%d %H:%M} UTC"


class MaintenanceWindow(models.Model):
    """A weekly window during which a site's notifications are suppressed like a silence of that
    site ("silence:mw<id>"). Local times in ``time_zone``; ``ends`` before ``starts`` crosses
    midnight (the window then belongs to the day it starts on)."""

    site = models.CharField("site id", max_length=64)
    days = models.JSONField(default=list, help_text="Weekdays it starts on, 0 = Monday … 6 = Sunday.")
    starts = models.TimeField()
    ends = models.TimeField()
    time_zone = models.CharField(max_length=64, default="UTC", help_text="IANA name, e.g. Europe/Berlin.")
    reason = models.TextField(blank=True)
    include_high = models.BooleanField(default=False)
    include_critical = models.BooleanField(default=False)

    class Meta:
        ordering = ["site", "pk"]

    def __str__(self) -> str:
        return f"{self.site}: {self.starts:%H:%M}–{self.ends:%H:%M} {self.time_zone}"


class FloodWindow(models.Model):
    """The current flood window of one site, list and channel (notifications.suppression): how
    many notifications it has counted, and when it ends."""

    site = models.CharField(max_length=64)
    list_name = models.CharField(max_length=200)
    type = models.CharField(max_length=32)
    started_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["site", "list_name", "type"], name="flood_window_unique_key")]

    def __str__(self) -> str:
        return f"{self.site} {self.list_name} {self.type}: {self.count} until {self.ends_at:%H:%M:%S}"


class IncidentNote(models.Model):
    """An operator's note on an open channel or a group of parked rows ("relay team called, ETA
    04:00"), for the next shift: who wrote it and when. Notes are kept (never edited), newest
    first. A note is not an acknowledgement: it changes no notification."""

    # What the note is about: "channel:<name>" or "parked:<cause key>" (console.cause_key).
    subject = models.CharField(max_length=100)
    text = models.TextField(max_length=2000)
    author = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["subject", "-created_at"], name="incident_note_subject_idx")]

    def __str__(self) -> str:
        return f"{self.subject} {self.created_at:%Y-%m-%d %H:%M} {self.author}"
