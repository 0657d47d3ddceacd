"""The counts the database keeps (notifications.counts) equal the live counts of the rows after
every kind of change: ingest, delivery, parking, an operator's Retry, Discard and Requeue, a
bulk update, the purge and deletes; folded or not. On PostgreSQL the KPIs, the trends and the
flood report read them; SQLite counts the rows."""

import hashlib
import itertools
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from notifications import kpis, trends
from notifications.counts import (
    counts_fold,
    counts_kept,
    counts_rebuild,
    failed_hourly_counts,
    failures_since,
    hourly_counts,
    queued_by_channel,
)
from notifications.kpis import kpis_compute
from notifications.models import AlarmRateCount, DeliveryAttempt, FailedAttemptCount, Notification, NotificationCount
from notifications.operations import notification_discard, notification_requeue, notification_retry
from notifications.purge import notifications_purge
from notifications.suppression import alarms_per_list, alarms_per_list_counted
from tests.dispatch.conftest import queue, run_pass

Status = Notification.Status
_n = itertools.count()


def make(status, *, age, site="plant-a", channel="email", **fields):
    n = next(_n)
    created = timezone.now() - age
    values = {
        "notification_id": uuid.uuid4(),
        "type": channel,
        "list_name": ("Operators", "Shift leads", "Electrical")[n % 3],
        "subject": f"counted {n}",
        "source_site_id": site,
        "site_enqueued_at": created,
        "created_at": created,
        "status": status,
        "fingerprint": hashlib.sha256(f"counted {n}".encode()).hexdigest(),
    }
    values.update(fields)
    return Notification(**values)


def _hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _keys(row: Notification) -> list[tuple[datetime | None, str, str, str, bool, bool]]:
    """A row's keys as the triggers compute them (notifications.counts.KEYS_SQL), in Python:
    its totals key (bucket None) and its bucketed key (none for Discarded)."""
    partial = row.status == Status.DELIVERED and row.targets_refused > 0
    rest = (row.status, row.source_site_id, row.type, row.expired_at is not None, partial)
    if row.status == Status.DELIVERED:
        bucket = _hour(row.delivered_at or row.created_at)
    elif row.status == Status.PARKED:
        bucket = _hour(row.expired_at or row.last_attempt_at or row.created_at)
    elif row.status == Status.DISCARDED:
        return [(None, *rest)]
    else:
        queued = max(row.created_at, row.requeued_at or row.created_at)
        bucket = queued.astimezone(UTC).replace(second=0, microsecond=0)
    return [(None, *rest), (bucket, *rest)]


def live() -> Counter:
    return Counter(key for row in Notification.objects.all() for key in _keys(row))


def kept() -> Counter:
    sums: Counter = Counter()
    for c in NotificationCount.objects.all():
        bucket = None if c.bucket is None else c.bucket.astimezone(UTC)
        sums[(bucket, c.status, c.source_site_id, c.type, c.expired, c.partial)] += c.n
    return +sums  # keys whose changes sum to 0 hold no rows


def failed_live() -> Counter:
    failed = DeliveryAttempt.objects.exclude(failure_class="").select_related("notification")
    return Counter(
        (
            _hour(a.started_at),
            a.notification.source_site_id,
            a.notification.type,
            a.failure_class,
            a.targets_delivered > 0,
        )
        for a in failed
    )


def failed_kept() -> Counter:
    sums: Counter = Counter()
    for c in FailedAttemptCount.objects.all():
        sums[(c.bucket.astimezone(UTC), c.source_site_id, c.type, c.failure_class, c.partial)] += c.n
    return +sums


