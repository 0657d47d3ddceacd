"""Retention purge and KPIs on crafted data."""

import base64
import hashlib
import itertools
import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from notifications.kpis import kpis_compute
from notifications.models import (
    ChannelHealth,
    DeliveryAttempt,
    EmailRecipient,
    Notification,
    NotificationList,
    ProviderMessage,
    SmtpConfiguration,
)
from notifications.purge import notifications_purge
from notifications.vocabulary import FailureClass
from tests.dispatch.conftest import queue
from tests.support.processes import settings_refusal
from tests.support.staff import staff_key_header

Status = Notification.Status
_n = itertools.count()
NOW = timezone.now()


def make(status, *, age, site="plant-a", delivered_ago=None, expired=False, targets_refused=0):
    n = next(_n)
    created = NOW - age
    row = Notification.objects.create(
        notification_id=uuid.uuid4(),
        list_name="Operators",
        subject=f"n{n}",
        source_site_id=site,
        site_enqueued_at=created,
        created_at=created,
        next_attempt_at=created,
        status=status,
        delivered_at=None if delivered_ago is None else NOW - delivered_ago,
        expired_at=NOW if expired else None,
        targets_refused=targets_refused,
        fingerprint=hashlib.sha256(str(n).encode()).hexdigest(),
    )
    DeliveryAttempt.objects.create(notification=row, outcome="success")
    return row


# --- purge ------------------------------------------------------------------------------------


@pytest.fixture
def aged(db, settings):
    settings.OUTBOX_RETENTION_DAYS = 30
    old, young = timedelta(days=31), timedelta(days=29)
    return {
        "old_terminal": [
            make(Status.DELIVERED, age=old),
            make(Status.PARKED, age=old),
            make(Status.DISCARDED, age=old),
        ],
        "old_live": [make(Status.PENDING, age=old), make(Status.RETRYING, age=old)],
        "young": [make(Status.DELIVERED, age=young), make(Status.PARKED, age=young)],
    }


def test_purge_deletes_only_terminal_rows_older_than_the_retention_window(aged):
    report = notifications_purge(now=NOW)
    assert report.deleted == 3
    remaining = set(Notification.objects.values_list("pk", flat=True))
    assert remaining == {n.pk for n in aged["old_live"] + aged["young"]}
    assert DeliveryAttempt.objects.count() == 4  # the purged rows' attempts went with them


def test_purge_deletes_old_suppressed_rows_like_the_other_final_states(db, settings):
    settings.OUTBOX_RETENTION_DAYS = 30
    old = make(Status.SUPPRESSED, age=timedelta(days=31))
    young = make(Status.SUPPRESSED, age=timedelta(days=29))
    assert notifications_purge(now=NOW).deleted == 1
    assert set(Notification.objects.values_list("pk", flat=True)) == {young.pk}
    assert not Notification.objects.filter(pk=old.pk).exists()


def test_purge_takes_every_row_that_refers_to_a_purged_notification(aged):
    # The purge deletes on PostgreSQL with its own SQL (notifications.db.expired_batch_delete),
    # not the ORM's cascade: it must know every table that refers to a notification.
    related = {relation.related_model for relation in Notification._meta.related_objects}
    assert related == {DeliveryAttempt, ProviderMessage}, "a new relation: teach expired_batch_delete"
    old = aged["old_terminal"][0]
    ProviderMessage.objects.create(provider="twilio", provider_id="SM1", notification=old, target_ref="t1")
    ProviderMessage.objects.create(provider="twilio", provider_id="SM2", notification=aged["young"][0], target_ref="t1")
    notifications_purge(now=NOW)
    assert list(ProviderMessage.objects.values_list("provider_id", flat=True)) == ["SM2"]


def test_purge_works_in_batches_and_reports_progress(aged):
    seen = []
    report = notifications_purge(now=NOW, batch_size=2, progress=lambda r: seen.append(r.deleted))
    assert (report.deleted, report.batches, seen) == (3, 2, [2, 3])


def test_purge_rests_after_each_batch_for_its_duty_cycle(aged, monkeypatch):
    from notifications import purge

    clock = iter(range(0, 1000, 2))  # every reading of the clock is 2 s after the one before
    monkeypatch.setattr(purge.time, "monotonic", lambda: next(clock))
    rests: list[float] = []
    monkeypatch.setattr(purge.time, "sleep", rests.append)
    report = notifications_purge(now=NOW, batch_size=1, duty_cycle=0.25)
    # Each batch takes 2 s by that clock: at a quarter of the time, 6 s of rest after each full
    # batch; none after the last, which found fewer rows than a batch (none at all).
    assert (report.deleted, report.batches, rests) == (3, 3, [6, 6, 6])
    assert Notification.objects.count() == 4


