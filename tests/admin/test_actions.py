"""Retry and Discard: only Parked rows change, the message counts changed and skipped rows,
Discard asks first, and every change is in the admin history under the operator's name."""

import threading
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from notifications import admin as notifications_admin
from notifications.models import Notification
from notifications.operations import notification_discard, notification_retry
from tests.admin.conftest import make_notification

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def mixed(db):
    return {
        "parked": make_notification(status=Status.PARKED),
        "parked_too": make_notification(status=Status.PARKED),
        "pending": make_notification(status=Status.PENDING),
        "delivered": make_notification(status=Status.DELIVERED),
        "discarded": make_notification(status=Status.DISCARDED),
    }


def statuses(rows):
    return {name: Notification.objects.get(pk=n.pk).status for name, n in rows.items()}


def test_retry_on_a_mixed_selection_changes_only_parked_rows_and_says_so(operator_client, operator, mixed):
    before = timezone.now()
    response = operator_client.post(
        OUTBOX, {"action": "retry_selected", "_selected_action": [n.pk for n in mixed.values()], "index": "0"}, follow=True
    )
    assert "Retried 2 notifications; skipped 3 that were not Parked." in texts(response)
    assert statuses(mixed) == {"parked": "Pending", "parked_too": "Pending", "pending": "Pending",
                               "delivered": "Delivered", "discarded": "Discarded"}  # fmt: skip
    retried = Notification.objects.get(pk=mixed["parked"].pk)
    assert retried.retry_count == 0
    assert retried.next_attempt_at >= before
    assert retried.last_error  # the reason it was parked stays readable


def test_retry_of_nothing_parked_changes_nothing_and_warns(operator_client, mixed):
    response = operator_client.post(
        OUTBOX, {"action": "retry_selected", "_selected_action": [mixed["delivered"].pk], "index": "0"}, follow=True
    )
    assert "Retried 0 notifications; skipped 1 that was not Parked." in texts(response)
    assert statuses(mixed)["delivered"] == "Delivered"


def test_discard_asks_for_confirmation_before_changing_anything(operator_client, mixed):
    selection = [n.pk for n in mixed.values()]
    page = operator_client.post(OUTBOX, {"action": "discard_selected", "_selected_action": selection, "index": "0"})
    assert page.status_code == 200
    assert b"Discard 2 parked notifications?" in page.content
    assert b"3 selected notifications are not Parked and will be skipped." in page.content
    assert statuses(mixed)["parked"] == "Parked"


def test_confirmed_discard_on_a_mixed_selection_discards_only_parked_rows_and_keeps_them(operator_client, mixed):
    selection = [n.pk for n in mixed.values()]
    response = operator_client.post(
        OUTBOX, {"action": "discard_selected", "_selected_action": selection, "post": "yes"}, follow=True
    )
    assert "Discarded 2 notifications; skipped 3 that were not Parked." in texts(response)
    assert statuses(mixed) == {"parked": "Discarded", "parked_too": "Discarded", "pending": "Pending",
                               "delivered": "Delivered", "discarded": "Discarded"}  # fmt: skip
    assert Notification.objects.count() == 5


def test_each_action_is_recorded_in_the_admin_history_with_who_did_it(operator_client, operator, mixed):
    operator_client.post(OUTBOX, {"action": "retry_selected", "_selected_action": [mixed["parked"].pk], "index": "0"})
    operator_client.post(OUTBOX, {"action": "discard_selected", "_selected_action": [mixed["parked_too"].pk], "post": "yes"})
    entries = {e.object_id: e for e in LogEntry.objects.filter(user=operator)}
    assert set(entries) == {str(mixed["parked"].pk), str(mixed["parked_too"].pk)}
    assert "Retried" in entries[str(mixed["parked"].pk)].get_change_message()
    assert "Discarded" in entries[str(mixed["parked_too"].pk)].get_change_message()
    history = operator_client.get(reverse("admin:notifications_notification_history", args=[mixed["parked"].pk]))
    assert b"olivia" in history.content and b"Retried by operator" in history.content


def test_detail_page_offers_retry_and_discard_only_for_parked_rows(operator_client, mixed):
    def page(name):
        return operator_client.get(reverse("admin:notifications_notification_change", args=[mixed[name].pk])).content

    assert b"retry-button" in page("parked") and b"discard-link" in page("parked")
    for name in ("pending", "delivered", "discarded"):
        assert b"retry-button" not in page(name) and b"discard-link" not in page(name)


def test_retry_from_the_detail_page_makes_the_row_pending(operator_client, mixed):
    url = reverse("admin:notifications_notification_retry", args=[mixed["parked"].pk])
    assert operator_client.get(url).status_code == 405
    response = operator_client.post(url, follow=True)
    assert "Retried 1 notification." in texts(response)
    assert statuses(mixed)["parked"] == "Pending"


def test_discard_from_the_detail_page_confirms_then_discards(operator_client, mixed):
    url = reverse("admin:notifications_notification_discard", args=[mixed["parked"].pk])
    confirm = operator_client.get(url)
    assert b"Discard 1 parked notification?" in confirm.content
    assert statuses(mixed)["parked"] == "Parked"
    response = operator_client.post(url, {"post": "yes"}, follow=True)
    assert "Discarded 1 notification." in texts(response)
    assert statuses(mixed)["parked"] == "Discarded"


def test_an_action_over_too_many_rows_asks_to_narrow_the_selection(operator_client, mixed, monkeypatch):
    monkeypatch.setattr(notifications_admin, "ACTION_MAX_ROWS", 3)
    response = operator_client.post(
        OUTBOX, {"action": "retry_selected", "select_across": "1", "index": "0",
                 "_selected_action": [mixed["parked"].pk]}, follow=True,
    )  # fmt: skip
    assert any("narrow the selection" in text for text in texts(response))
    assert statuses(mixed)["parked"] == "Parked"


def test_retry_skips_a_row_the_dispatcher_changed_after_it_was_selected(operator, mixed):
    # The operator selected a Parked row; meanwhile it was discarded by someone else.
    Notification.objects.filter(pk=mixed["parked"].pk).update(status=Status.DISCARDED)
    assert notification_retry(notification_ids=[mixed["parked"].pk, mixed["parked_too"].pk], user=operator) == (1, 1)
    assert statuses(mixed)["parked"] == "Discarded"


def test_unknown_ids_are_skipped(operator, db):
    import uuid

    assert notification_discard(notification_ids=[uuid.uuid4()], user=operator) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_two_operators_retrying_and_discarding_the_same_row_at_once_change_it_once(postgres_only, operator):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL row locks")
    from django.db import connections

    parked = make_notification(status=Status.PARKED, created_at=timezone.now() - timedelta(hours=1))
    barrier = threading.Barrier(2)
    results = {}

    def run(name, operation):
        try:
            barrier.wait()
            results[name] = operation(notification_ids=[parked.pk], user=operator)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=("retry", notification_retry)),
               threading.Thread(target=run, args=("discard", notification_discard))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()) == [(0, 1), (1, 0)]
    final = Notification.objects.get(pk=parked.pk).status
    winner = "retry" if results["retry"] == (1, 0) else "discard"
    assert final == {"retry": "Pending", "discard": "Discarded"}[winner]
    assert LogEntry.objects.filter(object_id=str(parked.pk)).count() == 1
