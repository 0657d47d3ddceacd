"""Retry, Retry now, Discard and Requeue in the console: only rows in the statuses an action
applies to change, the message counts changed and skipped rows, Discard asks first and needs
a reason (kept with who and when), and every change is in the admin history under the
operator's name."""

import threading
from datetime import timedelta
from functools import partial

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from notifications.admin import outbox as outbox_admin
from notifications.models import Notification
from notifications.operations import notification_discard, notification_requeue, notification_retry
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
        OUTBOX,
        {"action": "retry_selected", "_selected_action": [n.pk for n in mixed.values()], "index": "0"},
        follow=True,
    )
    assert "Retried 2 notifications; skipped 3 that were not Parked." in texts(response)
    assert statuses(mixed) == {
        "parked": "Pending",
        "parked_too": "Pending",
        "pending": "Pending",
        "delivered": "Delivered",
        "discarded": "Discarded",
    }
    retried = Notification.objects.get(pk=mixed["parked"].pk)
    assert retried.retry_count == 0
    assert retried.next_attempt_at is not None and retried.next_attempt_at >= before
    assert retried.last_error  # the reason it was parked stays readable


def test_retry_of_nothing_parked_changes_nothing_and_warns(operator_client, mixed):
    response = operator_client.post(
        OUTBOX, {"action": "retry_selected", "_selected_action": [mixed["delivered"].pk], "index": "0"}, follow=True
    )
    assert "Retried 0 notifications; skipped 1 that was not Parked." in texts(response)
    assert statuses(mixed)["delivered"] == "Delivered"


def test_discard_asks_for_confirmation_and_a_reason_before_changing_anything(operator_client, mixed):
    selection = [n.pk for n in mixed.values()]
    page = operator_client.post(OUTBOX, {"action": "discard_selected", "_selected_action": selection, "index": "0"})
    assert page.status_code == 200
    assert b"Discard 3 notifications?" in page.content
    assert b"2 selected notifications are not Pending, Retrying or Parked and will be skipped." in page.content
    assert b'name="reason"' in page.content
    assert statuses(mixed)["parked"] == "Parked"


def test_discard_without_a_reason_asks_again_and_changes_nothing(operator_client, mixed):
    selection = [mixed["parked"].pk]
    page = operator_client.post(
        OUTBOX, {"action": "discard_selected", "_selected_action": selection, "post": "yes", "reason": "   "}
    )
    assert page.status_code == 200
    assert b'id="reason-errors"' in page.content and b"This field is required." in page.content
    assert statuses(mixed)["parked"] == "Parked"


def test_confirmed_discard_on_a_mixed_selection_discards_queued_and_parked_rows_and_keeps_them(
    operator_client, operator, mixed
):
    selection = [n.pk for n in mixed.values()]
    before = timezone.now()
    response = operator_client.post(
        OUTBOX,
        {"action": "discard_selected", "_selected_action": selection, "post": "yes", "reason": "Pump replaced"},
        follow=True,
    )
    assert (
        "Discarded 3 notifications; skipped 2 that were not Pending, Retrying or Parked, or being delivered."
        in texts(response)
    )
    assert statuses(mixed) == {
        "parked": "Discarded",
        "parked_too": "Discarded",
        "pending": "Discarded",
        "delivered": "Delivered",
        "discarded": "Discarded",
    }
    assert Notification.objects.count() == 5
    discarded = Notification.objects.get(pk=mixed["pending"].pk)
    assert (discarded.discarded_by, discarded.discard_reason) == ("olivia", "Pump replaced")
    assert discarded.discarded_at is not None and discarded.discarded_at >= before
    assert discarded.next_attempt_at is None


def test_the_discard_record_is_shown_on_the_notification_page(operator_client, operator, mixed):
    notification_discard(notification_ids=[mixed["parked"].pk], user=operator, reason="Duplicate of an earlier alarm")
    page = operator_client.get(reverse("admin:notifications_notification_change", args=[mixed["parked"].pk]))
    assert b"Duplicate of an earlier alarm" in page.content and b"olivia" in page.content


def test_each_action_is_recorded_in_the_admin_history_with_who_did_it(operator_client, operator, mixed):
    operator_client.post(OUTBOX, {"action": "retry_selected", "_selected_action": [mixed["parked"].pk], "index": "0"})
    operator_client.post(
        OUTBOX,
        {"action": "discard_selected", "_selected_action": [mixed["parked_too"].pk], "post": "yes", "reason": "Test"},
    )
    operator_client.post(
        OUTBOX, {"action": "requeue_selected", "_selected_action": [mixed["discarded"].pk], "index": "0"}
    )
    entries = {e.object_id: e for e in LogEntry.objects.filter(user=operator)}
    assert set(entries) == {str(mixed[name].pk) for name in ("parked", "parked_too", "discarded")}
    assert "Retried" in entries[str(mixed["parked"].pk)].get_change_message()
    assert "Parked → Discarded. Reason: Test" in entries[str(mixed["parked_too"].pk)].get_change_message()
    assert "Requeued" in entries[str(mixed["discarded"].pk)].get_change_message()
    history = operator_client.get(reverse("admin:notifications_notification_history", args=[mixed["parked"].pk]))
    assert b"olivia" in history.content and b"Retried by operator" in history.content


