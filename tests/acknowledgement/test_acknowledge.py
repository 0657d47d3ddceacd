"""Acknowledging and clearing a notification (notifications.acknowledgement) and the API's
POST /api/v1/notifications/{id}/ack/ and /clear/: at most once, a child counts for its parent,
a site reaches only its own notifications and sees who acknowledged masked, the decision to ask
for acknowledgement is taken at ingest from the list."""

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone
from rest_framework.test import APIClient

from notifications import acknowledgement
from notifications.ack_kpis import unacknowledged_q
from notifications.models import Notification, NotificationList
from tests.admin.conftest import make_notification, make_user
from tests.support.payloads import make_payload
from tests.support.staff import staff_key_header


def reload(row):
    return Notification.objects.get(pk=row.pk)


def ack_url(row, action="ack"):
    return f"/api/v1/notifications/{row.pk}/{action}/"


@pytest.fixture
def parent_and_children(db):
    parent = make_notification(asks_ack=True, priority=Notification.Priority.HIGH)
    due = timezone.now() + timedelta(minutes=5)
    Notification.objects.filter(pk=parent.pk).update(escalation_due_at=due)
    children = [
        make_notification(
            asks_ack=True, escalation_of=parent.pk, escalation_step=step, type="sms", list_name="Shift-Leads"
        )
        for step in (1, 2)
    ]
    return reload(parent), children


# --- the functions ------------------------------------------------------------------------------


def test_the_first_acknowledgement_stands_and_a_second_one_says_who_already_did(db):
    row = make_notification(asks_ack=True)
    first = acknowledgement.acknowledge(row.pk, via="link", by="Jane Doe", note="on my way")
    second = acknowledgement.acknowledge(row.pk, via="sms", by="+4915112345678")
    assert first.changed and not second.changed
    stored = reload(row)
    assert (stored.acknowledged_by, stored.acknowledged_via, stored.acknowledged_note) == (
        "Jane Doe",
        "link",
        "on my way",
    )
    assert second.notification is not None
    assert second.notification.acknowledged_by == "Jane Doe"
    assert second.notification.acknowledged_at == stored.acknowledged_at


def test_acknowledging_a_child_acknowledges_the_parent_and_stops_its_escalation(parent_and_children):
    parent, (step1, step2) = parent_and_children
    outcome = acknowledgement.acknowledge(step1.pk, via="sms", by="+4915112345678")
    assert outcome.changed
    parent = reload(parent)
    assert parent.acknowledged_via == "sms" and parent.acknowledged_at is not None
    assert parent.escalation_due_at is None
    # The whole family counts as seen: the other step is no longer "unacknowledged".
    assert reload(step2).acknowledged_at == parent.acknowledged_at
    again = acknowledgement.acknowledge(parent.pk, via="console", by="olivia")
    assert again.notification is not None
    assert not again.changed and again.notification.acknowledged_via == "sms"


def test_clearing_a_child_clears_the_parent_stops_escalation_and_is_not_an_acknowledgement(parent_and_children):
    parent, (step1, _) = parent_and_children
    assert acknowledgement.clear(step1.pk, note="level back to normal").changed
    parent = reload(parent)
    assert parent.cleared_at is not None and parent.cleared_note == "level back to normal"
    assert parent.escalation_due_at is None
    assert parent.acknowledged_at is None
    assert not acknowledgement.clear(parent.pk).changed
    assert Notification.objects.filter(unacknowledged_q()).count() == 0


def test_a_site_cannot_acknowledge_another_sites_notification(db):
    row = make_notification(asks_ack=True, source_site_id="plant-b")
    outcome = acknowledgement.acknowledge(row.pk, via="site", by="HMI 3", site_id="plant-a")
    assert outcome.notification is None
    assert reload(row).acknowledged_at is None


def test_an_unknown_route_or_nobody_is_refused(db):
    row = make_notification(asks_ack=True)
    with pytest.raises(ValueError):
        acknowledgement.acknowledge(row.pk, via="carrier-pigeon", by="x")
    with pytest.raises(ValueError):
        acknowledgement.acknowledge(row.pk, via="link", by="  ")
    assert reload(row).acknowledged_at is None


