"""The claim's order: priority first, the sites taking turns within a priority, the oldest due
first within a site; gated channels; and the bound "one site's backlog holds back another
site's rows by no more than the deliveries already in flight", as a property of the real claim
(PostgreSQL's statement, SQLite's queries).

The plans of the claim at the size of a year of history are in tests/dispatch/test_claiming.py."""

import hashlib
import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifications.dispatch.claim import dispatch_wake_at, notifications_claim_due, notifications_due_exist
from notifications.dispatch.fair import Candidate, claim_order
from notifications.models import ChannelHealth, Notification
from tests.dispatch.conftest import channel_with, queue

Priority = Notification.Priority
NOW = timezone.now()


def row(site, priority=Priority.NORMAL, *, due=-60.0, type="email", claimed_until=None):
    """One open notification of ``site`` at ``priority``, due ``due`` seconds from NOW (None:
    no due time), written directly (many per test)."""
    nid = uuid.uuid4()
    return Notification(
        notification_id=nid,
        type=type,
        list_name="Operators",
        subject=f"{site} {priority}",
        source_site_id=site,
        priority=priority,
        site_enqueued_at=NOW,
        created_at=NOW,
        next_attempt_at=None if due is None else NOW + timedelta(seconds=due),
        claimed_by="elsewhere" if claimed_until else "",
        claimed_until=claimed_until,
        fingerprint=hashlib.sha256(nid.bytes).hexdigest(),
    )


def backlog(*rows):
    return Notification.objects.bulk_create(rows)


def claimed(limit, **kwargs):
    kwargs.setdefault("now", NOW)
    return notifications_claim_due(worker_id="w1", limit=limit, channels={"email": channel_with()}, **kwargs).rows


def sites_of(rows):
    return [row.source_site_id for row in rows]


# --- order ---------------------------------------------------------------------------------------


def test_a_critical_notification_is_claimed_before_older_ones_of_lower_priority(db):
    old_normal = backlog(*(row("plant-a", due=-3600 + n) for n in range(5)))
    critical = backlog(row("plant-b", Priority.CRITICAL, due=-1))
    high = backlog(row("plant-c", Priority.HIGH, due=-2))
    low = backlog(row("plant-c", Priority.LOW, due=-7200))

    taken = claimed(3)

    assert [r.pk for r in taken] == [critical[0].pk, high[0].pk, old_normal[0].pk]
    # The next claim takes the rest, the low one last although it is the oldest of all.
    assert [r.pk for r in claimed(10)] == [*(r.pk for r in old_normal[1:]), low[0].pk]


def test_within_one_priority_the_sites_take_turns_oldest_first_within_each(db):
    flood = backlog(*(row("plant-a", due=-1000 + n) for n in range(50)))  # older than anything of b or c
    quiet = backlog(row("plant-b", due=-10), row("plant-b", due=-5))
    single = backlog(row("plant-c", due=-1))

    taken = claimed(5)

    assert sites_of(taken) == ["plant-a", "plant-b", "plant-c", "plant-a", "plant-b"]
    assert [r.pk for r in taken if r.source_site_id == "plant-a"] == [flood[0].pk, flood[1].pk]
    assert [r.pk for r in taken if r.source_site_id == "plant-b"] == [quiet[0].pk, quiet[1].pk]
    assert [r.pk for r in taken if r.source_site_id == "plant-c"] == [single[0].pk]


def test_a_claim_is_filled_from_a_flooding_site_once_the_others_have_had_their_turn(db):
    backlog(*(row("plant-a", due=-1000 + n / 10) for n in range(600)))
    backlog(row("plant-b", Priority.CRITICAL), row("plant-c"), row("plant-d", Priority.LOW))

    taken = claimed(200)

    assert len(taken) == 200
    assert taken[0].source_site_id == "plant-b"
    assert "plant-c" in sites_of(taken[:3])
    assert "plant-d" not in sites_of(taken)  # low waits for the normal flood
    assert sites_of(taken).count("plant-a") == 198


def test_a_site_with_many_critical_rows_is_not_overtaken_by_lower_priorities(db):
    # Each key reads its share first (200 split over two critical sites); the claim must not then
    # fill up with normal rows while critical rows of the site that filled its share wait.
    backlog(*(row("plant-b", Priority.CRITICAL, due=-500 + n) for n in range(300)))
    backlog(row("plant-d", Priority.CRITICAL, due=-1))
    backlog(*(row("plant-a", due=-5000 + n) for n in range(300)))

    taken = claimed(200)

    assert len(taken) == 200
    assert {r.priority for r in taken} == {Priority.CRITICAL}
    assert sites_of(taken).count("plant-d") == 1


def test_rows_without_a_due_time_come_before_dated_ones_of_their_site_and_future_rows_wait(db):
    dated = backlog(row("plant-a", due=-60))
    undated = backlog(row("plant-a", due=None))
    future = backlog(row("plant-a", due=+600))

    assert [r.pk for r in claimed(5)] == [undated[0].pk, dated[0].pk]
    assert Notification.objects.get(pk=future[0].pk).claimed_by == ""


