"""A stateful property test over the whole lifecycle: ingest, claim, deliver, fail (a retried
class, a channel class, a class that parks), run out of time (released unstarted), lease
expiry, operator Retry, Retry now, Discard and Requeue, interleaved in any order by
Hypothesis, on the real functions — the ones a dispatch pass uses (claim, record the
attempts, finish) — and the real database.

Invariants after every step:
- Delivered is final; Discarded is final except through an operator Requeue.
- retry_count never decreases, except through an operator Retry or Requeue (which reset it).
- channel failures never exceed failed attempts; a row never parks for retries exhausted on
  channel failures alone.
- No row is held by two live claims: a worker whose lease was taken over cannot finish it,
  and no operator action changes a row under a live claim.
- Every status is one of the five, and every row stays in the table.
"""

import os
import uuid
from datetime import timedelta

from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from notifications.adapters.base import DeliveryError, DeliveryResult
from notifications.dispatch.claim import notifications_claim_due
from notifications.dispatch.finish import DeliveryOutcome, Finish, delivery_attempts_record, notifications_finish
from notifications.ingest import notifications_ingest
from notifications.models import Notification
from notifications.operations import (
    DISCARDABLE,
    notification_discard,
    notification_requeue,
    notification_retry,
    notification_retry_now,
)
from tests.dispatch.conftest import channel_with, validated
from tests.support.payloads import make_payload

Status = Notification.Status
FINAL = {Status.DELIVERED, Status.DISCARDED}
CHANNEL = channel_with(strategy="fixed", interval_seconds=60, max_attempts=3)
LEASE = 120
# A retried row class, a channel class, a class that parks at once.
OUTCOMES = ["success", "provider_error", "connection", "recipient_rejected", "not started"]


