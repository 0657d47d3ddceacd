"""Suppression end to end: notifications posted to the real ingest API, delivered by real
dispatch passes to a real SMTP server (aiosmtpd on loopback): duplicates, silences, maintenance
windows, flood digests, Deliver anyway, and a reconciliation of a mixed flood."""

import json
import threading
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from notifications import ingest
from notifications.acknowledgement import list_settings_forget
from notifications.clock import database_now
from notifications.dispatch.claim import dispatch_wake_at
from notifications.models import FloodWindow, MaintenanceWindow, Notification, NotificationList, Silence
from notifications.suppression import (
    anchor_candidates,
    digests_flush,
    maintenance_window_covers,
    silence_suppressed,
    suppression_rules_forget,
)
from sites.models import Site
from sites.services import site_key_issue
from tests.admin.conftest import make_user
from tests.dispatch.conftest import run_pass
from tests.support.payloads import make_payload
from tests.support.staff import staff_key_header

Status = Notification.Status
URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"

pytestmark = pytest.mark.usefixtures("operators_list")


@pytest.fixture(autouse=True)
def _rules_read_afresh():
    """Every test sees the rules it stored (the per-process cache is dropped on each save in
    this process anyway; this also drops what an earlier test left)."""
    suppression_rules_forget()
    yield
    suppression_rules_forget()


def post(client, data, url=URL):
    return client.post(url, json.dumps(data), content_type="application/json")


def send(client, **fields):
    response = post(client, make_payload(**fields))
    assert response.status_code == 201, response.content
    return response.json()


def send_batch(client, payloads):
    for start in range(0, len(payloads), 500):
        response = post(client, {"notifications": payloads[start : start + 500]}, BATCH_URL)
        assert response.status_code == 200, response.content
        assert {item["result"] for item in response.json()["results"]} == {"created"}


def drain():
    while run_pass().claimed:
        pass


def row(record):
    return Notification.objects.get(pk=record["notification_id"])


def list_settings(**fields):
    NotificationList.objects.filter(name="Operators").update(**fields)
    suppression_rules_forget()


@pytest.fixture
def operator_api(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("olivia", groups=["Operators"])))
    return client


@pytest.fixture
def plant_b_api(db):
    site = Site.objects.create(site_id="plant-b", name="Plant B")
    _, key = site_key_issue(site=site)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client


@pytest.fixture(params=["in one statement", "in a transaction"])
def dedup_path(request, monkeypatch, db):
    """The two ways a duplicate is decided: one notification with a key in one statement
    (PostgreSQL), or under the list's lock in a transaction (batches, flood lists, SQLite); a
    test using this fixture runs with each, and every single post takes the one given."""
    if request.param == "in one statement":
        if connection.vendor != "postgresql":
            pytest.skip("one statement is PostgreSQL's way; SQLite decides in a transaction")
    else:
        monkeypatch.setattr(ingest, "row_duplicate_insert", lambda **kwargs: None)
    return request.param


# --- duplicates ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("dedup_path")
def test_200_with_one_dedup_key_inside_the_window_send_one_email_and_count_200_occurrences(
    api, smtp_server, smtp_config
):
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="pump-3-trip")
    send_batch(api, [make_payload(dedup_key="pump-3-trip") for _ in range(99)])
    for _ in range(100):
        send(api, dedup_key="pump-3-trip")
    drain()

    assert smtp_server.count == 1
    assert smtp_server.count_by_notification_id() == Counter({first["notification_id"]: 1})
    statuses = Counter(Notification.objects.values_list("status", flat=True))
    assert statuses == Counter({Status.DELIVERED: 1, Status.SUPPRESSED: 199})
    assert set(Notification.objects.filter(status=Status.SUPPRESSED).values_list("suppressed_by", flat=True)) == {
        f"duplicate:{first['notification_id']}"
    }
    record = api.get(f"{URL}{first['notification_id']}/").json()
    assert record["occurrences"] == 200
    assert record["last_occurrence_at"] is not None
    assert record["dedup_key"] == "pump-3-trip"