def _ten_minutes(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return moment.replace(minute=moment.minute // 10 * 10, second=0, microsecond=0)


def alarms_live() -> Counter:
    return Counter(
        (_ten_minutes(created), name) for created, name in Notification.objects.values_list("created_at", "list_name")
    )


def alarms_kept() -> Counter:
    sums: Counter = Counter()
    for c in AlarmRateCount.objects.all():
        sums[(c.bucket.astimezone(UTC), c.list_name)] += c.n
    return +sums


def assert_exact():
    assert kept() == live()
    assert failed_kept() == failed_live()
    assert alarms_kept() == alarms_live()
    now = timezone.now()
    # The KPIs' failures by class: whole hours of counts and the shorter edge of an hour of
    # attempts, for an interval starting early or late in its hour, or on it.
    for since in (now - timedelta(hours=1), _hour(now) - timedelta(minutes=50), _hour(now) - timedelta(minutes=5)):
        for start in (since, _hour(since)):
            since_start = DeliveryAttempt.objects.exclude(failure_class="").filter(started_at__gte=start)
            assert failures_since(start) == Counter(since_start.values_list("failure_class", flat=True))
    before = now - timedelta(minutes=10)
    assert kpis._open_figures_kept(before) == kpis._open_figures_counted(before)
    # The flood report's alarms per list per 10 minutes, over a day and a week.
    for intervals in (144, 1008):
        start = _ten_minutes(now) - timedelta(minutes=10 * (intervals - 1))
        assert sorted(alarms_per_list(start)) == sorted(alarms_per_list_counted(start))
    queued = Notification.objects.filter(status__in=Notification.NON_TERMINAL)
    assert queued_by_channel() == Counter(queued.values_list("type", flat=True))
    for hours in (24, 24 * 7):
        start = _hour(now) - timedelta(hours=hours - 1)
        counted = [Counter(trends._indexed(rows, start)) for rows in trends._counted_rows(start)]
        assert [
            Counter(hourly_counts(Status.DELIVERED, start)),
            Counter(hourly_counts(Status.DELIVERED, start, partial=True)),
            Counter(hourly_counts(Status.PARKED, start)),
        ] == counted
        failed = DeliveryAttempt.objects.exclude(failure_class="").filter(started_at__gte=start)
        by_partial = {
            None: failed,
            True: failed.filter(targets_delivered__gt=0),
            False: failed.filter(targets_delivered=0),
        }
        for partial, attempts in by_partial.items():
            assert Counter(
                {(h, site, channel): n for h, site, channel, n in failed_hourly_counts(start, partial=partial)}
            ) == Counter(
                (
                    int((_hour(a.started_at) - start).total_seconds() // 3600),
                    a.notification.source_site_id,
                    a.notification.type,
                )
                for a in attempts.select_related("notification")
            )
        assert {metric: Counter(rows) for metric, rows in trends._kept_rows(start).items()} == {
            metric: Counter(rows) for metric, rows in trends._counted_series(start).items()
        }


@pytest.fixture
def operator(db):
    return User.objects.create_user("counting-operator", is_staff=True)


@pytest.fixture
def history(postgres_only):
    """Rows of every status, several sites, channels and ages, inserted in one statement."""
    now = timezone.now()
    rows = []
    for i in range(60):
        site, channel = f"plant-{i % 3}", ("email", "webhook")[i % 2]
        age = timedelta(hours=i * 7, minutes=i)
        rows += [
            make(Status.PENDING, age=timedelta(minutes=i), site=site, channel=channel),
            make(Status.RETRYING, age=timedelta(minutes=3 * i), site=site, retry_count=1),
            make(
                Status.DELIVERED,
                age=age,
                site=site,
                channel=channel,
                delivered_at=now - age + timedelta(seconds=3),
                targets_refused=int(i % 3 == 0),  # delivered partially: one target refused it for good
            ),
            make(
                Status.PARKED,
                age=age,
                site=site,
                last_attempt_at=now - age + timedelta(minutes=1),
                expired_at=now - age if i % 4 == 0 else None,
                last_error="Retries exhausted",
            ),
            make(Status.DISCARDED, age=age, site=site, discarded_at=now - age + timedelta(hours=1)),
        ]
    Notification.objects.bulk_create(rows)
    attempts = []
    for i, row in enumerate(rows):
        if row.status != Status.PENDING:
            failed = row.status != Status.DELIVERED
            attempts.append(
                DeliveryAttempt(
                    notification=row,
                    started_at=now - timedelta(hours=i % 200, minutes=(13 * i) % 60),
                    outcome="transient" if failed else "success",
                    failure_class=("connection", "timeout")[i % 2] if failed else "",
                    # Some failed while other targets had it (a partial delivery), the rest reached none.
                    targets_delivered=2 if i % 10 == 1 else 0,
                )
            )
    DeliveryAttempt.objects.bulk_create(attempts)
    return rows


def test_counts_are_kept_on_postgresql_only(db):
    assert counts_kept() == (connection.vendor == "postgresql")


def test_inserted_rows_are_counted_by_key(history):
    assert_exact()
    assert sum(n for key, n in kept().items() if key[0] is None) == len(history) == 300


def test_operator_actions_and_updates_change_the_counts_exactly(history, operator):
    parked = [row.pk for row in history if row.status == Status.PARKED][:20]
    assert notification_retry(notification_ids=parked, user=operator).changed == 20
    assert_exact()
    waiting = [row.pk for row in history if row.status in (Status.PENDING, Status.RETRYING)][:15]
    assert notification_discard(notification_ids=waiting, user=operator, reason="obsolete").changed == 15
    assert_exact()
    assert notification_requeue(notification_ids=waiting[:5], user=operator).changed == 5
    assert_exact()
    # A bulk change of status, site and expiry at once; then one that changes no key.
    Notification.objects.filter(status=Status.PENDING, source_site_id="plant-1").update(
        status=Status.PARKED, last_attempt_at=timezone.now(), expired_at=timezone.now()
    )
    before = NotificationCount.objects.count()
    Notification.objects.filter(status=Status.RETRYING).update(claimed_by="w", claimed_until=timezone.now())
    assert NotificationCount.objects.count() == before  # a claim changes no count
    assert_exact()
    # A row moved to another list and another time (nothing in the product does that) moves
    # its alarm count too.
    alarms = AlarmRateCount.objects.count()
    moved = next(row for row in history if row.status == Status.DELIVERED)
    Notification.objects.filter(pk=moved.pk).update(list_name="Moved", created_at=timezone.now() - timedelta(days=2))
    assert AlarmRateCount.objects.count() > alarms
    assert_exact()


def test_attempts_that_fail_or_are_finished_change_the_failed_counts_exactly(history):
    first = DeliveryAttempt.objects.filter(outcome="success").order_by("id").values_list("id", flat=True)[:30]
    DeliveryAttempt.objects.filter(id__in=list(first)).update(outcome="transient", failure_class="timeout")
    assert_exact()
    some = DeliveryAttempt.objects.exclude(failure_class="").order_by("id").values_list("id", flat=True)[:10]
    DeliveryAttempt.objects.filter(id__in=list(some)).update(failure_class="", started_at=timezone.now())
    assert_exact()
    DeliveryAttempt.objects.filter(id__in=list(first)[:5]).delete()
    assert_exact()
    # An attempt recorded as failing while other targets had it moves to the partial key.
    DeliveryAttempt.objects.filter(id__in=list(first)[5:15]).update(targets_delivered=1)
    assert FailedAttemptCount.objects.filter(partial=True, folded=False).exists()
    assert_exact()


def test_a_row_delivered_partially_counts_in_keys_of_its_own(history):
    partial_keys = NotificationCount.objects.filter(partial=True)
    assert partial_keys.exists() and set(partial_keys.values_list("status", flat=True)) == {Status.DELIVERED}
    before = sum(partial_keys.filter(bucket__isnull=True).values_list("n", flat=True))
    row = next(row for row in history if row.status == Status.DELIVERED and not row.targets_refused)
    Notification.objects.filter(pk=row.pk).update(targets_refused=2)
    counts_fold()
    assert sum(partial_keys.filter(bucket__isnull=True).values_list("n", flat=True)) == before + 1
    assert_exact()


def test_the_migration_moves_rows_delivered_partially_to_their_keys_without_a_recount(history):
    """0036 on a table counted before it: the functions as 0017 left them and every row in a
    key without ``partial``; installing moves the refused rows' counts, nothing else."""
    from notifications.counts import counts_partial_install, counts_partial_uninstall

    assert FailedAttemptCount.objects.filter(partial=True).exists()
    with connection.schema_editor() as editor:
        counts_partial_uninstall(editor)
    assert not NotificationCount.objects.filter(partial=True).exists()
    assert not FailedAttemptCount.objects.filter(partial=True).exists()
    DeliveryAttempt.objects.update(targets_delivered=0)  # no attempt recorded it before 0036
    Notification.objects.filter(status=Status.PENDING, source_site_id="plant-0").update(status=Status.PARKED)
    assert not NotificationCount.objects.filter(partial=True).exists()  # the old function ignores it
    with connection.schema_editor() as editor:
        counts_partial_install(editor)
    assert_exact()
    Notification.objects.filter(status=Status.DELIVERED, targets_refused=0, source_site_id="plant-1").update(
        targets_refused=1
    )
    assert_exact()


def test_the_alarm_counts_migration_counts_the_rows_already_there(history):
    """0041 on a table of rows it never saw: installing counts them all, and the triggers it
    installs count what follows."""
    from notifications.counts import alarm_counts_install, alarm_counts_uninstall

    with connection.schema_editor() as editor:
        alarm_counts_uninstall(editor)
    AlarmRateCount.objects.all().delete()
    Notification.objects.bulk_create([make(Status.PENDING, age=timedelta(minutes=m)) for m in range(5)])
    assert not AlarmRateCount.objects.exists()
    with connection.schema_editor() as editor:
        alarm_counts_install(editor)
    assert sum(AlarmRateCount.objects.values_list("n", flat=True)) == len(history) + 5
    Notification.objects.bulk_create([make(Status.PENDING, age=timedelta(minutes=1))])
    assert_exact()


def test_failures_since_any_instant_are_whole_hours_of_counts_and_one_edge_of_attempts(history):
    # Failed attempts every 5 minutes of one hour, and instants throughout it: early ones take
    # the attempts before them from the counts, late ones add those after them.
    hour = _hour(timezone.now()) - timedelta(hours=5)
    row = next(row for row in history if row.status == Status.PARKED)
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(
            notification=row,
            started_at=hour + timedelta(minutes=minute, seconds=30),
            outcome="transient",
            failure_class=("throttled", "timeout", "connection")[minute % 3],
        )
        for minute in range(0, 60, 5)
    )
    failed = DeliveryAttempt.objects.exclude(failure_class="")
    for since in [hour + timedelta(minutes=minute) for minute in (0, 4, 12, 29, 31, 47, 59)] + [hour]:
        counted = Counter(failed.filter(started_at__gte=since).values_list("failure_class", flat=True))
        assert failures_since(since) == counted, since


def test_the_purge_and_deletes_take_their_rows_out_of_the_counts(history, settings):
    settings.OUTBOX_RETENTION_DAYS = 7
    report = notifications_purge(batch_size=25)
    assert report.deleted > 0
    assert_exact()
    Notification.objects.filter(source_site_id="plant-2").delete()
    assert_exact()


def test_folding_keeps_every_sum_and_leaves_one_row_per_key(history, operator):
    notification_retry(notification_ids=[row.pk for row in history if row.status == Status.PARKED], user=operator)
    assert NotificationCount.objects.filter(folded=False).exists()
    assert counts_fold(rows_max=10) > 0  # a partial fold is still exact
    assert_exact()
    while counts_fold():
        pass
    assert not NotificationCount.objects.filter(folded=False).exists()
    keys = Counter(NotificationCount.objects.values_list("bucket", "status", "source_site_id", "type", "expired"))
    assert set(keys.values()) == {1}
    assert not AlarmRateCount.objects.filter(folded=False).exists()
    assert set(Counter(AlarmRateCount.objects.values_list("bucket", "list_name")).values()) == {1}
    assert_exact()
    NotificationCount.objects.all().delete()
    AlarmRateCount.objects.all().delete()
    counts_rebuild()
    assert_exact()


def test_ingest_and_delivery_through_the_dispatcher_are_counted(postgres_only, smtp_config, operators_list):
    queue(7, site_id="plant-a")
    queue(3, site_id="plant-b")
    assert_exact()
    report = run_pass()
    assert report.claimed == 10
    assert Notification.objects.filter(status=Status.DELIVERED).count() == 10
    assert not NotificationCount.objects.filter(folded=False).exists()  # the pass folded its changes
    assert_exact()
    figures = kpis_compute()["global"]
    assert (figures["queue_depth"], figures["delivered_last_interval"]) == (0, 10)
    queue(2, site_id="plant-a")
    site = kpis_compute()["per_site"]["plant-a"]
    # Whole numbers, as the API has always served them (not 2.0 from a database sum).
    assert [type(site[key]) for key in ("queue_depth", "stuck", "parked", "expired")] == [int] * 4
    assert site["queue_depth"] == 2
