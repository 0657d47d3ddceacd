"""Several dispatcher processes at once, and one killed mid-batch (PostgreSQL: SKIP LOCKED)."""

import signal

import pytest
from django.utils import timezone

from notifications.ingest import notifications_ingest
from notifications.models import DeliveryAttempt, Notification
from tests.dispatch.conftest import configure_smtp, validated
from tests.dispatch.test_worker import make_operators
from tests.support.payloads import make_payload
from tests.support.processes import manage, poll
from tests.support.smtp import SmtpServer

Status = Notification.Status
pytestmark = pytest.mark.slow


def ingest(count):
    items = [validated(make_payload()) for _ in range(count)]
    notifications_ingest(site_id="plant-a", inputs=items)
    return {str(item.notification_id) for item in items}


@pytest.fixture
def sink(transactional_db, postgres_only, settings):
    settings.OUTBOX_DISPATCH_TRIGGER = False  # this test's dispatchers are the processes it starts
    with SmtpServer(keep_content=False) as server:
        configure_smtp(server, timeout_seconds=5)
        make_operators()
        yield server


def test_three_dispatchers_deliver_2000_notifications_exactly_once(sink):
    ids = ingest(2000)
    workers = [manage("dispatch", "--once", "--batch-size", "50", "--concurrency", "4") for _ in range(3)]
    for worker in workers:
        _out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    assert sink.count_by_notification_id() == dict.fromkeys(ids, 1)
    assert Notification.objects.filter(status=Status.DELIVERED).count() == 2000
    assert DeliveryAttempt.objects.filter(outcome="success").count() == 2000
    assert DeliveryAttempt.objects.values("worker").distinct().count() >= 2  # they really shared the work


def test_a_killed_dispatcher_loses_nothing_and_duplicates_only_what_was_in_flight(sink):
    ids = ingest(400)
    sink.behave("accept", delay_seconds=0.05)
    victim = manage("dispatch", "--once", "--batch-size", "100", "--concurrency", "4", OUTBOX_LEASE_SECONDS=3)
    poll(lambda: sink.count >= 60, timeout=60, message="the dispatcher did not start delivering")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    received_at_kill = set(sink.count_by_notification_id())
    recorded_at_kill = {
        str(pk) for pk in Notification.objects.filter(status=Status.DELIVERED).values_list("pk", flat=True)
    }
    in_flight = received_at_kill - recorded_at_kill  # the server accepted them; the row never heard
    assert Notification.objects.filter(claimed_until__gt=timezone.now()).exists()  # a batch was held

    # Nothing is lost: once the lease expires the rows are due again and a new worker finishes.
    poll(
        lambda: not Notification.objects.filter(claimed_until__gt=timezone.now()).exists(),
        timeout=10,
        message="the lease never expired",
    )
    sink.behave("accept")
    rescuer = manage("dispatch", "--once")
    _out, err = rescuer.communicate(timeout=120)
    assert rescuer.returncode == 0, err

    assert not Notification.objects.filter(status__in=Notification.NON_TERMINAL).exists()
    assert Notification.objects.filter(status=Status.DELIVERED).count() == 400
    counts = sink.count_by_notification_id()
    assert set(counts) == ids
    duplicates = {notification_id for notification_id, n in counts.items() if n > 1}
    assert all(counts[notification_id] == 2 for notification_id in duplicates)
    assert duplicates <= in_flight
    # At most what the 4 threads had sent, plus what they finished while results were being
    # recorded: a delivery takes 50 ms here, so a recording transaction that a busy machine
    # (or PgBouncer) stretches to 150 ms lets each thread finish up to three more meanwhile.
    assert len(in_flight) <= 4 * 4
    print(f"killed after {len(received_at_kill)} received; in flight {len(in_flight)}; duplicates {len(duplicates)}")