def test_purge_stops_between_batches_at_its_time_budget(aged, monkeypatch):
    from notifications import purge

    monkeypatch.setattr(purge.time, "sleep", lambda seconds: None)
    report = notifications_purge(now=NOW, batch_size=2, time_budget=0)
    # At least one batch runs, however short the budget; then it stops with rows left.
    assert (report.deleted, report.batches, report.more) == (2, 1, True)
    assert "more remain" in str(report)
    report = notifications_purge(now=NOW, batch_size=2, time_budget=3600)
    assert (report.deleted, report.more) == (1, False)
    assert Notification.objects.count() == 4


def test_purge_task_queues_a_follow_up_while_expired_rows_remain(aged, monkeypatch, settings):
    from django_q.conf import Conf
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    from notifications import tasks
    from notifications.schedules import PURGE_TASK

    def queued_purges():
        payloads = OrmQ.objects.filter(key=Conf.CLUSTER_NAME).values_list("payload", flat=True)
        return [p for p in payloads if SignedPackage.loads(p)["func"] == PURGE_TASK]

    settings.OUTBOX_PURGE_BATCH_SIZE = 2
    monkeypatch.setattr(tasks, "task_time_budget", lambda: 0)
    assert "more remain" in tasks.purge_task()
    assert Notification.objects.count() == 5 and len(queued_purges()) == 1
    assert "more remain" not in tasks.purge_task()  # the follow-up finishes: no other one
    assert Notification.objects.count() == 4 and len(queued_purges()) == 1


def test_purge_dry_run_counts_and_deletes_nothing(aged):
    report = notifications_purge(now=NOW, dry_run=True)
    assert report.deleted == 3 and "would delete 3" in str(report)
    assert Notification.objects.count() == 7


def test_purge_command_prints_progress_and_honours_dry_run(aged, capsys):
    call_command("purge_notifications", "--dry-run")
    assert "would delete 3 terminal notifications" in capsys.readouterr().out
    assert Notification.objects.count() == 7
    call_command("purge_notifications", "--batch-size", "2")
    out = capsys.readouterr().out
    assert "batch 1: 2 deleted so far" in out and "deleted 3 terminal notifications" in out
    assert Notification.objects.count() == 4


def test_purge_command_prints_a_line_at_most_every_5_seconds(aged, capsys, monkeypatch):
    from notifications import purge

    clock = itertools.count()  # every reading of the clock is 1 s after the one before
    monkeypatch.setattr(purge.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(purge.time, "sleep", lambda seconds: None)
    call_command("purge_notifications", "--batch-size", "1", "--duty-cycle", "1")
    lines = capsys.readouterr().out.splitlines()
    # Batches end at 3, 6 and 9 s by that clock: the first is printed, the second is only 3 s
    # later and is not, the third is 6 s after the first; then the total.
    assert lines[:2] == ["  batch 1: 1 deleted so far (3.0 s)", "  batch 3: 3 deleted so far (9.0 s)"]
    assert lines[2].startswith("deleted 3 terminal notifications") and lines[2].endswith(" in 13.0 s")
    assert len(lines) == 3


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--duty-cycle", "0", "must be above 0 and at most 1, got 0"),
        ("--duty-cycle", "1.5", "must be above 0 and at most 1, got 1.5"),
        ("--duty-cycle", "half", "must be a number above 0 and at most 1, got 'half'"),
        ("--batch-size", "0", "must be a positive number of rows, got 0"),
        ("--batch-size", "many", "must be a positive number of rows, got 'many'"),
    ],
)
def test_purge_command_refuses_a_bad_option_naming_it(aged, option, value, message):
    with pytest.raises(CommandError, match=re.escape(f"argument {option}: {message}")):
        call_command("purge_notifications", option, value)
    assert Notification.objects.count() == 7


# --- KPIs -------------------------------------------------------------------------------------