def test_rows_in_flight_elsewhere_are_passed_over(db):
    backlog(*(row("plant-a", due=-100 + n, claimed_until=NOW + timedelta(minutes=1)) for n in range(20)))
    free = backlog(row("plant-a", due=-1), row("plant-b", due=-1))
    assert {r.pk for r in claimed(10)} == {r.pk for r in free}


def test_ingested_priorities_are_claimed_in_their_order(db):
    normal = queue(2)
    critical = queue(1, priority="critical", site_id="plant-b")
    assert [r.pk for r in notifications_claim_due(worker_id="w1", limit=1).rows] == [critical[0].pk]
    assert {r.pk for r in notifications_claim_due(worker_id="w1", limit=5).rows} == {r.pk for r in normal}


@override_settings(OUTBOX_FAIR_CLAIM=False)
def test_with_fairness_switched_off_the_oldest_due_rows_are_claimed_whatever_their_site_or_priority(db):
    oldest = backlog(*(row("plant-a", due=-1000 + n) for n in range(3)))
    backlog(row("plant-b", Priority.CRITICAL, due=-1))
    assert [r.pk for r in claimed(3)] == [r.pk for r in oldest]


# --- gated channels ----------------------------------------------------------------------------------


def open_channel(name="teams", endpoint="teams:example", **health):
    ChannelHealth.objects.create(channel=name, endpoint=endpoint, state=ChannelHealth.State.OPEN, **health)
    channel = channel_with(name=name, endpoint=endpoint)
    channel.clean = False
    return channel


def test_rows_of_an_open_channel_are_skipped_and_hold_back_no_other_row_of_their_site(db):
    waiting = backlog(*(row("plant-a", Priority.CRITICAL, due=-100 + n, type="teams") for n in range(30)))
    emails = backlog(row("plant-a", due=-1), row("plant-b", due=-1))
    channels = {"email": channel_with(), "teams": open_channel(probe_after=NOW + timedelta(minutes=5))}

    taken = notifications_claim_due(worker_id="w1", limit=10, now=NOW, channels=channels).rows

    assert {r.pk for r in taken} == {r.pk for r in emails}
    assert not Notification.objects.filter(pk__in=[r.pk for r in waiting]).exclude(claimed_by="").exists()


def test_an_open_channel_due_for_its_probe_gives_one_row_the_highest_priority_first(db):
    backlog(*(row("plant-a", due=-100 + n, type="teams") for n in range(5)))
    critical = backlog(row("plant-b", Priority.CRITICAL, due=-1, type="teams"))
    channels = {"email": channel_with(), "teams": open_channel(probe_after=NOW - timedelta(seconds=1))}

    claim = notifications_claim_due(worker_id="w1", limit=10, now=NOW, channels=channels)

    assert [r.pk for r in claim.rows] == [critical[0].pk]
    assert claim.probes == {critical[0].pk}


def test_a_rate_limited_channel_gives_no_more_rows_than_its_tokens_in_the_claims_order(db):
    backlog(*(row("plant-a", due=-100 + n, type="teams") for n in range(10)))
    backlog(row("plant-b", due=-1, type="teams"))
    emails = backlog(*(row("plant-a", due=-50 + n) for n in range(3)))
    teams = channel_with(name="teams", endpoint="teams:example", rate_per_minute=180)  # 3 tokens a second

    taken = notifications_claim_due(
        worker_id="w1", limit=10, now=NOW, channels={"email": channel_with(), "teams": teams}
    ).rows

    team_rows = [r for r in taken if r.type == "teams"]
    assert sites_of(team_rows) == ["plant-a", "plant-b", "plant-a"]
    assert {r.pk for r in taken if r.type == "email"} == {r.pk for r in emails}
    assert ChannelHealth.objects.get(channel="teams").rate_tokens == pytest.approx(0, abs=0.01)


# --- due times ---------------------------------------------------------------------------------------


def test_the_wake_time_is_the_first_due_time_of_any_site_and_none_when_nothing_waits(db):
    assert dispatch_wake_at(channels={"email": channel_with()}, now=NOW) is None
    backlog(
        row("plant-a", due=+300),
        row("plant-b", due=+120),
        row("plant-c", due=+600, claimed_until=NOW + timedelta(hours=1)),
    )
    assert dispatch_wake_at(channels={"email": channel_with()}, now=NOW) == NOW + timedelta(seconds=120)
    assert not notifications_due_exist(now=NOW)
    backlog(row("plant-d", Priority.LOW, due=None))
    assert dispatch_wake_at(channels={"email": channel_with()}, now=NOW) == NOW
    assert notifications_due_exist(now=NOW)


# --- the bound, as a property -------------------------------------------------------------------------

rows_strategy = st.lists(
    st.tuples(
        st.sampled_from(["plant-a", "plant-b", "plant-c", "plant-d", "plant-e", "plant-f"]),
        st.sampled_from(Priority.values),
        # due: mostly passed (some at the same instant), some without a due time, some later
        st.one_of(st.integers(min_value=-50, max_value=0).map(float), st.none(), st.just(120.0)),
        st.booleans(),  # held by another worker (when ``leased_share`` lets it)
    ),
    min_size=1,
    max_size=60,
)