def test_detail_page_offers_the_actions_that_apply_to_the_status(operator_client, mixed):
    retrying = make_notification(status=Status.RETRYING)

    def buttons(notification):
        page = operator_client.get(reverse("admin:notifications_notification_change", args=[notification.pk])).content
        return {
            name
            for name, marker in (
                ("retry", b"retry-button"),
                ("retry now", b"retry-now-button"),
                ("discard", b"discard-link"),
                ("requeue", b"requeue-button"),
            )
            if marker in page
        }

    assert buttons(mixed["parked"]) == {"retry", "discard"}
    assert buttons(retrying) == {"retry now", "discard"}
    assert buttons(mixed["pending"]) == {"discard"}
    assert buttons(mixed["discarded"]) == {"requeue"}
    assert buttons(mixed["delivered"]) == set()


def test_retry_now_makes_a_retrying_row_due_at_once_and_keeps_its_counters(operator_client, mixed):
    retrying = make_notification(status=Status.RETRYING, retry_count=3)
    Notification.objects.filter(pk=retrying.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    response = operator_client.post(
        reverse("admin:notifications_notification_retry_now", args=[retrying.pk]), follow=True
    )
    assert "Retried now 1 notification." in texts(response)
    retrying.refresh_from_db()
    assert retrying.status == Status.RETRYING and retrying.next_attempt_at <= timezone.now()
    assert retrying.retry_count == 3


def test_requeue_makes_a_discarded_row_pending_with_counters_reset(operator_client, operator, mixed):
    notification_discard(notification_ids=[mixed["parked"].pk], user=operator, reason="by mistake")
    response = operator_client.post(
        OUTBOX,
        {"action": "requeue_selected", "_selected_action": [mixed["parked"].pk, mixed["delivered"].pk]},
        follow=True,
    )
    assert "Requeued 1 notification; skipped 1 that was not Discarded." in texts(response)
    requeued = Notification.objects.get(pk=mixed["parked"].pk)
    assert (requeued.status, requeued.retry_count, requeued.discard_reason) == ("Pending", 0, "")
    assert requeued.requeued_at is not None
    assert requeued.next_attempt_at is not None and requeued.next_attempt_at <= timezone.now()


def test_retry_from_the_detail_page_makes_the_row_pending(operator_client, mixed):
    url = reverse("admin:notifications_notification_retry", args=[mixed["parked"].pk])
    assert operator_client.get(url).status_code == 405
    response = operator_client.post(url, follow=True)
    assert "Retried 1 notification." in texts(response)
    assert statuses(mixed)["parked"] == "Pending"


def test_discard_from_the_detail_page_confirms_then_discards(operator_client, mixed):
    url = reverse("admin:notifications_notification_discard", args=[mixed["parked"].pk])
    confirm = operator_client.get(url)
    assert b"Discard 1 notification?" in confirm.content
    assert statuses(mixed)["parked"] == "Parked"
    response = operator_client.post(url, {"post": "yes", "reason": "Sensor test"}, follow=True)
    assert "Discarded 1 notification." in texts(response)
    assert statuses(mixed)["parked"] == "Discarded"


def test_an_action_over_too_many_rows_asks_to_narrow_the_selection(operator_client, mixed, monkeypatch):
    monkeypatch.setattr(outbox_admin, "ACTION_MAX_ROWS", 3)
    response = operator_client.post(
        OUTBOX,
        {"action": "retry_selected", "select_across": "1", "index": "0", "_selected_action": [mixed["parked"].pk]},
        follow=True,
    )
    assert any("narrow the selection" in text for text in texts(response))
    assert statuses(mixed)["parked"] == "Parked"


def test_retry_skips_a_row_the_dispatcher_changed_after_it_was_selected(operator, mixed):
    # The operator selected a Parked row; meanwhile it was discarded by someone else.
    Notification.objects.filter(pk=mixed["parked"].pk).update(status=Status.DISCARDED)
    assert notification_retry(notification_ids=[mixed["parked"].pk, mixed["parked_too"].pk], user=operator) == (1, 1)
    assert statuses(mixed)["parked"] == "Discarded"


def test_unknown_ids_are_skipped(operator, db):
    import uuid

    assert notification_discard(notification_ids=[uuid.uuid4()], user=operator, reason="x") == (0, 1)
    assert notification_requeue(notification_ids=[uuid.uuid4()], user=operator) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_two_operators_acting_on_the_same_row_at_once_are_serialised(postgres_only, operator):
    """Retry (Parked → Pending) and Discard (Pending or Parked → Discarded) at the same moment:
    the row lock puts them in some order, and each sees what the other left. Either the
    discard came first (the retry then finds nothing Parked) or the retry did (the discard
    then discards the Pending row): Discarded in both cases, one history entry per change."""
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

    threads = [
        threading.Thread(target=run, args=("retry", notification_retry)),
        threading.Thread(target=run, args=("discard", partial(notification_discard, reason="race"))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["discard"] == (1, 0)
    assert results["retry"] in ((1, 0), (0, 1))
    assert Notification.objects.get(pk=parked.pk).status == Status.DISCARDED
    changes = sum(result.changed for result in results.values())
    assert LogEntry.objects.filter(object_id=str(parked.pk)).count() == changes
