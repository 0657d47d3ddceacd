"""The staff action endpoints: POST /api/v1/notifications/{id}/retry/, /discard/, /requeue/.

Staff with the action's permission, by token or console session (with CSRF) — never HTTP
Basic; retry is Retry on a Parked row and Retry now on a Retrying one; an action that does not
apply answers 409 with the current status; discard needs a non-blank reason; every change is in
the admin history; Retry, Retry now and Requeue ask for a dispatch at once."""

import base64
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from rest_framework.test import APIClient

from notifications import trigger
from notifications.models import Notification
from tests.admin.conftest import PASSWORD, make_notification, make_user
from tests.support.processes import poll
from tests.support.staff import staff_key_header

Status = Notification.Status


def url(notification, action):
    pk = notification if isinstance(notification, uuid.UUID) else notification.pk
    return f"/api/v1/notifications/{pk}/{action}/"


@pytest.fixture
def operator_api(db):
    user = make_user("olivia", groups=["Operators"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(user))
    return client


def status_of(notification):
    return Notification.objects.get(pk=notification.pk).status


# --- authentication and permissions -------------------------------------------------------------


def test_anonymous_callers_get_401_with_a_token_challenge(db):
    parked = make_notification(status=Status.PARKED)
    response = APIClient().post(url(parked, "retry"))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert status_of(parked) == Status.PARKED


def test_http_basic_is_not_accepted_for_staff_actions(db):
    make_user("olivia", groups=["Operators"])
    parked = make_notification(status=Status.PARKED)
    basic = "Basic " + base64.b64encode(f"olivia:{PASSWORD}".encode()).decode()
    assert APIClient().post(url(parked, "retry"), HTTP_AUTHORIZATION=basic).status_code == 401
    assert status_of(parked) == Status.PARKED


def test_a_site_key_is_not_a_staff_login(api):
    parked = make_notification(status=Status.PARKED)
    assert api.post(url(parked, "retry")).status_code == 401


def test_staff_without_the_actions_permission_get_403(db):
    viewer = make_user("victor", permissions=["view_notification", "retry_notification"])
    client = APIClient()
    client.force_authenticate(viewer)
    parked = make_notification(status=Status.PARKED)
    discarded = make_notification(status=Status.DISCARDED)
    assert client.post(url(parked, "discard"), {"reason": "x"}, format="json").status_code == 403
    assert client.post(url(discarded, "requeue")).status_code == 403
    assert (status_of(parked), status_of(discarded)) == (Status.PARKED, Status.DISCARDED)


def test_a_user_who_is_not_staff_gets_403(db, django_user_model):
    user = django_user_model.objects.create_user("clerk", password=PASSWORD, is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(user))
    # Staff when the key was issued, no longer now.
    user.is_staff = False
    user.save()
    assert client.post(url(make_notification(status=Status.PARKED), "retry")).status_code == 403


def test_a_console_session_works_but_needs_the_csrf_token(db):
    olivia = make_user("olivia", groups=["Operators"])
    parked = make_notification(status=Status.PARKED)
    client = Client(enforce_csrf_checks=True)
    client.force_login(olivia)
    json = "application/json"
    assert client.post(url(parked, "retry"), "{}", content_type=json).status_code == 403  # no CSRF token
    assert status_of(parked) == Status.PARKED
    client.get("/admin/")  # the console sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    assert client.post(url(parked, "retry"), "{}", content_type=json, HTTP_X_CSRFTOKEN=token).status_code == 200
    assert status_of(parked) == Status.PENDING


# --- retry ----------------------------------------------------------------------------------------


def test_retry_on_a_parked_row_is_retry(operator_api):
    parked = make_notification(status=Status.PARKED)
    response = operator_api.post(url(parked, "retry"))
    assert response.status_code == 200
    body = response.json()
    assert body["action"] == "retry"
    assert (body["notification"]["status"], body["notification"]["retry_count"]) == ("Pending", 0)
    assert body["notification"]["notification_id"] == str(parked.pk)


def test_retry_on_a_retrying_row_is_retry_now(operator_api):
    retrying = make_notification(status=Status.RETRYING, retry_count=2)
    Notification.objects.filter(pk=retrying.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    response = operator_api.post(url(retrying, "retry"))
    assert (response.status_code, response.json()["action"]) == (200, "retry_now")
    row = Notification.objects.get(pk=retrying.pk)
    assert (row.status, row.retry_count) == (Status.RETRYING, 2)
    assert row.next_attempt_at is not None and row.next_attempt_at <= timezone.now()


@pytest.mark.parametrize("status", [Status.PENDING, Status.DELIVERED, Status.DISCARDED])
def test_retry_that_does_not_apply_is_409_with_the_current_status(operator_api, status):
    row = make_notification(status=status)
    response = operator_api.post(url(row, "retry"))
    assert response.status_code == 409
    assert response.json()["error"] == "conflict" and response.json()["status"] == status
    assert f"this one is {status}" in response.json()["detail"]


def test_an_unknown_notification_is_404(operator_api):
    response = operator_api.post(url(uuid.uuid4(), "retry"))
    assert (response.status_code, response.json()["error"]) == (404, "not_found")


def test_a_body_with_fields_an_action_does_not_take_is_400(operator_api):
    parked = make_notification(status=Status.PARKED)
    response = operator_api.post(url(parked, "retry"), {"force": True}, format="json")
    assert response.status_code == 400 and response.json()["errors"] == {"force": ["Unknown field."]}
    assert status_of(parked) == Status.PARKED


# --- discard ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": 5}])
def test_discard_without_a_reason_is_400_and_changes_nothing(operator_api, body):
    parked = make_notification(status=Status.PARKED)
    response = operator_api.post(url(parked, "discard"), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and "reason" in response.json()["errors"]
    assert status_of(parked) == Status.PARKED


@pytest.mark.parametrize("status", [Status.PENDING, Status.RETRYING, Status.PARKED])
def test_discard_keeps_who_when_and_why(operator_api, status):
    row = make_notification(status=status)
    before = timezone.now()
    response = operator_api.post(url(row, "discard"), {"reason": "Pump replaced, alarm obsolete"}, format="json")
    assert (response.status_code, response.json()["action"]) == (200, "discard")
    row = Notification.objects.get(pk=row.pk)
    assert row.status == Status.DISCARDED
    assert (row.discarded_by, row.discard_reason) == ("olivia", "Pump replaced, alarm obsolete")
    assert row.discarded_at is not None and row.discarded_at >= before
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.user.username == "olivia"
    assert f"{status} → Discarded. Reason: Pump replaced, alarm obsolete" in entry.get_change_message()


def test_discard_of_a_delivered_row_is_409(operator_api):
    delivered = make_notification(status=Status.DELIVERED)
    response = operator_api.post(url(delivered, "discard"), {"reason": "x"}, format="json")
    assert (response.status_code, response.json()["status"]) == (409, "Delivered")


def test_a_row_being_delivered_is_not_discarded_under_the_workers_feet(operator_api):
    claimed = make_notification(status=Status.PENDING)
    Notification.objects.filter(pk=claimed.pk).update(
        claimed_by="dispatch:host:1", claimed_until=timezone.now() + timedelta(seconds=60)
    )
    response = operator_api.post(url(claimed, "discard"), {"reason": "x"}, format="json")
    assert response.status_code == 409
    assert response.json()["status"] == "Pending" and "being delivered" in response.json()["detail"]
    assert status_of(claimed) == Status.PENDING


# --- requeue and the trigger --------------------------------------------------------------------------


def test_requeue_makes_a_discarded_row_pending_again(operator_api):
    discarded = make_notification(status=Status.DISCARDED, discard_reason="mistake", discarded_by="olivia")
    response = operator_api.post(url(discarded, "requeue"))
    assert (response.status_code, response.json()["action"]) == (200, "requeue")
    row = Notification.objects.get(pk=discarded.pk)
    assert (row.status, row.retry_count, row.discard_reason, row.discarded_by) == (Status.PENDING, 0, "", "")
    assert operator_api.post(url(discarded, "requeue")).status_code == 409


def queued_dispatch_tasks():
    return [
        p
        for p in OrmQ.objects.filter(key=Conf.CLUSTER_NAME).values_list("payload", flat=True)
        if SignedPackage.loads(p)["func"] == trigger.DISPATCH_TASK
    ]


@pytest.mark.dispatch_trigger
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("status", "action"), [(Status.PARKED, "retry"), (Status.DISCARDED, "requeue")])
def test_retry_and_requeue_ask_for_a_dispatch_at_once(operator_api, status, action):
    row = make_notification(status=status)
    assert operator_api.post(url(row, action)).status_code == 200
    poll(lambda: len(queued_dispatch_tasks()) == 1, timeout=5, message="no dispatch task was queued")