@pytest.mark.usefixtures("dedup_path")
def test_a_duplicate_is_answered_suppressed_with_its_reason_and_its_replay_changes_nothing(api, smtp_config):
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="level-switch")
    payload = make_payload(dedup_key="level-switch")
    created = post(api, payload)
    assert created.status_code == 201
    assert created.json()["status"] == "Suppressed"
    assert created.json()["suppressed_by"] == f"duplicate:{first['notification_id']}"
    assert created.json()["next_attempt_at"] is None  # final at once: never due
    assert row(created.json()).next_attempt_at is None

    replay = post(api, payload)
    assert replay.status_code == 200
    assert replay.json()["status"] == "Suppressed"
    assert row(first).occurrences == 2  # the replay is not another occurrence
    # The key is part of the content: the same id with another key is a conflict.
    assert post(api, {**payload, "dedup_key": "other"}).status_code == 422


@pytest.mark.usefixtures("dedup_path")
def test_a_higher_priority_with_the_same_key_is_delivered(api, smtp_server, smtp_config):
    list_settings(dedup_window_seconds=3600)
    send(api, dedup_key="pump-3-trip")
    critical = send(api, dedup_key="pump-3-trip", priority="critical")
    normal_again = send(api, dedup_key="pump-3-trip")
    drain()

    assert row(critical).status == Status.DELIVERED
    # The critical one is now the last one sent: the next normal one repeats it.
    assert row(normal_again).suppressed_by == f"duplicate:{critical['notification_id']}"
    assert smtp_server.count == 2


@pytest.mark.parametrize("ended_by", ["acknowledged_at", "cleared_at"])
@pytest.mark.usefixtures("dedup_path")
def test_after_acknowledgement_or_clearing_the_next_one_is_delivered(api, smtp_server, smtp_config, ended_by):
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="pump-3-trip")
    assert send(api, dedup_key="pump-3-trip")["status"] == "Suppressed"
    # Acknowledging and clearing are their own features; here only their effect on the row.
    Notification.objects.filter(pk=first["notification_id"]).update(**{ended_by: timezone.now()})
    after = send(api, dedup_key="pump-3-trip")
    assert after["status"] == "Pending"
    assert send(api, dedup_key="pump-3-trip")["suppressed_by"] == f"duplicate:{after['notification_id']}"
    drain()
    assert smtp_server.count == 2


@pytest.mark.usefixtures("dedup_path")
def test_once_the_window_has_passed_the_next_one_is_delivered_and_a_suppressed_one_never_anchors(api, smtp_config):
    list_settings(dedup_window_seconds=60)
    first = send(api, dedup_key="k")
    send(api, dedup_key="k")
    Notification.objects.filter(pk=first["notification_id"]).update(created_at=timezone.now() - timedelta(seconds=61))
    # The suppressed one is younger than the window, but only a row that was sent anchors.
    later = send(api, dedup_key="k")
    assert later["status"] == "Pending"


@pytest.mark.usefixtures("dedup_path")
def test_without_a_window_or_a_key_nothing_is_a_duplicate(api, smtp_config):
    send(api, dedup_key="k")
    assert send(api, dedup_key="k")["status"] == "Pending"
    list_settings(dedup_window_seconds=3600)
    send(api)
    assert send(api)["status"] == "Pending"