def test_a_console_acknowledgement_is_in_the_admin_history(db):
    user = make_user("olivia", groups=["Operators"])
    row = make_notification(asks_ack=True)
    acknowledgement.acknowledge(row.pk, via="console", by="olivia", note="seen", user=user)
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert "Acknowledged via console by olivia: seen" in entry.change_message


@pytest.mark.parametrize(
    ("by", "via", "shown"),
    [
        ("jane.doe@example.com", "link", "j***@example.com"),
        ("+4915112345678", "sms", "+49***678"),
        ("Jane Doe", "link", "J***"),
        ("HMI operator 3", "site", "HMI operator 3"),
    ],
)
def test_who_acknowledged_is_masked_for_sites_like_targets(by, via, shown):
    masked = acknowledgement.acknowledged_by_site_masked(acknowledged_by=by, acknowledged_via=via)
    assert masked == shown


# --- asking for acknowledgement at ingest ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ack_required_from", "priority", "asks"),
    [
        ("high", "normal", False),
        ("high", "high", True),
        ("high", "critical", True),
        ("critical", "high", False),
        ("low", "low", True),
        ("none", "critical", False),
    ],
)
def test_ingest_asks_for_acknowledgement_from_the_lists_setting(api, ack_required_from, priority, asks):
    NotificationList.objects.create(name="Operators", ack_required_from=ack_required_from)
    response = api.post("/api/v1/notifications/", make_payload(priority=priority), format="json")
    assert response.status_code == 201
    assert response.json()["asks_ack"] is asks
    assert Notification.objects.get().asks_ack is asks


def test_a_list_not_configured_asks_from_high_the_default(api):
    response = api.post("/api/v1/notifications/", make_payload(list_name="Nobody", priority="high"), format="json")
    assert response.json()["asks_ack"] is True


# --- the API ---------------------------------------------------------------------------------------


def test_a_site_acknowledges_its_own_notification_by_its_hmi(api):
    row = make_notification(asks_ack=True)
    response = api.post(ack_url(row), {"by": "HMI panel 2", "note": "silenced"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["changed"] is True
    record = body["notification"]
    assert record["acknowledged_via"] == "site"
    assert record["acknowledged_by"] == "HMI panel 2"
    assert record["acknowledged_note"] == "silenced"
    assert record["acknowledged_at"] is not None
    status = api.get(f"/api/v1/notifications/{row.pk}/").json()
    assert status["acknowledged_via"] == "site"


def test_a_site_without_by_acknowledges_under_its_name(api):
    row = make_notification(asks_ack=True)
    assert api.post(ack_url(row), format="json").json()["notification"]["acknowledged_by"] == "Plant A"


def test_another_sites_notification_is_404_to_ack_and_clear(api):
    row = make_notification(asks_ack=True, source_site_id="plant-b")
    assert api.post(ack_url(row), format="json").status_code == 404
    assert api.post(ack_url(row, "clear"), format="json").status_code == 404
    stored = reload(row)
    assert stored.acknowledged_at is None and stored.cleared_at is None
    assert api.post(f"/api/v1/notifications/{uuid.uuid4()}/ack/", format="json").status_code == 404


def test_a_site_sees_a_person_who_acknowledged_masked_staff_see_them_as_stored(api, db):
    row = make_notification(asks_ack=True)
    acknowledgement.acknowledge(row.pk, via="link", by="jane.doe@example.com", note="call me on +4915112345678")
    record = api.get(f"/api/v1/notifications/{row.pk}/").json()
    assert record["acknowledged_by"] == "j***@example.com"
    assert record["acknowledged_note"] == "call me on +49***678"
    staff = APIClient()
    staff.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("olivia", groups=["Operators"])))
    assert staff.get(f"/api/v1/notifications/{row.pk}/").json()["acknowledged_by"] == "jane.doe@example.com"


def test_a_second_acknowledgement_by_api_answers_200_unchanged_with_the_first(api):
    row = make_notification(asks_ack=True)
    api.post(ack_url(row), {"by": "HMI 1"}, format="json")
    again = api.post(ack_url(row), {"by": "HMI 2"}, format="json").json()
    assert again["changed"] is False
    assert again["notification"]["acknowledged_by"] == "HMI 1"


