"""Notifications a site delivered itself through its agent's local fallback relay
(``delivered_locally_at``): central records it, shows it, and does not send them again unless
their list sets ``resend_after_local_delivery`` — against the real API, a real dispatch pass and
a real SMTP server on loopback."""

import json

import pytest

from notifications.config_file import ConfigFileError, configuration_export, configuration_import
from notifications.dispatch.claim import notifications_claim_due
from notifications.local_delivery import notifications_settle_delivered_locally
from notifications.models import DeliveryAttempt, Notification, NotificationList
from notifications.operations import notification_act
from tests.admin.test_list_tools import list_form
from tests.dispatch.conftest import fresh, run_pass
from tests.support.payloads import make_payload

Status = Notification.Status
URL = "/api/v1/notifications/"
BATCH_URL = "/api/v1/notifications/batch/"
LOCALLY = "2026-11-21T10:05:00Z"
pytestmark = pytest.mark.usefixtures("operators_list")


def post(api, data, url=URL):
    return api.post(url, json.dumps(data), content_type="application/json")


def test_a_notification_the_site_delivered_itself_is_recorded_and_not_sent_again_by_central(
    api, smtp_server, smtp_config
):
    payload = make_payload(priority="critical")
    created = post(api, {**payload, "delivered_locally_at": LOCALLY})
    assert created.status_code == 201
    assert created.json()["delivered_locally_at"] == LOCALLY

    report = run_pass()

    assert report.delivered == 1
    assert smtp_server.count == 0  # the plant had it from its own relay: no second email
    row = Notification.objects.get(pk=payload["notification_id"])
    assert row.status == Status.DELIVERED and row.delivered_at is not None
    assert not DeliveryAttempt.objects.filter(notification=row).exists()  # nothing was attempted
    (note,) = row.resolved_targets
    assert (note["channel"], note["target"], note["outcome"]) == ("site", "local relay of site plant-a", "delivered")
    assert "does not set resend_after_local_delivery" in note["note"]
    record = api.get(f"{URL}{row.pk}/").json()
    assert (record["status"], record["delivered_locally_at"]) == ("Delivered", LOCALLY)
    assert record["targets"] == [
        {"channel": "site", "target": "local relay of site plant-a", "outcome": "delivered", "provider_status": None}
    ]
    assert record["delivery_summary"] == "delivered to 1 of 1"


def test_a_list_that_sets_resend_after_local_delivery_gets_centrals_copy_too(
    api, operators_list, smtp_server, smtp_config
):
    operators_list.resend_after_local_delivery = True
    operators_list.save()
    payload = make_payload(delivered_locally_at=LOCALLY)
    assert post(api, payload).status_code == 201

    run_pass()

    row = Notification.objects.get(pk=payload["notification_id"])
    assert row.status == Status.DELIVERED
    assert smtp_server.count_by_notification_id() == {payload["notification_id"]: 1}
    assert [target["target"] for target in row.resolved_targets] == ["op1@example.com", "op2@example.com"]
    assert row.delivered_locally_at is not None  # still on record


def test_a_replay_adds_delivered_locally_at_once_to_a_waiting_row_and_later_replays_change_nothing(
    api, smtp_server, smtp_config
):
    payload = make_payload(priority="critical")
    assert post(api, payload).status_code == 201  # central took it, the answer was lost

    added = post(api, {**payload, "delivered_locally_at": LOCALLY})
    again = post(api, {**payload, "delivered_locally_at": "2026-11-21T11:00:00Z"})
    without = post(api, payload)

    assert (added.status_code, again.status_code, without.status_code) == (200, 200, 200)
    assert added.json()["delivered_locally_at"] == again.json()["delivered_locally_at"] == LOCALLY
    assert without.json()["delivered_locally_at"] == LOCALLY
    run_pass()
    assert fresh(Notification.objects.get(pk=payload["notification_id"])).status == Status.DELIVERED
    assert smtp_server.count == 0


def test_a_replay_saying_delivered_locally_leaves_a_row_central_has_delivered_as_it_is(api, smtp_server, smtp_config):
    payload = make_payload()
    post(api, payload)
    run_pass()
    delivered = Notification.objects.get(pk=payload["notification_id"])

    response = post(api, {**payload, "delivered_locally_at": LOCALLY})

    assert response.status_code == 200
    assert response.json()["delivered_locally_at"] is None
    row = fresh(delivered)
    assert (row.delivered_locally_at, row.resolved_targets) == (None, delivered.resolved_targets)


def test_a_batch_records_delivered_locally_at_for_new_rows_and_adds_it_on_replays(api, smtp_server, smtp_config):
    known = make_payload()
    post(api, known)
    new = make_payload(delivered_locally_at=LOCALLY)

    response = post(api, {"notifications": [{**known, "delivered_locally_at": LOCALLY}, new]}, url=BATCH_URL)

    results = response.json()["results"]
    assert [result["result"] for result in results] == ["replayed", "created"]
    assert [result["status"]["delivered_locally_at"] for result in results] == [LOCALLY, LOCALLY]
    run_pass()
    assert smtp_server.count == 0
    assert Notification.objects.filter(status=Status.DELIVERED, delivered_locally_at__isnull=False).count() == 2