def test_a_dedup_key_is_validated(api):
    response = post(api, make_payload(dedup_key="k" * 201))
    assert response.status_code == 400
    assert "dedup_key" in response.json()["errors"]
    assert post(api, make_payload(dedup_key="a\nb")).status_code == 400


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("dedup_path")
def test_concurrent_ingests_of_one_key_lose_no_count_and_make_one_anchor(site_key, postgres_only):
    list_settings(dedup_window_seconds=3600)
    errors = []

    def poster():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
        try:
            for _ in range(10):
                assert post(client, make_payload(dedup_key="race")).status_code == 201
        except Exception as error:
            errors.append(error)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=poster) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    anchors = Notification.objects.filter(dedup_key="race", suppressed_by="")
    assert anchors.count() == 1
    assert anchors.get().occurrences == 60
    assert Notification.objects.filter(status=Status.SUPPRESSED).count() == 59


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_single_posts_and_batches_of_one_key_at_once_lose_no_count_and_make_one_anchor(site_key, postgres_only):
    # Single posts are decided in one statement, batches in a transaction: under one lock.
    list_settings(dedup_window_seconds=3600)
    errors = []

    def poster(batched):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
        try:
            for _ in range(5):
                if batched:
                    payloads = [make_payload(dedup_key="race"), make_payload(dedup_key="race")]
                    assert post(client, {"notifications": payloads}, BATCH_URL).status_code == 200
                else:
                    assert post(client, make_payload(dedup_key="race")).status_code == 201
                    assert post(client, make_payload(dedup_key="race")).status_code == 201
        except Exception as error:
            errors.append(error)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=poster, args=(number % 2 == 0,)) for number in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    anchor = Notification.objects.get(dedup_key="race", suppressed_by="")
    assert anchor.occurrences == 60
    assert set(Notification.objects.filter(status=Status.SUPPRESSED).values_list("suppressed_by", flat=True)) == {
        f"duplicate:{anchor.pk}"
    }


def test_a_single_notification_with_a_key_is_decided_stored_and_counted_in_one_statement(
    api, smtp_config, postgres_only
):
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="pump-3-trip")
    send(api)  # the rules and lists are read (and kept for a while) by now
    with CaptureQueriesContext(connection) as statements:
        duplicate = send(api, dedup_key="pump-3-trip")
    rules = ("notifications_silence", "notifications_maintenancewindow", "notifications_notificationlist")
    writes = [q["sql"] for q in statements.captured_queries if not any(name in q["sql"] for name in rules)]
    assert len(writes) == 1, writes
    assert duplicate["suppressed_by"] == f"duplicate:{first['notification_id']}"
    assert row(first).occurrences == 2

    # Planned like the plain insert: the rows read from one function, no join, a cost far below
    # the point where PostgreSQL compiles a statement (a join with a set-returning function was
    # estimated at 1,000 rows: half a second of JIT compilation at every ingest).
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {writes[0]}")
        (explained,) = cursor.fetchone()
        cursor.execute("SELECT current_setting('jit_above_cost')::float")
        (jit_above_cost,) = cursor.fetchone()
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    assert [node["Node Type"] for node in plan["Plans"]] == ["Function Scan"]
    assert plan["Total Cost"] < jit_above_cost / 100


