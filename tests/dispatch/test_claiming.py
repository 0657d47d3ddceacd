"""Claiming with a lease, and finishing rows only while the claim is still ours."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications.adapters.base import DeliveryError, DeliveryResult
from notifications.dispatch import runner
from notifications.dispatch.claim import dispatch_wake_at, notifications_claim_due
from notifications.dispatch.finish import DeliveryOutcome, Finish, delivery_attempts_record, notifications_finish
from notifications.dispatch.runner import CLAIM_HORIZON_SECONDS, _Pace
from notifications.models import DeliveryAttempt, Notification
from tests.dispatch.conftest import WORKER, channel_with, fresh, queue, run_pass

Status = Notification.Status


def test_claim_stamps_a_lease_and_hides_the_rows_from_other_workers(db):
    queue(3)
    claimed = notifications_claim_due(worker_id="w1", limit=2).rows
    assert len(claimed) == 2
    for row in Notification.objects.filter(pk__in=[n.pk for n in claimed]):
        assert row.claimed_by == "w1"
        assert row.claimed_until is not None and row.claimed_until > timezone.now() + timedelta(seconds=60)
    others = notifications_claim_due(worker_id="w2", limit=10).rows
    assert len(others) == 1
    assert {n.pk for n in others}.isdisjoint({n.pk for n in claimed})
    assert notifications_claim_due(worker_id="w3", limit=10).rows == []


def test_a_row_whose_lease_expired_is_due_again(db):
    (notification,) = queue()
    notifications_claim_due(worker_id="crashed", limit=10)
    assert notifications_claim_due(worker_id="w2", limit=10).rows == []
    later = timezone.now() + timedelta(seconds=121)
    (reclaimed,) = notifications_claim_due(worker_id="w2", limit=10, now=later).rows
    assert reclaimed.pk == notification.pk
    assert fresh(notification).claimed_by == "w2"


def test_only_pending_and_due_retrying_rows_are_claimed(db):
    pending, retrying_due, retrying_later, parked, delivered = queue(5)
    now = timezone.now()
    Notification.objects.filter(pk=retrying_due.pk).update(status=Status.RETRYING, next_attempt_at=now)
    Notification.objects.filter(pk=retrying_later.pk).update(
        status=Status.RETRYING, next_attempt_at=now + timedelta(minutes=1)
    )
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED)
    Notification.objects.filter(pk=delivered.pk).update(status=Status.DELIVERED)
    claimed = {n.pk for n in notifications_claim_due(worker_id="w1", limit=10, now=now + timedelta(seconds=1)).rows}
    assert claimed == {pending.pk, retrying_due.pk}


def test_a_pending_row_without_a_next_attempt_time_is_still_due(db):
    (notification,) = queue()
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=None)
    assert [n.pk for n in notifications_claim_due(worker_id="w1", limit=10).rows] == [notification.pk]


def claim_one(worker_id):
    """Claim the one due row for ``worker_id`` and record its attempt, as a dispatch batch does."""
    (claimed,) = notifications_claim_due(worker_id=worker_id, limit=1).rows
    attempts = delivery_attempts_record(worker_id=worker_id, notifications=[claimed], now=timezone.now())
    return claimed, attempts[claimed.pk]


def finish_one(worker_id, claimed, attempt, outcome, channel=None):
    return notifications_finish(
        worker_id=worker_id,
        outcomes=[Finish(notification=claimed, attempt=attempt, outcome=outcome, channel=channel or channel_with())],
    )


def test_finishing_does_not_overwrite_a_row_another_worker_reclaimed(db):
    (notification,) = queue()
    claimed, attempt = claim_one("slow")
    Notification.objects.filter(pk=notification.pk).update(claimed_by="other")
    report = finish_one("slow", claimed, attempt, DeliveryOutcome(result=DeliveryResult(targets=[])))
    assert (report.delivered, report.lost) == (0, 1)
    notification = fresh(notification)
    assert (notification.status, notification.claimed_by) == (Status.PENDING, "other")
    # The attempt still records what happened: the delivery did take place.
    assert DeliveryAttempt.objects.get(pk=attempt.pk).outcome == DeliveryAttempt.Outcome.SUCCESS


def test_finishing_does_not_overwrite_an_operator_change_of_status(db):
    (notification,) = queue()
    claimed, attempt = claim_one("w1")
    Notification.objects.filter(pk=notification.pk).update(status=Status.DISCARDED)
    outcome = DeliveryOutcome(error=DeliveryError("451 later", failure_class="provider_error"))
    report = finish_one("w1", claimed, attempt, outcome, channel_with(max_attempts=3))
    assert (report.retrying, report.lost) == (0, 1)
    assert fresh(notification).status == Status.DISCARDED


def test_one_allowed_attempt_parks_on_the_first_transient_failure(db):
    (notification,) = queue()
    claimed, attempt = claim_one("w1")
    outcome = DeliveryOutcome(error=DeliveryError("451 later", failure_class="provider_error"))
    report = finish_one("w1", claimed, attempt, outcome, channel_with(max_attempts=1))
    assert report.parked == 1
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error == "Retries exhausted (1 failed attempts): 451 later"


def test_a_finished_row_was_last_attempted_when_its_attempt_started(db):
    (notification,) = queue()
    claimed, attempt = claim_one("w1")
    finish_one("w1", claimed, attempt, DeliveryOutcome(result=DeliveryResult(targets=[]), duration_ms=7))
    attempt = DeliveryAttempt.objects.get(pk=attempt.pk)
    assert fresh(notification).last_attempt_at == attempt.started_at
    assert (attempt.outcome, attempt.duration_ms) == (DeliveryAttempt.Outcome.SUCCESS, 7)


def test_a_row_released_unstarted_is_due_again_and_keeps_no_attempt(db):
    (notification,) = queue()
    claimed, attempt = claim_one("w1")
    report = finish_one("w1", claimed, attempt, DeliveryOutcome(started=False))
    assert report.released == 1
    notification = fresh(notification)
    assert (notification.status, notification.claimed_by, notification.last_attempt_at) == (Status.PENDING, "", None)
    assert not DeliveryAttempt.objects.exists()
    assert [row.pk for row in notifications_claim_due(worker_id="w2", limit=1).rows] == [notification.pk]


@pytest.mark.usefixtures("operators_list")
def test_a_stopped_pass_releases_rows_it_did_not_start_and_keeps_no_attempt_for_them(
    smtp_server, smtp_config, monkeypatch
):
    queue(5)
    stop = threading.Event()
    stop.set()
    report = run_pass(stop=stop)
    assert report.claimed == 0  # a stop request before the first claim claims nothing

    # Stop after the claim: every row is released untouched and due again.
    original = notifications_claim_due

    def claim_then_stop(**kwargs):
        rows = original(**kwargs)
        stop.set()
        return rows

    stop.clear()
    monkeypatch.setattr(runner, "notifications_claim_due", claim_then_stop)
    report = run_pass(stop=stop)
    monkeypatch.undo()
    assert (report.claimed, report.released, report.delivered) == (5, 5, 0)
    assert smtp_server.count == 0
    assert DeliveryAttempt.objects.count() == 0
    assert Notification.objects.filter(status=Status.PENDING, claimed_by="", claimed_until=None).count() == 5
    assert run_pass().delivered == 5


@pytest.mark.usefixtures("operators_list")
def test_a_bug_while_delivering_one_row_stops_the_pass_after_every_other_row_is_recorded(
    smtp_server, smtp_config, monkeypatch
):
    # A bug in the dispatcher cannot be produced by a server: one row's delivery is made to
    # raise (a mock). The rows delivered meanwhile are recorded, those not yet started are
    # released, then the pass raises; the broken row waits for its lease to end.
    smtp_server.behave("accept", delay_seconds=0.05)
    rows = queue(6)
    broken = rows[0].pk
    deliver = runner.notification_deliver

    def delivering(*, notification, **kwargs):
        if notification.pk == broken:
            raise RuntimeError("a bug in the dispatcher")
        return deliver(notification=notification, **kwargs)

    monkeypatch.setattr(runner, "notification_deliver", delivering)
    with pytest.raises(RuntimeError, match="a bug in the dispatcher"):
        run_pass(concurrency=2)
    others = [fresh(row) for row in rows if row.pk != broken]
    assert {row.status for row in others} <= {Status.DELIVERED, Status.PENDING}
    assert all(row.claimed_by == "" for row in others)  # recorded or released, none left held
    delivered = [row for row in others if row.status == Status.DELIVERED]
    assert smtp_server.count == len(delivered) >= 1
    assert fresh(rows[0]).claimed_by == WORKER


@pytest.mark.usefixtures("operators_list")
def test_a_database_failure_at_a_claim_records_the_deliveries_under_way_before_it_is_raised(
    transactional_db, smtp_server, smtp_config, monkeypatch
):
    # A database restart that falls exactly between two claims of one pass cannot be timed
    # with a real server (the chaos suite restarts PostgreSQL under load): the second claim is
    # made to raise (a mock). The first batch's messages have gone out: their rows must be
    # recorded Delivered, not left claimed to be sent again when their lease ends. (The pass
    # closes its connection on the failure: a transactional test, not one inside a transaction.)
    from django.db import OperationalError

    smtp_server.behave("accept", delay_seconds=0.2)
    queue(8)
    claim = runner.notifications_claim_due
    claims = []

    def claim_then_fail(**kwargs):
        claims.append(kwargs["limit"])
        if len(claims) > 1:
            raise OperationalError("the database system is shutting down")
        return claim(**kwargs)

    monkeypatch.setattr(runner, "notifications_claim_due", claim_then_fail)
    with pytest.raises(OperationalError, match="shutting down"):
        run_pass(batch_size=4, concurrency=4)
    monkeypatch.undo()
    assert len(claims) == 2
    first = Notification.objects.filter(status=Status.DELIVERED)
    assert first.count() == smtp_server.count == 4
    assert not Notification.objects.exclude(claimed_by="").exists()
    assert run_pass().delivered == 4
    assert smtp_server.count == 8


@pytest.mark.usefixtures("operators_list")
def test_a_pass_drains_several_batches(smtp_server, smtp_config):
    queue(25)
    report = run_pass(batch_size=10)
    assert (report.batches, report.delivered, report.more_due) == (3, 25, False)
    assert smtp_server.count == 25


@pytest.mark.usefixtures("operators_list")
def test_a_pass_out_of_time_says_more_is_due(smtp_server, smtp_config):
    queue(3)
    report = run_pass(time_budget=0)
    assert (report.claimed, report.more_due) == (0, True)


def claimed_and_delivered(worker_id, count):
    """Claim ``count`` due rows and record their attempts, as a dispatch batch does; returns
    the rows and their results as delivered, to finish."""
    targets = [{"target": "ops@example.com", "outcome": "delivered", "smtp_code": 250}]
    rows = notifications_claim_due(worker_id=worker_id, limit=count).rows
    attempts = delivery_attempts_record(worker_id=worker_id, notifications=rows, now=timezone.now())
    return rows, [
        Finish(
            notification=row,
            attempt=attempts[row.pk],
            outcome=DeliveryOutcome(result=DeliveryResult(targets=targets, detail={"smtp_code": 250})),
            channel=channel_with(),
        )
        for row in rows
    ]


def claim_record_finish(worker_id, count):
    """Claim ``count`` due rows, record their attempts and finish them delivered, as a dispatch
    batch does; the number of queries that took."""
    queue(count)
    with CaptureQueriesContext(connection) as captured:
        rows, finishes = claimed_and_delivered(worker_id, count)
        report = notifications_finish(worker_id=worker_id, outcomes=finishes)
    assert (len(rows), report.delivered) == (count, count)
    return len(captured.captured_queries)


def test_a_batch_costs_the_same_statements_whatever_its_size(db):
    # Claiming, recording the attempts and finishing are set-wise: a batch of 40 rows takes
    # exactly the statements a batch of 2 takes, never one per row.
    assert claim_record_finish("small", 2) == claim_record_finish("large", 40)


def test_recorded_attempts_are_the_stored_rows_in_progress(db):
    queue(3)
    rows = notifications_claim_due(worker_id="w1", limit=3).rows
    now = timezone.now()
    attempts = delivery_attempts_record(worker_id="w1", notifications=rows, now=now)
    assert set(attempts) == {row.pk for row in rows}
    stored = {attempt.pk: attempt for attempt in DeliveryAttempt.objects.all()}
    assert len(stored) == 3
    for notification_id, attempt in attempts.items():
        row = stored[attempt.pk]
        assert (row.notification_id, row.started_at, row.worker) == (notification_id, now, "w1")
        assert (row.outcome, row.duration_ms, row.detail) == (DeliveryAttempt.Outcome.IN_PROGRESS, None, {})


def test_claims_shrink_to_what_the_threads_start_soon_at_a_slow_relays_pace():
    pace = _Pace()
    assert pace.claim_size(batch_size=200, concurrency=16) == 200  # nothing timed yet
    for _ in range(20):
        pace.observe(55)  # a relay answering after about 50 ms
    assert pace.claim_size(batch_size=200, concurrency=16) == 16 * int(CLAIM_HORIZON_SECONDS / 0.055)
    for _ in range(40):
        pace.observe(2)  # a fast relay: the whole batch shares a claim's fixed cost
    assert pace.claim_size(batch_size=200, concurrency=16) == 200
    for _ in range(40):
        pace.observe(10_000)  # a relay timing out: still one delivery per thread
    assert pace.claim_size(batch_size=200, concurrency=16) == 16
    assert pace.claim_size(batch_size=5, concurrency=16) == 5  # never more than the batch size


@pytest.mark.usefixtures("operators_list")
def test_a_pass_against_a_slow_relay_claims_in_smaller_batches_and_delivers_everything(smtp_server, smtp_config):
    smtp_server.behave("accept", delay_seconds=0.05)
    queue(90)
    report = run_pass(batch_size=50, concurrency=4)
    # The first claim takes the batch size (50); once deliveries are timed (~50 ms), a claim
    # takes what 4 threads start within the horizon (about 16 rows): the other 40 rows take at
    # least three claims, where claims of the batch size would have taken one.
    assert report.delivered == 90 and smtp_server.count == 90
    assert report.batches >= 1 + 3
    assert Notification.objects.filter(status=Status.DELIVERED).count() == 90


def stale_statistics_backlog(count):
    """``count`` rows queued after the table's statistics were taken empty, as when a backlog
    arrives between two runs of autovacuum (statistics rolled back with the test)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifications_notification")
    queue(count)