@pytest.fixture
def crafted(db, settings):
    settings.OUTBOX_STUCK_AGE = 600
    settings.OUTBOX_KPI_INTERVAL = 3600
    make(Status.PENDING, age=timedelta(minutes=30))  # stuck
    make(Status.RETRYING, age=timedelta(minutes=5))
    make(Status.PENDING, age=timedelta(seconds=10))
    make(Status.PARKED, age=timedelta(days=2))
    make(Status.DELIVERED, age=timedelta(minutes=20), delivered_ago=timedelta(minutes=19))
    make(Status.DELIVERED, age=timedelta(hours=3), delivered_ago=timedelta(hours=2))  # before the interval
    make(Status.DISCARDED, age=timedelta(days=3))
    make(Status.PENDING, age=timedelta(minutes=11), site="plant-b")  # stuck
    make(Status.PARKED, age=timedelta(days=1), site="plant-b", expired=True)
    make(Status.DELIVERED, age=timedelta(days=9), site="plant-c", delivered_ago=timedelta(days=9))
    # Delivered partially (a recipient refused it for good): within the interval, and before it.
    make(
        Status.DELIVERED,
        age=timedelta(minutes=9),
        site="plant-b",
        delivered_ago=timedelta(minutes=8),
        targets_refused=2,
    )
    make(Status.DELIVERED, age=timedelta(days=2), site="plant-b", delivered_ago=timedelta(days=2), targets_refused=1)
    # Failed attempts: two within the interval, one before it.
    retrying = Notification.objects.get(status=Status.RETRYING)
    for failure_class, ago in (("connection", 5), ("connection", 50), ("auth", 61)):
        DeliveryAttempt.objects.create(
            notification=retrying,
            outcome="transient",
            failure_class=failure_class,
            started_at=NOW - timedelta(minutes=ago),
        )


NO_FAILURES = dict.fromkeys(FailureClass.values, 0)


def test_kpis_are_computed_globally_and_per_site(crafted):
    kpis = kpis_compute(now=NOW)
    assert kpis["global"] == {
        "queue_depth": 4,
        "stuck": 2,
        "parked": 2,
        "expired": 1,
        "delivered_last_interval": 2,
        "partially_delivered_last_interval": 1,
        "oldest_pending_age_seconds": 1800.0,
        "failures_last_interval": {**NO_FAILURES, "connection": 2},
        "deliveries_queued": 0,  # their list has no members
        "suppressed_last_interval": 0,
        "held_for_digest": 0,
        "queue_depth_by_priority": {"critical": 0, "high": 0, "normal": 4, "low": 0},
        "unacknowledged": 0,  # none asks for acknowledgement
        "unacknowledged_by_priority": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        "time_to_ack": {"per_list": {}, "per_site": {}},
    }
    assert kpis["per_site"] == {
        "plant-a": {
            "queue_depth": 3,
            "stuck": 1,
            "parked": 1,
            "expired": 0,
            "delivered_last_interval": 1,
            "partially_delivered_last_interval": 0,
            "deliveries_queued": 0,
            "suppressed_last_interval": 0,
            "held_for_digest": 0,
            "oldest_pending_age_seconds": 1800.0,
            "unacknowledged": 0,
            "time_to_ack": None,
        },
        "plant-b": {
            "queue_depth": 1,
            "stuck": 1,
            "parked": 1,
            "expired": 1,
            "delivered_last_interval": 1,
            "partially_delivered_last_interval": 1,
            "deliveries_queued": 0,
            "suppressed_last_interval": 0,
            "held_for_digest": 0,
            "oldest_pending_age_seconds": 660.0,
            "unacknowledged": 0,
            "time_to_ack": None,
        },
    }
    assert kpis["channels"] == []
    assert kpis["computed_at"].endswith("Z")


def test_kpis_list_open_channels_with_since_when_the_last_class_and_the_rows_waiting(crafted):
    SmtpConfiguration.objects.create(host="smtp.example.com", port=587, from_address="outbox@example.com")
    opened = NOW - timedelta(minutes=7)
    ChannelHealth.objects.create(
        channel="email",
        endpoint="smtp.example.com:587",
        state="open",
        opened_at=opened,
        last_failure_class="auth",
        last_error="535 authentication failed",
        probe_after=NOW + timedelta(seconds=30),
        probes=2,
    )
    ChannelHealth.objects.create(channel="email", endpoint="old-relay:25", state="closed")
    # The relay used before this one, still open when it was replaced: nothing goes there.
    ChannelHealth.objects.create(channel="email", endpoint="older-relay:25", state="open", opened_at=opened)
    (channel,) = kpis_compute(now=NOW)["channels"]
    assert channel == {
        "channel": "email",
        "endpoint": "smtp.example.com:587",
        "state": "open",
        "since": opened.isoformat().replace("+00:00", "Z"),
        "last_failure_class": "auth",
        "last_error": "535 authentication failed",
        "next_probe_at": (NOW + timedelta(seconds=30)).isoformat().replace("+00:00", "Z"),
        "probes": 2,
        "rows_waiting": 4,
    }