def rows_read_from_notifications() -> int:
    """Rows of the notifications table read in this transaction so far (sequential scans and
    index fetches), as PostgreSQL counts them for the transaction's own statements."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
            "WHERE relname = 'notifications_notification'"
        )
        return cursor.fetchone()[0]


@pytest.mark.usefixtures("dedup_path")
def test_a_chattering_key_finds_its_anchor_without_reading_the_duplicates_suppressed_since(api, smtp_config):
    """A flapping switch raises the same alarm thousands of times within the window. Each new
    one looks up its anchor (the key's last row that was not suppressed) by reading that row,
    not the duplicates suppressed after it: otherwise every ingest of a chattering alarm would
    cost more than the one before, in the very flood suppression is there for."""
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="pump-3-level")
    send_batch(api, [make_payload(dedup_key="pump-3-level") for _ in range(2000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifications_notification")  # as autovacuum would have by now
    if connection.vendor == "postgresql":
        before = rows_read_from_notifications()
    duplicate = send(api, dedup_key="pump-3-level")
    assert duplicate["suppressed_by"] == f"duplicate:{first['notification_id']}"
    assert row(first).occurrences == 2002
    if connection.vendor == "postgresql":  # the rows read, as PostgreSQL counts them
        read = rows_read_from_notifications() - before
        assert read < 20, f"{read} rows read to ingest one duplicate of a key with 2,000 suppressed ones"
    else:  # SQLite counts nothing of the kind: its plan names the index
        candidates = anchor_candidates(site_id="plant-a", list_name="Operators", dedup_keys=["pump-3-level"])
        assert "USING INDEX notif_dedup_anchor_idx" in candidates[:1].explain()


def test_a_batch_of_many_keys_looks_their_anchors_up_and_counts_them_in_one_query_each(api, smtp_config):
    """An agent forwarding a backlog sends batches of many keys: their anchors are read in one
    query, not one per key, counted in one statement per number of duplicates, and each key is decided as a single post would decide it — a key
    with an open anchor inside the window is a duplicate, one whose anchor is older than the
    window or acknowledged is not, a new key is sent once and its repeats in the batch are
    duplicates of it."""
    list_settings(dedup_window_seconds=3600)
    inside = [send(api, dedup_key=f"inside-{n}") for n in range(20)]
    old = [send(api, dedup_key=f"old-{n}") for n in range(10)]
    Notification.objects.filter(pk__in=[record["notification_id"] for record in old]).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    acked = send(api, dedup_key="acked")
    Notification.objects.filter(pk=acked["notification_id"]).update(acknowledged_at=timezone.now())
    payloads = (
        [make_payload(dedup_key=f"inside-{n}") for n in range(20)]
        + [make_payload(dedup_key=f"old-{n}") for n in range(10)]
        + [make_payload(dedup_key="acked")]
        + [make_payload(dedup_key=f"new-{n}") for n in range(30) for _ in range(2)]
    )
    with CaptureQueriesContext(connection) as queries:
        send_batch(api, payloads)
    lookups = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and "dedup_key" in q["sql"]]
    assert len(lookups) == 1, lookups
    counted = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE") and "occurrences" in q["sql"]
    ]
    assert len(counted) == 1, counted  # 50 anchors, each counted once more, in one statement

    def fate(payload):
        stored = Notification.objects.get(pk=payload["notification_id"])
        return stored.suppressed_by

    anchors = {record["dedup_key"]: record["notification_id"] for record in inside}
    for payload in payloads[:20]:
        assert fate(payload) == f"duplicate:{anchors[payload['dedup_key']]}"
    assert [fate(payload) for payload in payloads[20:31]] == [""] * 11  # a new anchor each
    news = payloads[31:]
    for first, second in zip(news[::2], news[1::2], strict=True):
        assert (fate(first), fate(second)) == ("", f"duplicate:{first['notification_id']}")
    assert all(row(record).occurrences == 2 for record in inside)


@pytest.mark.usefixtures("dedup_path")
def test_a_keyed_notification_sent_starts_its_escalation_and_its_duplicate_does_not(api, smtp_config):
    NotificationList.objects.create(name="Shift-Leads")
    list_settings(
        dedup_window_seconds=3600,
        ack_required_from="high",
        escalation=[{"after_seconds": 60, "list": "Shift-Leads", "type": "email"}],
    )
    list_settings_forget()
    first = row(send(api, dedup_key="gas-4", priority="high"))
    again = row(send(api, dedup_key="gas-4", priority="high"))
    assert (first.status, first.escalation_step) == (Status.PENDING, 0)
    assert first.escalation_due_at == first.created_at + timedelta(seconds=60)
    assert (again.status, again.escalation_step, again.escalation_due_at) == (Status.SUPPRESSED, None, None)
    assert again.next_attempt_at is None


# --- silences and maintenance windows ----------------------------------------------------------


def test_what_a_silence_suppressed_is_found_by_its_reason_not_by_reading_the_table(
    api, operator_api, smtp_config, postgres_only
):
    """The Silences page counts each silence's rows and "Deliver anyway" reads them, the staff
    API lists silences with their counts: each reads the rows the silence holds back, not the
    whole table (at 2,000,000 rows a silence's count took half a second before)."""
    sent = send(api)
    with connection.cursor() as cursor:  # a table of rows no silence touched
        cursor.execute(
            "INSERT INTO notifications_notification SELECT (jsonb_populate_record(n, jsonb_build_object("
            "'notification_id', gen_random_uuid()))).* "
            "FROM notifications_notification AS n, generate_series(1, 5000) WHERE n.notification_id = %s",
            [sent["notification_id"]],
        )
    silence = Silence.objects.create(site="plant-a", ends_at=timezone.now() + timedelta(hours=2), reason="Shutdown")
    silenced = [send(api) for _ in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifications_notification")

    before = rows_read_from_notifications()
    held = sorted(str(pk) for pk in silence_suppressed(silence.pk).values_list("pk", flat=True))
    listed = operator_api.get("/api/v1/silences/")
    read = rows_read_from_notifications() - before

    assert held == sorted(record["notification_id"] for record in silenced)
    assert listed.status_code == 200, listed.content
    assert [item["suppressed"] for item in listed.json()] == [3]
    assert read < 20, f"{read} rows read to find the 3 rows a silence suppressed among 5,000"


def test_a_silence_on_a_site_suppresses_its_notifications_but_not_another_sites_nor_a_critical(
    api, plant_b_api, smtp_server, smtp_config
):
    silence = Silence.objects.create(
        site="plant-a", ends_at=timezone.now() + timedelta(hours=2), reason="Plant A shut down", created_by="olivia"
    )
    silenced = [send(api) for _ in range(3)]
    high = send(api, priority="high")
    critical = send(api, priority="critical")
    other_site = send(plant_b_api)
    drain()

    for record in silenced:
        assert record["status"] == "Suppressed"
        assert row(record).suppressed_by == f"silence:{silence.pk}"
    assert row(high).status == Status.DELIVERED  # high is silenced only when the silence includes it
    assert row(critical).status == Status.DELIVERED
    assert row(other_site).status == Status.DELIVERED
    assert smtp_server.count == 3  # high (not included), critical and plant B's


def test_high_and_critical_are_silenced_only_when_included(api, smtp_config):
    Silence.objects.create(site="plant-a", ends_at=timezone.now() + timedelta(hours=1), reason="r", include_high=True)
    assert send(api, priority="high")["status"] == "Suppressed"
    assert send(api, priority="critical")["status"] == "Pending"
    Silence.objects.create(
        list_name="operators", ends_at=timezone.now() + timedelta(hours=1), reason="r", include_critical=True
    )
    assert send(api, priority="critical")["status"] == "Suppressed"


def test_a_silence_matches_only_on_all_its_matchers_and_only_while_active(api, smtp_config):
    now = timezone.now()
    Silence.objects.create(
        source_instance_id="Pump3", subject_contains="TRIPPED", ends_at=now + timedelta(hours=1), reason="r"
    )
    Silence.objects.create(
        site="plant-a", starts_at=now + timedelta(hours=1), ends_at=now + timedelta(hours=2), reason="later"
    )
    Silence.objects.create(
        site="plant-a", starts_at=now - timedelta(hours=2), ends_at=now - timedelta(hours=1), reason="over"
    )
    assert send(api, source_instance_id="Pump3", subject="Pump 3 tripped")["status"] == "Suppressed"
    assert send(api, source_instance_id="Pump4", subject="Pump 3 tripped")["status"] == "Pending"
    assert send(api, source_instance_id="Pump3", subject="Pump 3 running")["status"] == "Pending"


BERLIN = ZoneInfo("Europe/Berlin")


def berlin(monday, days, hour, minute=0):
    """Berlin's wall clock ``days`` after ``monday`` at ``hour``:``minute``."""
    return datetime.combine(monday + timedelta(days=days), dt_time(hour, minute), tzinfo=BERLIN)


@pytest.mark.parametrize(
    "mondays",
    [
        # Daylight saving time ends on Sunday 2026-10-25: the Mondays before and after.
        (date(2026, 10, 19), date(2026, 10, 26)),
        # It starts on Sunday 2026-03-29.
        (date(2026, 3, 23), date(2026, 3, 30)),
    ],
    ids=["autumn", "spring"],
)
def test_a_weekday_night_window_in_berlin_covers_the_same_local_hours_either_side_of_a_dst_change(db, mondays):
    window = MaintenanceWindow(
        site="plant-a", days=[0, 1, 2, 3, 4], starts=dt_time(22, 0), ends=dt_time(6, 0), time_zone="Europe/Berlin"
    )
    for monday in mondays:
        covered = [
            berlin(monday, 0, 22, 0),  # Monday 22:00
            berlin(monday, 1, 5, 59),  # Tuesday 05:59 (Monday's night)
            berlin(monday, 4, 23, 30),  # Friday 23:30
            berlin(monday, 5, 3, 0),  # Saturday 03:00 (Friday's night)
        ]
        outside = [
            berlin(monday, 0, 21, 59),  # Monday 21:59
            berlin(monday, 1, 6, 0),  # Tuesday 06:00
            berlin(monday, 0, 3, 0),  # Monday 03:00 (Sunday's night: no window)
            berlin(monday, 5, 22, 30),  # Saturday 22:30
        ]
        for moment in covered:
            assert maintenance_window_covers(window, moment.astimezone(UTC)), moment
        for moment in outside:
            assert not maintenance_window_covers(window, moment.astimezone(UTC)), moment
    # The same local hour is another UTC hour after the change: the window follows the wall clock.
    before, after = berlin(mondays[0], 0, 22, 30), berlin(mondays[1], 0, 22, 30)
    assert before.astimezone(UTC).hour != after.astimezone(UTC).hour


def test_a_maintenance_window_of_a_site_suppresses_at_ingest(api, plant_b_api, smtp_config):
    everyday = MaintenanceWindow.objects.create(
        site="plant-a", days=list(range(7)), starts=dt_time(0, 0), ends=dt_time(0, 0), time_zone="UTC"
    )
    record = send(api)
    assert record["status"] == "Suppressed"
    assert record["suppressed_by"] == f"silence:mw{everyday.pk}"
    assert send(api, priority="critical")["status"] == "Pending"
    assert send(plant_b_api)["status"] == "Pending"


# --- flood digests ----------------------------------------------------------------------------


def end_window_now():
    """Time compressed: the held rows' window ends now (as if its 10 minutes had passed)."""
    now = database_now()
    Notification.objects.filter(held_for_digest__isnull=False).update(held_for_digest=now)
    FloodWindow.objects.update(ends_at=now)


def test_a_flood_of_500_goes_out_as_at_most_10_singles_and_one_digest_per_window(api, smtp_server, smtp_config):
    list_settings(flood_threshold=10, flood_window_seconds=600)
    payloads = [make_payload(source_instance_id=f"Valve{i % 7}", subject=f"Valve {i % 7} open") for i in range(500)]
    send_batch(api, payloads)
    drain()
    assert smtp_server.count == 10
    held = Notification.objects.filter(status=Status.PENDING, held_for_digest__isnull=False)
    assert held.count() == 490
    due = held.get(pk=payloads[-1]["notification_id"]).held_for_digest
    # Held rows are waiting (queue depth) and never claimed.
    assert api.get(f"{URL}{payloads[-1]['notification_id']}/").json()["held_for_digest"] is not None
    # The worker's timer wakes at the window's end (nothing else is due).
    assert dispatch_wake_at() == due
    end_window_now()
    drain()  # the pass makes the digest at the window's end, then delivers it

    assert smtp_server.count == 11
    digest = Notification.objects.get(source_script="flood digest")
    assert digest.status == Status.DELIVERED
    assert "490 notifications" in digest.subject
    assert "Valve0" in digest.body and "By source:" in digest.body
    statuses = Counter(Notification.objects.values_list("status", flat=True))
    assert statuses == Counter({Status.DELIVERED: 11, Status.SUPPRESSED: 490})
    assert set(Notification.objects.filter(status=Status.SUPPRESSED).values_list("suppressed_by", flat=True)) == {
        f"digest:{digest.pk}"
    }


def test_critical_ones_go_out_singly_in_a_flood_and_the_digest_takes_the_highest_held_priority(
    api, smtp_server, smtp_config
):
    list_settings(flood_threshold=2, flood_window_seconds=600)
    send_batch(api, [make_payload() for _ in range(5)])
    high = send(api, priority="high")
    critical = send(api, priority="critical")
    assert high["held_for_digest"] is not None
    assert critical["held_for_digest"] is None
    drain()
    assert smtp_server.count == 3
    (digest_id,) = digests_flush(now=row(high).held_for_digest)
    digest = Notification.objects.get(pk=digest_id)
    assert digest.priority == Notification.Priority.HIGH
    assert row(high).suppressed_by == f"digest:{digest_id}"
    assert digests_flush(now=timezone.now() + timedelta(hours=1)) == []  # nothing held any more


def test_releasing_a_held_row_delivers_it_singly_and_the_digest_goes_without_it(
    api, operator_api, smtp_server, smtp_config
):
    list_settings(flood_threshold=1, flood_window_seconds=600)
    send(api)
    held = [send(api) for _ in range(3)]
    response = operator_api.post(f"{URL}{held[0]['notification_id']}/release/")
    assert response.status_code == 200, response.content
    drain()
    assert smtp_server.count == 2
    (digest_id,) = digests_flush(now=timezone.now() + timedelta(hours=1))
    assert Notification.objects.filter(suppressed_by=f"digest:{digest_id}").count() == 2


# --- Deliver anyway -----------------------------------------------------------------------------


def test_deliver_anyway_sends_a_suppressed_row_singly_and_is_in_its_history(
    api, operator_api, smtp_server, smtp_config
):
    list_settings(dedup_window_seconds=3600)
    send(api, dedup_key="k")
    duplicate = send(api, dedup_key="k")
    drain()
    response = operator_api.post(f"{URL}{duplicate['notification_id']}/release/")
    assert response.status_code == 200
    assert response.json()["action"] == "release"
    assert response.json()["notification"]["status"] == "Pending"
    drain()
    released = row(duplicate)
    assert released.status == Status.DELIVERED
    assert released.suppressed_by.startswith("duplicate:")  # why it had been held back stays
    assert smtp_server.count == 2
    entry = LogEntry.objects.get(object_id=str(released.pk))
    assert "Delivered anyway" in entry.change_message
    # Not suppressed any more: a second release does not apply.
    again = operator_api.post(f"{URL}{duplicate['notification_id']}/release/")
    assert again.status_code == 409


def test_deliver_anyway_needs_the_retry_permission(api, smtp_config):
    Silence.objects.create(site="plant-a", ends_at=timezone.now() + timedelta(hours=1), reason="r")
    record = send(api)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("vera")))  # staff, no permission
    assert client.post(f"{URL}{record['notification_id']}/release/").status_code == 403
    assert row(record).status == Status.SUPPRESSED


# --- no row is lost -------------------------------------------------------------------------------


def test_a_mixed_flood_reconciles_every_row_with_the_emails_received(
    api, plant_b_api, operator_api, smtp_server, smtp_config
):
    list_settings(dedup_window_seconds=3600, flood_threshold=20, flood_window_seconds=1)
    silence = Silence.objects.create(
        site="plant-a", source_instance_id="Silenced", ends_at=timezone.now() + timedelta(hours=1), reason="r"
    )
    sent = []
    kinds = ["dup", "silenced", "plain", "critical"]
    for i in range(400):
        kind = kinds[i % 4]
        fields = {
            "dup": {"dedup_key": f"chatter-{i % 3}"},
            "silenced": {"source_instance_id": "Silenced"},
            "plain": {"source_instance_id": f"Src{i % 5}"},
            "critical": {"priority": "critical", "source_instance_id": "Crit"},
        }[kind]
        sent.append(make_payload(**fields))
    send_batch(api, sent[:200])
    for payload in sent[200:300]:
        assert post(api, payload).status_code == 201
    send_batch(plant_b_api, [make_payload() for _ in range(50)])
    send_batch(api, sent[300:])
    drain()
    end_window_now()
    drain()
    # One silenced row is delivered anyway.
    released = Notification.objects.filter(suppressed_by=f"silence:{silence.pk}")[0]
    assert operator_api.post(f"{URL}{released.pk}/release/").status_code == 200
    drain()

    rows = list(Notification.objects.all())
    digests = [r for r in rows if r.source_script == "flood digest"]
    assert len(rows) == 450 + len(digests)
    statuses = Counter(r.status for r in rows)
    assert set(statuses) <= {Status.DELIVERED, Status.SUPPRESSED}, statuses
    delivered = {str(r.pk) for r in rows if r.status == Status.DELIVERED}
    # Every delivered row arrived exactly once, and nothing else arrived.
    assert smtp_server.count_by_notification_id() == Counter(dict.fromkeys(delivered, 1))
    by_id = {str(r.pk): r for r in rows}
    for r in rows:
        if r.status != Status.SUPPRESSED:
            continue
        kind, _, ref = r.suppressed_by.partition(":")
        if kind == "silence":
            assert ref == str(silence.pk)
            continue
        # A duplicate leads to the row it repeats, a held row to its digest; followed to the
        # end, the chain reaches a delivered row (an anchor may itself be in a digest).
        assert kind in ("duplicate", "digest")
        target = by_id[ref]
        while target.status == Status.SUPPRESSED:
            target = by_id[target.suppressed_by.partition(":")[2]]
        assert target.status == Status.DELIVERED
    assert statuses[Status.DELIVERED] + statuses[Status.SUPPRESSED] == 450 + len(digests)
    anchors = [r for r in rows if r.dedup_key and not r.suppressed_by.startswith("duplicate:")]
    assert sum(r.occurrences for r in anchors) == sum(1 for r in rows if r.dedup_key)  # each counted once
    assert by_id[str(released.pk)].status == Status.DELIVERED


def test_a_batch_with_replays_counts_each_new_duplicate_once(api, smtp_config):
    list_settings(dedup_window_seconds=3600)
    first = make_payload(dedup_key="k")
    assert post(api, first).status_code == 201
    again = make_payload(dedup_key="k")
    response = post(api, {"notifications": [first, again, again, make_payload(dedup_key="k")]}, BATCH_URL)
    results = [item["result"] for item in response.json()["results"]]
    assert results == ["replayed", "created", "replayed", "created"]
    anchor = row({"notification_id": first["notification_id"]})
    assert anchor.occurrences == 3  # itself and the two new ones, not the replays
    assert Notification.objects.filter(suppressed_by=f"duplicate:{anchor.pk}").count() == 2


def test_a_batch_whose_key_changes_anchor_midway_counts_both_anchors(api, smtp_config):
    list_settings(dedup_window_seconds=3600)
    first = send(api, dedup_key="k")
    batch = [
        make_payload(dedup_key="k"),  # a duplicate of the first
        make_payload(dedup_key="k", priority="critical"),  # breaks through: the new anchor
        make_payload(dedup_key="k", priority="critical"),  # a duplicate of the critical one
        make_payload(dedup_key="k"),  # and so is this one (not higher than critical)
    ]
    send_batch(api, batch)
    critical = row({"notification_id": batch[1]["notification_id"]})
    assert critical.status == Status.PENDING
    assert row(first).occurrences == 2
    assert critical.occurrences == 3


def test_releasing_a_row_a_digest_carried_delivers_it_singly_and_the_digest_keeps_its_record(
    api, operator_api, smtp_server, smtp_config
):
    list_settings(flood_threshold=1, flood_window_seconds=600)
    send(api)
    held = [send(api) for _ in range(2)]
    drain()
    end_window_now()
    drain()
    digest = Notification.objects.get(source_script="flood digest")
    body_before = digest.body
    assert operator_api.post(f"{URL}{held[0]['notification_id']}/release/").status_code == 200
    drain()
    released = row(held[0])
    assert released.status == Status.DELIVERED
    assert released.suppressed_by == f"digest:{digest.pk}"  # the audit of why it had been held back
    digest.refresh_from_db()
    assert (digest.status, digest.body) == (Status.DELIVERED, body_before)
    assert smtp_server.count == 3  # the first single, the digest, the released one
