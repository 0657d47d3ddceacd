"""The console's traps, each reproduced as the operator met it: the "list exists now" prompt
for rows the real dispatcher parked, the delivery policy page, write-only targets after a
validation error, pasted addresses, the CSV export, Japanese list names, partial deliveries,
the test-notification form."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from notifications.models import Notification, NotificationList
from tests.admin.conftest import make_user
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass
from tests.support.smtp import SmtpServer

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")
PARKED = reverse("admin:notifications_notification_parked")
PARKED_RETRY = reverse("admin:notifications_notification_parked_retry")


@pytest.fixture
def smtp_server():
    with SmtpServer() as server:
        yield server


@pytest.fixture
def smtp_config(db, smtp_server):
    return configure_smtp(smtp_server)


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_rows_the_dispatcher_parked_for_an_unknown_list_are_offered_for_retry_once_it_exists(client, smtp_config):
    # The dispatcher's own words ("Permanent failure (configuration): Unknown notification
    # list …"), not a fixture's: the prompt is keyed on the row's failure code.
    rows = queue(2, list_name="Night-Shift")
    run_pass()
    parked = [fresh(row) for row in rows]
    assert {row.status for row in parked} == {Status.PARKED}
    assert {row.failure_code for row in parked} == {"unknown_list"}
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert 'id="outbox-lists-ready"' not in client.get(OUTBOX).content.decode()

    NotificationList.objects.create(name="Night-Shift")
    content = client.get(OUTBOX).content.decode()
    assert "2 parked notifications failed because the list “Night-Shift” did not exist; it exists now." in content
    assert "Retry 2</button>" in content
    assert "exists now" in client.get(PARKED).content.decode()
    response = client.post(PARKED_RETRY, {"cause": parked[0].last_error})
    assert "Retried 2 notifications." in texts(response)
    assert {fresh(row).status for row in rows} == {Status.PENDING}


def test_a_delivered_row_loses_its_failure_code(smtp_server, smtp_config, operators_list):
    (row,) = queue(list_name="Late-List")
    run_pass()
    assert fresh(row).failure_code == "unknown_list"
    NotificationList.objects.filter(pk=operators_list.pk).update(name="Late-List")
    Notification.objects.filter(pk=row.pk).update(status=Status.PENDING, next_attempt_at=None)
    run_pass()
    row = fresh(row)
    assert row.status == Status.DELIVERED and row.failure_code == ""
