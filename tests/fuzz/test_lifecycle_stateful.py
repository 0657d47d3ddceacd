"""A stateful property test over the whole lifecycle: ingest, claim, deliver, fail (transient
and permanent), lease expiry, operator Retry and Discard, interleaved in any order by
Hypothesis, on the real functions and the real database.

Invariants after every step:
- Delivered and Discarded are final: once seen, a row never changes status again.
- retry_count never decreases, except through an operator Retry (which resets it by design).
- No row is held by two live claims: a worker whose lease was taken over cannot finish it.
- Every status is one of the five, and every row stays in the table.
"""

import os
import uuid
from datetime import timedelta

from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from notifications.adapters.base import DeliveryError, DeliveryResult, RetryPolicy
from notifications.dispatch import DeliveryOutcome, notification_apply_result, notifications_claim_due
from notifications.ingest import notification_validate, notifications_ingest
from notifications.models import Notification
from notifications.operations import notification_discard, notification_retry
from tests.conftest import make_payload

Status = Notification.Status
FINAL = {Status.DELIVERED, Status.DISCARDED}
POLICY = RetryPolicy(max_retries=3, interval_seconds=60)
LEASE = 120


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
            items = [notification_validate(make_payload())[0] for _ in range(count)]
            notifications_ingest(site_id="plant-a", inputs=items)
            # Rows created now are due from "now" on; the model clock starts there.
            self.ids += [item.notification_id for item in items]
            self.now = max(self.now, timezone.now())

        @rule(target=claims, limit=st.integers(1, 4))
        def claim(self, limit):
            worker = f"w-{uuid.uuid4().hex[:6]}"
            rows = notifications_claim_due(worker_id=worker, limit=limit, now=self.now, lease_seconds=LEASE)
            return (worker, [row for row in rows])

        @rule(claim=claims, outcome=st.sampled_from(["success", "transient", "permanent"]))
        def finish(self, claim, outcome):
            self._finish(claim, outcome)

        def _finish(self, claim, outcome):
            worker, rows = claim
            for row in rows:
                if outcome == "success":
                    result = DeliveryOutcome(result=DeliveryResult(targets=[{"target": "a@example.com",
                                                                             "outcome": "delivered"}]),
                                             started_at=self.now)  # fmt: skip
                else:
                    result = DeliveryOutcome(error=DeliveryError("boom", permanent=outcome == "permanent"),
                                             started_at=self.now)  # fmt: skip
                changed = notification_apply_result(notification=row, outcome=result, worker_id=worker,
                                                    policy=POLICY, now=self.now)  # fmt: skip
                current = Notification.objects.get(pk=row.pk)
                if changed:
                    # Only the live holder can finish a row, and it no longer holds it after.
                    assert current.claimed_by == ""
                else:
                    assert current.claimed_by != worker or current.status != row.status

        @rule(claim=claims, first=st.sampled_from(["success", "transient", "permanent"]),
              second=st.sampled_from(["success", "transient", "permanent"]))
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
                parked = set(Notification.objects.filter(pk__in=chosen, status=Status.PARKED).values_list("pk", flat=True))
                changed, skipped = notification_retry(notification_ids=chosen, user=operator)
                assert changed == len(parked) and skipped == len(chosen) - len(parked)
                self.retried |= parked

        @rule(data=st.data())
        def operator_discard(self, data):
            if self.ids:
                chosen = data.draw(st.lists(st.sampled_from(self.ids), max_size=3, unique=True))
                parked = Notification.objects.filter(pk__in=chosen, status=Status.PARKED).count()
                changed, skipped = notification_discard(notification_ids=chosen, user=operator)
                assert changed == parked and skipped == len(chosen) - parked

        @invariant()
        def lifecycle_rules_hold(self):
            rows = dict(Notification.objects.filter(pk__in=self.ids).values_list("pk", "status"))
            counts = dict(Notification.objects.filter(pk__in=self.ids).values_list("pk", "retry_count"))
            assert len(rows) == len(set(self.ids)), "a row disappeared"
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