def test_kpis_of_an_empty_table_have_no_oldest_age(db):
    kpis = kpis_compute()
    assert kpis["global"] == {
        "queue_depth": 0,
        "stuck": 0,
        "parked": 0,
        "expired": 0,
        "delivered_last_interval": 0,
        "partially_delivered_last_interval": 0,
        "oldest_pending_age_seconds": None,
        "failures_last_interval": NO_FAILURES,
        "deliveries_queued": 0,
        "suppressed_last_interval": 0,
        "held_for_digest": 0,
        "queue_depth_by_priority": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        "unacknowledged": 0,
        "unacknowledged_by_priority": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        "time_to_ack": {"per_list": {}, "per_site": {}},
    }
    assert kpis["per_site"] == {}
    assert kpis["channels"] == []


def test_kpis_take_a_few_queries_while_every_channel_is_healthy(crafted, django_assert_num_queries):
    # PostgreSQL, from the kept counts (notifications.counts): the three folds, the open figures, the
    # stuck figure, the oldest queued per site. SQLite: one statement over the open rows. Then
    # the delivered rows (two halves of one statement), failures by class, channel health; the
    # waiting rows by site, channel and list with the lists they name (deliveries), the
    # waiting rows by priority; the unacknowledged rows and the acknowledgements of the interval;
    # the suppressed and held rows.
    expected = 15 if connection.vendor == "postgresql" else 10
    with django_assert_num_queries(expected):
        kpis_compute()


def token(username):
    """A new staff key of ``username``, issued while the user is staff (which it may not stay)."""
    user = User.objects.get(username=username)
    was_staff = user.is_staff
    User.objects.filter(pk=user.pk).update(is_staff=True)
    user.is_staff = True
    header = staff_key_header(user)
    User.objects.filter(pk=user.pk).update(is_staff=was_staff)
    return header


def test_kpi_endpoint_answers_staff_with_a_token_or_a_session(crafted, client):
    boss = User.objects.create_user("boss", password="pw-123456", is_staff=True)
    response = client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=token("boss"))
    assert response.status_code == 200
    assert response.json()["global"]["queue_depth"] == 4
    client.force_login(boss)
    assert client.get("/api/v1/kpis/").json()["per_site"]["plant-b"]["parked"] == 1


def test_kpi_endpoint_refuses_anonymous_with_401_and_non_staff_with_403(db, client, api):
    User.objects.create_user("clerk", password="pw-123456", is_staff=False)
    response = client.get("/api/v1/kpis/")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Token")
    assert client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=token("clerk")).status_code == 403
    assert client.get("/api/v1/kpis/", HTTP_AUTHORIZATION="Token 0123456789abcdef").status_code == 401
    # HTTP Basic is not offered: each guess would cost a password hash.
    basic = "Basic " + base64.b64encode(b"clerk:pw-123456").decode()
    assert client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=basic).status_code == 401
    assert api.get("/api/v1/kpis/").status_code == 401  # a site key is not a staff login


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "must be above 0 and at most 1, got '0'"),
        ("1.5", "must be above 0 and at most 1, got '1.5'"),
        ("0.5x", "is invalid: not a number: '0.5x'"),
    ],
)
def test_a_bad_purge_duty_cycle_stops_the_process_naming_the_variable(value, problem):
    assert f"Environment variable OUTBOX_PURGE_DUTY_CYCLE {problem}" in settings_refusal(OUTBOX_PURGE_DUTY_CYCLE=value)


def test_kpis_show_each_sites_waiting_deliveries_as_notifications_times_their_lists_targets(db):
    five = NotificationList.objects.create(name="Shift", recipient_mode="individual")
    for n in range(5):
        EmailRecipient.objects.create(notification_list=five, email=f"op{n}@example.com")
    one = NotificationList.objects.create(name="Engineer")
    EmailRecipient.objects.create(notification_list=one, email="eng@example.com")
    queue(3, site_id="plant-a", list_name="Shift")
    queue(1, site_id="plant-a", list_name="Engineer")
    queue(2, site_id="plant-b", list_name="shift")  # list names match ignoring case
    queue(1, site_id="plant-b", list_name="Nobody")  # no such list: nothing will be sent
    queue(1, site_id="plant-c", list_name="Engineer", priority="critical")

    kpis = kpis_compute()

    assert {site: figures["deliveries_queued"] for site, figures in kpis["per_site"].items()} == {
        "plant-a": 16,
        "plant-b": 10,
        "plant-c": 1,
    }
    assert kpis["global"]["deliveries_queued"] == 27
    assert kpis["global"]["queue_depth_by_priority"] == {"critical": 1, "high": 0, "normal": 7, "low": 0}