@pytest.mark.usefixtures("db")
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    rows=rows_strategy, spare=st.integers(min_value=0, max_value=4), leased_share=st.integers(min_value=0, max_value=5)
)
def test_a_sites_oldest_due_row_at_the_highest_due_priority_is_in_the_next_claim_when_the_claim_has_room_for_one_per_site(
    rows, spare, leased_share
):
    Notification.objects.all().delete()
    stored = []
    for index, (site, priority, due, leased) in enumerate(rows):
        in_flight = leased and index % 6 < leased_share  # rows held by another worker: not due for this claim
        stored.append(row(site, priority, due=due, claimed_until=NOW + timedelta(minutes=1) if in_flight else None))
    backlog(*stored)
    due = [r for r in stored if not r.claimed_until and (r.next_attempt_at is None or r.next_attempt_at <= NOW)]
    if not due:
        assert claimed(5) == []
        return
    top = max(r.priority for r in due)
    sites_at_top = {r.source_site_id for r in due if r.priority == top}
    limit = len(sites_at_top) + spare

    taken = claimed(limit)

    # The bound: each site's oldest due row at the top priority (or one as old) is claimed.
    def oldest(site):
        return min(
            (r.next_attempt_at is not None, r.next_attempt_at or NOW)
            for r in due
            if r.source_site_id == site and r.priority == top
        )

    for site in sites_at_top:
        mine = [
            (r.next_attempt_at is not None, r.next_attempt_at or NOW)
            for r in taken
            if r.source_site_id == site and r.priority == top
        ]
        assert oldest(site) in mine, (site, sites_of(taken))
    # And the claim is exactly the first rows of the order, ties aside, nothing not due: the
    # rows of each site and priority are its oldest due ones, and the places of the rows in the
    # order (priority, turn, due time) are those of the reference. Which of two rows tied on all
    # three comes first is the statement's (within a site it reads an index range in the order
    # of the index, not of ids), so which site fills the last place of a tie may differ.
    expected = claim_order(
        [
            Candidate(pk=r.pk, site=r.source_site_id, priority=r.priority, channel=r.type, due=r.next_attempt_at)
            for r in due
        ],
        limit=limit,
    )
    assert all(r.pk in {d.pk for d in due} for r in taken)
    for site, priority in {(r.source_site_id, r.priority) for r in taken}:
        mine = sorted(due_key(r.next_attempt_at) for r in taken if (r.source_site_id, r.priority) == (site, priority))
        oldest_first = sorted(
            due_key(r.next_attempt_at) for r in due if (r.source_site_id, r.priority) == (site, priority)
        )
        assert mine == oldest_first[: len(mine)], (site, priority)
    assert places([(r.source_site_id, r.priority, r.next_attempt_at) for r in taken]) == places(
        [(c.site, c.priority, c.due) for c in expected]
    )


def due_key(due):
    """A due time in the claim's order: rows without one first."""
    return (due is not None, due or NOW)


def places(rows):
    """The places of ``(site, priority, due)`` rows in the claim's order, without the sites:
    (priority, the row's turn within its site and priority, due time), sorted."""
    by_site = defaultdict(list)
    for site, priority, due in rows:
        by_site[(site, priority)].append(due_key(due))
    return sorted(
        (-priority, turn, due) for (_, priority), dues in by_site.items() for turn, due in enumerate(sorted(dues))
    )


def test_the_reference_order_is_priority_then_turns_then_age():
    a1, a2, b1, c1 = (
        Candidate(pk="a1", site="a", priority=1, channel="email", due=NOW - timedelta(seconds=9)),
        Candidate(pk="a2", site="a", priority=1, channel="email", due=NOW - timedelta(seconds=8)),
        Candidate(pk="b1", site="b", priority=1, channel="email", due=NOW),
        Candidate(pk="c1", site="c", priority=3, channel="email", due=NOW),
    )
    assert [c.pk for c in claim_order([a1, a2, b1, c1], limit=4)] == ["c1", "a1", "b1", "a2"]
    assert [c.pk for c in claim_order([a1, a2, b1, c1], limit=4, fair=False)] == ["a1", "a2", "b1", "c1"]
    assert [c.pk for c in claim_order([a1, a2, b1, c1], limit=4, capped={"email": 2})] == ["c1", "a1"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SKIP LOCKED between two transactions")
def test_two_workers_claiming_at_once_never_take_the_same_row(transactional_db):
    import threading

    backlog(*(row(f"plant-{n % 5}", due=-1000 + n) for n in range(300)))
    results = {}

    def work(name):
        results[name] = [
            r.pk for r in notifications_claim_due(worker_id=name, limit=120, channels={"email": channel_with()}).rows
        ]
        connection.close()

    threads = [threading.Thread(target=work, args=(name,)) for name in ("w1", "w2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not set(results["w1"]) & set(results["w2"])
    assert len(results["w1"]) + len(results["w2"]) == 240