def test_staff_acknowledge_by_the_api_as_themselves_but_cannot_clear(db):
    user = make_user("olivia", groups=["Operators"])
    staff = APIClient()
    staff.credentials(HTTP_AUTHORIZATION=staff_key_header(user))
    row = make_notification(asks_ack=True)
    response = staff.post(ack_url(row), {"note": "called the plant"}, format="json")
    assert response.status_code == 200
    record = response.json()["notification"]
    assert (record["acknowledged_via"], record["acknowledged_by"]) == ("api", "olivia")
    assert staff.post(ack_url(row, "clear"), format="json").status_code == 403
    assert staff.post(ack_url(row), {"by": "someone else"}, format="json").status_code == 400


def test_a_site_clears_its_notification(api):
    row = make_notification(asks_ack=True)
    response = api.post(ack_url(row, "clear"), {"note": "pressure normal"}, format="json")
    assert response.status_code == 200
    record = response.json()["notification"]
    assert record["cleared_note"] == "pressure normal" and record["cleared_at"] is not None
    assert record["acknowledged_at"] is None


@pytest.mark.parametrize(
    "body", [{"note": 5}, {"note": "x" * 2001}, {"by": "y" * 201}, {"colour": "red"}, ["not", "an", "object"]]
)
def test_bad_bodies_are_400_with_field_errors_and_change_nothing(api, body):
    row = make_notification(asks_ack=True)
    response = api.post(ack_url(row), body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]
    assert reload(row).acknowledged_at is None


def test_anonymous_callers_get_401(db):
    row = make_notification(asks_ack=True)
    assert APIClient().post(ack_url(row), format="json").status_code == 401


# --- figures ----------------------------------------------------------------------------------------


def test_the_kpis_count_the_unacknowledged_and_the_time_to_acknowledge_per_list_and_site(db):
    from notifications.kpis import kpis_compute

    now = timezone.now()
    waiting = make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL)
    make_notification(asks_ack=False, priority=Notification.Priority.CRITICAL)  # does not ask
    make_notification(asks_ack=True, priority=Notification.Priority.HIGH, cleared_at=now)  # cleared
    for minutes, site_id in ((2, "plant-a"), (4, "plant-a"), (10, "plant-b")):
        make_notification(
            asks_ack=True,
            priority=Notification.Priority.HIGH,
            source_site_id=site_id,
            created_at=now - timedelta(minutes=minutes),
            acknowledged_at=now,
            acknowledged_by="x",
            acknowledged_via="link",
        )
    kpis = kpis_compute()
    overall = kpis["global"]
    assert overall["unacknowledged"] == 1
    assert overall["unacknowledged_by_priority"] == {"critical": 1, "high": 0, "normal": 0, "low": 0}
    assert kpis["per_site"][waiting.source_site_id]["unacknowledged"] == 1
    per_site = overall["time_to_ack"]["per_site"]
    assert per_site["plant-a"]["acknowledged"] == 2
    assert 170 <= per_site["plant-a"]["median_seconds"] <= 190
    assert per_site["plant-b"]["p90_seconds"] >= 590
    assert overall["time_to_ack"]["per_list"]["Operators"]["acknowledged"] == 3
    assert kpis["per_site"]["plant-b"]["time_to_ack"]["acknowledged"] == 1


def test_the_metrics_export_the_unacknowledged_gauge_and_the_time_to_ack_histogram(
    db, client, settings, django_capture_on_commit_callbacks
):
    from notifications.metrics import kpi_cache

    settings.OUTBOX_METRICS_CACHE_SECONDS = 0
    kpi_cache.clear()

    def acknowledged_count(text):
        found = re.search(r"^outbox_time_to_ack_seconds_count (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    make_notification(asks_ack=True, priority=Notification.Priority.CRITICAL)
    row = make_notification(asks_ack=True, priority=Notification.Priority.HIGH)
    before = acknowledged_count(client.get("/metrics").content.decode())
    with django_capture_on_commit_callbacks(execute=True):
        acknowledgement.acknowledge(row.pk, via="console", by="olivia")
    text = client.get("/metrics").content.decode()
    assert 'outbox_unacknowledged{priority="critical"} 1.0' in text
    assert 'outbox_unacknowledged{priority="high"} 0.0' in text
    assert acknowledged_count(text) == before + 1


# --- configuring a list -----------------------------------------------------------------------------


def test_the_configuration_file_sets_exports_and_checks_a_lists_ack_required_from(db):
    from notifications.config_file import ConfigFileError, configuration_export, configuration_import

    configuration_import(data={"lists": [{"name": "Operators", "ack_required_from": "critical"}]})
    assert NotificationList.objects.get(name="Operators").ack_required_from == "critical"
    (exported,) = configuration_export()["lists"]
    assert exported["ack_required_from"] == "critical"
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data={"lists": [{"name": "Operators", "ack_required_from": "sometimes"}]})
    assert any(".ack_required_from: 'sometimes' is not one of" in problem for problem in refused.value.problems)
    assert NotificationList.objects.get(name="Operators").ack_required_from == "critical"