def build_machine(operator):
    class Lifecycle(RuleBasedStateMachine):
        claims = Bundle("claims")

        def __init__(self):
            super().__init__()
            # Examples share one test transaction; claims are global, so start each empty.
            Notification.objects.all().delete()
            self.now = timezone.now()
            self.ids = []
            self.seen_final = {}
            self.retry_counts = {}
            self.retried = set()

        @rule(count=st.integers(1, 3))
        def ingest(self, count):
            items = [validated(make_payload()) for _ in range(count)]
            notifications_ingest(site_id="plant-a", inputs=items)
            # Rows created now are due from "now" on; the model clock starts there.
            self.ids += [item.notification_id for item in items]
            self.now = max(self.now, timezone.now())

        @rule(target=claims, limit=st.integers(1, 4))
        def claim(self, limit):
            worker = f"w-{uuid.uuid4().hex[:6]}"
            rows = notifications_claim_due(worker_id=worker, limit=limit, now=self.now, lease_seconds=LEASE).rows
            attempts = delivery_attempts_record(worker_id=worker, notifications=rows, now=self.now)
            return (worker, rows, attempts)

        @rule(claim=claims, outcome=st.sampled_from(OUTCOMES))
        def finish(self, claim, outcome):
            self._finish(claim, outcome)

        def _finish(self, claim, outcome):
            worker, rows, attempts = claim
            for row in rows:
                if outcome == "success":
                    result = DeliveryOutcome(
                        result=DeliveryResult(targets=[{"target": "a@example.com", "outcome": "delivered"}])
                    )
                elif outcome == "not started":
                    result = DeliveryOutcome(started=False)
                else:
                    result = DeliveryOutcome(error=DeliveryError("boom", failure_class=outcome))
                report = notifications_finish(
                    worker_id=worker,
                    outcomes=[Finish(notification=row, attempt=attempts[row.pk], outcome=result, channel=CHANNEL)],
                    now=self.now,
                )
                current = Notification.objects.get(pk=row.pk)
                if report.lost == 0:
                    # Only the live holder can finish a row, and it no longer holds it after.
                    assert current.claimed_by == ""
                    if outcome == "not started":
                        assert current.status == row.status, "a release changed the status"
                    else:
                        assert current.last_attempt_at == attempts[row.pk].started_at
                else:
                    assert current.claimed_by != worker or current.status != row.status

        @rule(
            claim=claims,
            first=st.sampled_from(OUTCOMES),
            second=st.sampled_from(OUTCOMES),
        )
        def finish_twice(self, claim, first, second):
            """A worker reports twice for one claim (a stale thread, a retry of a lost answer):
            the second report must not move a row its first report finished."""
            self._finish(claim, first)
            self.lifecycle_rules_hold()
            self._finish(claim, second)

        @rule(seconds=st.sampled_from([1, 61, LEASE + 1]))
        def time_passes(self, seconds):
            self.now += timedelta(seconds=seconds)

        @rule(data=st.data())
        def operator_retry(self, data):
            if self.ids:
                chosen = data.draw(st.lists(st.sampled_from(self.ids), max_size=3, unique=True))
                parked = set(
                    Notification.objects.filter(pk__in=chosen, status=Status.PARKED).values_list("pk", flat=True)
                )
                changed, skipped = notification_retry(notification_ids=chosen, user=operator)
                assert changed == len(parked) and skipped == len(chosen) - len(parked)
                self.retried |= parked

        def _expected(self, chosen, statuses, *, unclaimed=False):
            """Which of ``chosen`` an action on ``statuses`` applies to, now (real time: the
            actions read the database clock, and every claim here is live in real time)."""
            rows = Notification.objects.filter(pk__in=chosen, status__in=statuses)
            if unclaimed:
                rows = rows.exclude(claimed_until__gt=timezone.now())
            return set(rows.values_list("pk", flat=True))

        @rule(data=st.data())
        def operator_retry_now(self, data):
            if self.ids:
                chosen = data.draw(st.lists(st.sampled_from(self.ids), max_size=3, unique=True))
                due = self._expected(chosen, [Status.RETRYING], unclaimed=True)
                changed, skipped = notification_retry_now(notification_ids=chosen, user=operator)
                assert changed == len(due) and skipped == len(chosen) - len(due)

        @rule(data=st.data())
        def operator_discard(self, data):
            if self.ids:
                chosen = data.draw(st.lists(st.sampled_from(self.ids), max_size=3, unique=True))
                discardable = self._expected(chosen, DISCARDABLE, unclaimed=True)
                changed, skipped = notification_discard(notification_ids=chosen, user=operator, reason="fuzz")
                assert changed == len(discardable) and skipped == len(chosen) - len(discardable)
                for pk in discardable:
                    self.seen_final.pop(pk, None)

        @rule(data=st.data())
        def operator_requeue(self, data):
            if self.ids:
                chosen = data.draw(st.lists(st.sampled_from(self.ids), max_size=3, unique=True))
                discarded = self._expected(chosen, [Status.DISCARDED])
                changed, skipped = notification_requeue(notification_ids=chosen, user=operator)
                assert changed == len(discarded) and skipped == len(chosen) - len(discarded)
                self.retried |= discarded
                for pk in discarded:
                    self.seen_final.pop(pk, None)

        @invariant()
        def lifecycle_rules_hold(self):
            rows = dict(Notification.objects.filter(pk__in=self.ids).values_list("pk", "status"))
            counts = dict(Notification.objects.filter(pk__in=self.ids).values_list("pk", "retry_count"))
            assert len(rows) == len(set(self.ids)), "a row disappeared"
            for row in Notification.objects.filter(pk__in=self.ids):
                assert row.channel_failures <= row.retry_count
                if row.status == Status.PARKED and row.last_error.startswith("Retries exhausted"):
                    assert row.retry_count > row.channel_failures, "parked for channel failures alone"
            for pk, status in rows.items():
                assert status in Status.values
                if pk in self.seen_final:
                    assert status == self.seen_final[pk], f"{pk} left final status {self.seen_final[pk]}"
                elif status in FINAL:
                    self.seen_final[pk] = status
                previous = self.retry_counts.get(pk, 0)
                if pk in self.retried:
                    self.retried.discard(pk)
                else:
                    assert counts[pk] >= previous, f"{pk} retry_count went from {previous} to {counts[pk]}"
                self.retry_counts[pk] = counts[pk]

        @invariant()
        def no_row_has_two_live_claims(self):
            # claimed_by is one column: a second claim replaces the first, and the first
            # worker's finish is refused (checked in `finish`). Live claims are never stolen:
            live = Notification.objects.filter(pk__in=self.ids, claimed_until__gt=self.now).exclude(claimed_by="")
            for row in live:
                assert row.status in Notification.NON_TERMINAL

    return Lifecycle


def test_lifecycle_rules_hold_under_any_interleaving(db, site, django_user_model):
    operator = django_user_model.objects.create_user("operator", is_staff=True)
    machine = build_machine(operator)
    machine.TestCase.settings = settings(
        max_examples=int(os.environ.get("OUTBOX_FUZZ_EXAMPLES", "30")),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