def delivered_history(count):
    """``count`` delivered notifications of the last hour, written by SQL (PostgreSQL), as the
    history a table holds when a backlog arrives."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notifications_notification (
                notification_id, type, list_name, subject, body, type_data, status, retry_count,
                channel_failures, last_error, resolved_targets, targets_refused, source_site_id,
                source_instance_id, source_script, site_enqueued_at, created_at, last_attempt_at,
                next_attempt_at, delivered_at, claimed_by, claimed_until, fingerprint, requeued_at,
                expired_at, discarded_at, discarded_by, discard_reason)
            SELECT gen_random_uuid(), 'email', 'Operators', 'Pump 3 tripped', '', '{}', 'Delivered', 0, 0,
                '', '[]', 0, 'plant-a', '', '', t, t, t, NULL, t, '', NULL, md5(i::text), NULL, NULL, NULL, '', ''
            FROM (SELECT i, now() - interval '1 hour' + interval '1 millisecond' * i AS t
                  FROM generate_series(1, %s) AS i) AS history
            """,
            [count],
        )


def plans(captured):
    """The plans (JSON) of the captured statements that lock or change notifications,
    replayed in order with the captured settings (``set_config``) applied first: a row lock's
    as run (EXPLAIN ANALYZE, the claim's lock-and-lease statement too), an UPDATE's as
    planned."""
    found = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if "set_config" in sql:
                cursor.execute(sql)
            elif "FOR UPDATE" in sql or sql.startswith('UPDATE "notifications_notification"'):
                run = sql.startswith(("SELECT", "WITH"))
                cursor.execute(f"EXPLAIN (FORMAT JSON{', ANALYZE' if run else ''}) {sql}")
                found.append((sql, cursor.fetchone()[0][0]["Plan"]))
    return found