def test_an_administrator_sets_ack_required_from_in_the_console(db):
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(make_user("adam", groups=["Administrators"]))
    notification_list = NotificationList.objects.create(name="Operators")
    url = reverse("admin:notifications_notificationlist_change", args=[notification_list.pk])
    page = client.get(url).content.decode()
    assert 'name="ack_required_from"' in page


def test_a_list_changed_in_this_process_applies_to_the_next_notification_at_once(api):
    notification_list = NotificationList.objects.create(name="Operators", ack_required_from="critical")
    first = api.post("/api/v1/notifications/", make_payload(priority="high"), format="json").json()
    notification_list.ack_required_from = "high"
    notification_list.save()
    second = api.post("/api/v1/notifications/", make_payload(priority="high"), format="json").json()
    assert (first["asks_ack"], second["asks_ack"]) == (False, True)


@pytest.mark.django_db(transaction=True)
def test_an_acknowledgement_chosen_as_a_deadlock_victim_is_run_again_and_succeeds(postgres_only):
    """A real deadlock: another transaction (a dispatcher finishing a batch) holds the step and
    then wants the parent, while the acknowledgement holds the parent and wants the step.
    PostgreSQL aborts the transaction that waited first — the acknowledgement's."""
    import threading
    import time

    from django.db import OperationalError, connection, transaction

    parent = make_notification(asks_ack=True)
    step = make_notification(asks_ack=True, escalation_of=parent.pk, escalation_step=1)
    step_held, go = threading.Event(), threading.Event()
    seen: dict[str, str] = {}

    def dispatcher_finish():
        try:
            with transaction.atomic():
                Notification.objects.filter(pk=step.pk).update(last_error="finishing")
                step_held.set()
                go.wait(10)
                time.sleep(0.3)  # the acknowledgement now holds the parent and waits for the step
                Notification.objects.filter(pk=parent.pk).update(last_error="finishing")
            seen["dispatcher"] = "committed"
        except OperationalError:
            seen["dispatcher"] = "deadlock victim"
        finally:
            connection.close()

    thread = threading.Thread(target=dispatcher_finish)
    thread.start()
    assert step_held.wait(10)
    go.set()
    outcome = acknowledgement.acknowledge(step.pk, via="sms", by="+4915112345678")
    thread.join(20)
    assert outcome.changed
    assert seen["dispatcher"] == "committed"  # the acknowledgement was the victim, and was run again
    stored = reload(parent)
    assert stored.acknowledged_via == "sms" and stored.last_error == "finishing"


def test_the_acknowledged_signal_is_sent_once_per_family_after_the_commit_with_the_parent(
    parent_and_children, django_capture_on_commit_callbacks
):
    parent, (step1, step2) = parent_and_children
    received = []

    def receiver(sender, notification, **kwargs):
        received.append(notification.pk)

    acknowledgement.notification_acknowledged.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            acknowledgement.acknowledge(step1.pk, via="sms", by="+4915112345678")
            assert received == []  # not before the commit
        assert len(callbacks) == 1 and received == [parent.pk]
        with django_capture_on_commit_callbacks(execute=True):
            acknowledgement.acknowledge(step2.pk, via="link", by="Jane")
        assert received == [parent.pk]
    finally:
        acknowledgement.notification_acknowledged.disconnect(receiver)