def test_a_row_being_delivered_when_the_replay_arrives_keeps_its_delivery_and_records_the_field(
    api, smtp_server, smtp_config
):
    payload = make_payload()
    post(api, payload)
    claim = notifications_claim_due(worker_id="worker-a", limit=10)  # worker A is about to send it

    assert post(api, {**payload, "delivered_locally_at": LOCALLY}).status_code == 200

    row = Notification.objects.get(pk=payload["notification_id"])
    assert (row.status, row.claimed_by, row.delivered_locally_at is not None) == (Status.PENDING, "worker-a", True)
    # Worker A goes on with the row as it claimed it: central's copy goes out too.
    assert notifications_settle_delivered_locally(worker_id="worker-a", rows=claim.rows, now=row.created_at) == []


def test_a_parked_row_keeps_its_state_with_the_field_and_an_operators_retry_settles_it_without_a_send(
    api, admin_user, smtp_server, smtp_config
):
    payload = make_payload(list_name="Nobody")  # unknown list: parked at once
    post(api, payload)
    run_pass()
    row = Notification.objects.get(pk=payload["notification_id"])
    assert row.status == Status.PARKED

    assert post(api, {**payload, "delivered_locally_at": LOCALLY}).status_code == 200
    assert fresh(row).status == Status.PARKED and row.delivered_locally_at is not None

    notification_act(notification_id=row.pk, action="retry", user=admin_user, reason="")
    run_pass()
    assert fresh(row).status == Status.DELIVERED
    assert smtp_server.count == 0


@pytest.mark.parametrize(
    "value, problem",
    [
        ("yesterday", "Is not an ISO-8601 timestamp, e.g. 2026-11-21T10:00:00Z."),
        ("2026-11-21T10:05:00", "Must include a timezone (e.g. a trailing Z for UTC)."),
        (1700000000, "Must be an ISO-8601 timestamp string."),
    ],
)
def test_a_bad_delivered_locally_at_is_refused_with_400_naming_the_field(api, value, problem):
    response = post(api, make_payload(delivered_locally_at=value))
    assert response.status_code == 400
    assert response.json()["errors"] == {"delivered_locally_at": [problem]}
    assert not Notification.objects.exists()


def test_another_site_cannot_mark_a_row_delivered_locally(api, other_site_key, smtp_server, smtp_config):
    payload = make_payload()
    post(api, payload)
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")

    assert post(api, {**payload, "delivered_locally_at": LOCALLY}).status_code == 422
    assert Notification.objects.get(pk=payload["notification_id"]).delivered_locally_at is None


def test_the_console_badges_a_row_delivered_locally_at_the_site_on_the_list_and_its_page(
    api, admin_client, smtp_server, smtp_config
):
    payload = make_payload(subject="Gas detector 4 high", delivered_locally_at=LOCALLY)
    post(api, payload)
    plain = make_payload(subject="Pump 3 tripped")
    post(api, plain)

    listing = admin_client.get("/admin/notifications/notification/").content.decode()
    page = admin_client.get(f"/admin/notifications/notification/{payload['notification_id']}/change/").content.decode()
    other = admin_client.get(f"/admin/notifications/notification/{plain['notification_id']}/change/").content.decode()

    assert listing.count("delivered locally at the site</span>") == 1
    assert "delivered locally at the site</span>" in page and "2026-11-21 10:05:00" in page
    assert "delivered locally at the site</span>" not in other


# --- the list setting --------------------------------------------------------------------------


def test_the_configuration_file_sets_resend_after_local_delivery_per_list_and_exports_it(db):
    configuration_import(data={"lists": [{"name": "Control room", "resend_after_local_delivery": True}]})
    assert NotificationList.objects.get(name="Control room").resend_after_local_delivery is True
    exported = {entry["name"]: entry for entry in configuration_export()["lists"]}
    assert exported["Control room"]["resend_after_local_delivery"] is True
    assert exported["Operators"]["resend_after_local_delivery"] is False

    configuration_import(data={"lists": [{"name": "Control room"}]})  # left out: kept
    assert NotificationList.objects.get(name="Control room").resend_after_local_delivery is True


def test_a_configuration_file_with_a_resend_setting_that_is_not_true_or_false_is_refused_naming_it(db):
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data={"lists": [{"name": "Control room", "resend_after_local_delivery": "yes"}]})
    assert refused.value.problems == ["lists[0] ('Control room').resend_after_local_delivery: must be true or false."]
    assert not NotificationList.objects.filter(name="Control room").exists()


def test_an_administrator_sets_resend_after_local_delivery_on_the_lists_page(admin_client, operators_list):
    url = f"/admin/notifications/notificationlist/{operators_list.pk}/change/"
    assert 'name="resend_after_local_delivery"' in admin_client.get(url).content.decode()

    response = admin_client.post(url, list_form(operators_list, resend_after_local_delivery="on"))

    assert response.status_code == 302
    operators_list.refresh_from_db()
    assert operators_list.resend_after_local_delivery is True
    assert operators_list.email_recipients.count() == 2  # the rest of the list as it was