def wake_time_plans(captured):
    """The plans of the captured look-ups of the next due time, replayed (EXPLAIN ANALYZE) with
    the captured settings applied first."""
    replayed = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            if "set_config" in query["sql"]:
                cursor.execute(query["sql"])
            elif "f.due FROM keys" in query["sql"]:
                cursor.execute(f"EXPLAIN (FORMAT JSON, ANALYZE) {query['sql']}")
                replayed.append(cursor.fetchone()[0][0]["Plan"])
    return replayed


def indexes_read(plan):
    """The indexes the plan reads, in plan order; "(whole table)" for a sequential scan."""
    return [
        "(whole table)" if node["Node Type"] == "Seq Scan" else node["Index Name"]
        for node in plan_nodes(plan)
        if node["Node Type"] == "Seq Scan" or "Index Name" in node
    ]


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def rows_read(plan, index="notif_claim_idx"):
    """Index entries the plan read off ``index``, over all its loops (returned or filtered out)."""
    return sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in plan_nodes(plan)
        if node.get("Index Name") == index
    )


def largest_sort(plan):
    """The most rows any sort of the plan sorted (0 without a sort)."""
    return max(
        (node["Actual Rows"] * node["Actual Loops"] for node in plan_nodes(plan) if node["Node Type"] == "Sort"),
        default=0,
    )


def assert_claim_plan(plan, *, sql, read_at_most, sorted_at_most):
    # Notifications are found through the claim index (keys, ranges) and leased by primary
    # key; the sorts are of the claim's candidates, never of a backlog.
    assert set(indexes_read(plan)) == {"notif_claim_idx", "notifications_notification_pkey"}, (sql, plan)
    assert rows_read(plan) <= read_at_most, (rows_read(plan), sql, plan)
    assert rows_read(plan, "notifications_notification_pkey") <= sorted_at_most, (sql, plan)
    assert largest_sort(plan) <= sorted_at_most, (largest_sort(plan), sql, plan)


def statistics_of_ten_million_rows():
    """Planner statistics as of a table of 10,000,000 rows: the analyzed row density of the
    table and of its indexes times 500 (PostgreSQL scales the density by the pages the
    relation has now), within the test's transaction. Its 20,000 delivered rows stand for a
    year of history; the value statistics stay those of history alone."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE pg_class SET reltuples = reltuples * 500
            WHERE oid = 'notifications_notification'::regclass
               OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'notifications_notification'::regclass)
            """
        )
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'notifications_notification'::regclass")
        assert cursor.fetchone()[0] >= 10_000_000


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_a_claim_reads_about_what_it_takes_even_with_statistics_from_before_the_backlog(db):
    # With statistics saying "no rows", PostgreSQL collected every due row of the backlog and
    # sorted them for each claim (5,000 queued: every claim of 200 read all 5,000). And one
    # query for "due time passed or unset" reads every waiting row once the due ones run out.
    stale_statistics_backlog(1000)
    waiting = Notification.objects.order_by("created_at").values_list("pk", flat=True)[80:]
    Notification.objects.filter(pk__in=list(waiting)).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    with CaptureQueriesContext(connection) as captured:
        claimed = notifications_claim_due(worker_id="w1", limit=50).rows
    assert len(claimed) == 50
    # The same claim again, run: the 30 rows still due, none of the 920 waiting. Each key's due
    # range is read twice (is anything due? then its share), passing over the 50 in flight.
    ((sql, plan),) = plans(captured)
    assert_claim_plan(plan, sql=sql, read_at_most=2 * 80 + 5, sorted_at_most=30)
    assert Notification.objects.filter(claimed_by="w1").count() == 80  # leased by the replay too


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_a_claim_reads_the_claim_index_when_the_statistics_saw_only_delivered_history(db):
    # Statistics taken over delivered history put every index of open rows at one row:
    # PostgreSQL then read the backlog through one of the KPIs' indexes of open rows and sorted
    # all of it for every claim (at 10,000,000 rows: notifications.db.read_in_index_order).
    delivered_history(20_000)
    stale_statistics_backlog(1000)
    with CaptureQueriesContext(connection) as captured:
        assert len(notifications_claim_due(worker_id="w1", limit=200).rows) == 200
    ((sql, plan),) = plans(captured)
    assert_claim_plan(plan, sql=sql, read_at_most=2 * 200 + 5, sorted_at_most=200)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_a_claim_at_ten_million_rows_reads_each_site_and_priority_off_the_claim_index(db):
    # A year of history, a backlog from five sites at three priorities queued since the last
    # ANALYZE, and a claim of 200 that takes every site's turn: keys are probed one by one and
    # each key's share read as one range, so the claim reads about what it takes.
    delivered_history(20_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifications_notification")
    statistics_of_ten_million_rows()
    for n in range(5):
        queue(300, site_id=f"plant-{n}")
        queue(5, site_id=f"plant-{n}", priority="high")
    queue(3, site_id="plant-9", priority="critical")
    with CaptureQueriesContext(connection) as captured:
        claim = notifications_claim_due(worker_id="w1", limit=200).rows
    assert [row.priority for row in claim[:28]] == [Notification.Priority.CRITICAL] * 3 + [
        Notification.Priority.HIGH
    ] * 25
    assert len({row.source_site_id for row in claim[28:]}) == 5
    ((sql, plan),) = plans(captured)
    # The replay claims the next 200; at most two reads of each range (with the share's
    # rounding: 35 a site) beside the first claim's rows passed over.
    assert_claim_plan(plan, sql=sql, read_at_most=2 * (200 + 200) + 20, sorted_at_most=200)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_the_next_due_time_is_read_off_the_claim_index_when_the_statistics_saw_only_delivered_history(db):
    delivered_history(20_000)
    stale_statistics_backlog(1000)
    later = timezone.now() + timedelta(hours=1)
    Notification.objects.filter(status=Status.PENDING).update(next_attempt_at=later)
    with CaptureQueriesContext(connection) as captured:
        assert dispatch_wake_at(channels={"email": channel_with()}) == later
    (plan,) = wake_time_plans(captured)
    assert set(indexes_read(plan)) == {"notif_claim_idx"}, plan
    assert rows_read(plan) <= 3, plan  # two probes for the one key, and its first row


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_finishing_finds_its_rows_by_primary_key_even_with_statistics_from_before_the_backlog(db):
    # With statistics saying "no Pending rows", PostgreSQL read all 20,000 Pending rows of a
    # backlog through the status index to finish the 100 rows of one batch.
    stale_statistics_backlog(1000)
    _, finishes = claimed_and_delivered("w1", 50)
    with CaptureQueriesContext(connection) as captured:
        assert notifications_finish(worker_id="w1", outcomes=finishes).delivered == 50
    ((sql, plan),) = plans(captured)
    assert indexes_read(plan) == ["notifications_notification_pkey"], (sql, plan)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans")
def test_the_next_due_time_is_read_off_the_claim_index_even_with_statistics_from_before_the_backlog(db):
    # A waiting worker asks every second while a backlog waits out an outage: with statistics
    # saying "no rows", PostgreSQL sorted the whole backlog to find its first due time.
    stale_statistics_backlog(1000)
    later = timezone.now() + timedelta(hours=1)
    Notification.objects.update(next_attempt_at=later)
    with CaptureQueriesContext(connection) as captured:
        assert dispatch_wake_at(channels={"email": channel_with()}) == later
    (plan,) = wake_time_plans(captured)
    assert not any(node["Node Type"] == "Sort" for node in plan_nodes(plan)), plan
    assert set(indexes_read(plan)) == {"notif_claim_idx"}, plan
    assert rows_read(plan) <= 3, plan


def test_each_finished_row_gets_its_own_outcomes_when_rows_in_a_row_differ(db):
    # Delivered rows whose outcomes equal the row before's share its changes; rows that differ
    # in their targets' outcomes or warning, in any order, keep their own.
    queue(6)
    rows, finishes = claimed_and_delivered("w1", 6)
    one = [{"target": "ops@example.com", "outcome": "delivered", "smtp_code": 250}]
    two = [{"target": "ops@example.com", "outcome": "delivered", "smtp_code": 251}]
    results = [(one, ""), (one, ""), (two, ""), (one, ""), (one, "slow relay"), (two, "")]
    finishes = [
        Finish(
            notification=item.notification,
            attempt=item.attempt,
            outcome=DeliveryOutcome(result=DeliveryResult(targets=[dict(t) for t in targets], warning=warning)),
            channel=item.channel,
        )
        for item, (targets, warning) in zip(finishes, results, strict=True)
    ]
    assert notifications_finish(worker_id="w1", outcomes=finishes).delivered == 6
    for row, (targets, warning) in zip(rows, results, strict=True):
        stored = Notification.objects.get(pk=row.pk)
        assert (stored.status, stored.resolved_targets, stored.last_error) == (Status.DELIVERED, targets, warning)


def test_claims_take_rows_without_a_due_time_first_then_the_oldest_due(db):
    now = timezone.now()
    older, newer, undated, future = queue(4)
    for row, due in (
        (older, now - timedelta(minutes=10)),
        (newer, now - timedelta(minutes=5)),
        (future, now + timedelta(hours=1)),
    ):
        Notification.objects.filter(pk=row.pk).update(next_attempt_at=due)
    Notification.objects.filter(pk=undated.pk).update(next_attempt_at=None)
    first = notifications_claim_due(worker_id="w1", limit=2, now=now).rows
    assert [row.pk for row in first] == [undated.pk, older.pk]
    assert all((row.claimed_by, row.status) == ("w1", Status.PENDING) for row in first)
    assert [row.pk for row in notifications_claim_due(worker_id="w2", limit=5, now=now).rows] == [newer.pk]
    assert set(Notification.objects.filter(claimed_by="w1").values_list("pk", flat=True)) == {undated.pk, older.pk}
