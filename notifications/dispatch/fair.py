"""The claim's order (docs/architecture.md, "The claim's order"): priority first; within one
priority the sites take turns; within a site the oldest due row first.

Every due row has a place in one order: by priority (most urgent first), then by its rank
within its site at that priority (the site's oldest due row is 1, the next 2, …), then by due
time. A claim of ``limit`` rows takes the first ``limit`` rows of that order that no other
worker holds, so a site's oldest due row at the highest priority that has due rows is in the
next claim whenever the claim takes at least as many rows as there are sites with due rows at
that priority: one site's backlog holds back another site's rows by no more than the
deliveries already in flight. (The property test in tests/dispatch/test_fair_claim.py holds
the claim to that bound.)

How it is read on PostgreSQL, on a table of millions of rows and a backlog of any depth:

- **Keys.** The claim index (``notif_claim_idx``) holds the open rows by (site, priority,
  channel, due time). The distinct keys are enumerated with a recursive "loose index scan":
  one index probe per key — there are tens of keys, not millions of rows. Keys of a channel
  that is closed to this claim (open circuit breaker, no rate tokens) are skipped.
- **Shares.** At each priority, a key reads at most ``ceil(limit / keys with due rows)`` of
  its due rows, one index range in due order (``DueTime``: rows without a due time first),
  so a claim reads about as many rows as it takes, however deep the backlogs.
- **The cut.** A key that filled its share may hold more. Rows of lower priorities than the
  highest such key, and rows of that priority ranked beyond the share, are then left for a
  next round — a claim never takes a row that an unread row should precede. Rounds repeat (in
  the same transaction, at most ``MAX_ROUNDS``) until the claim is full or nothing is left.
- **Locking.** Each key's range is read ``FOR UPDATE SKIP LOCKED``: rows another worker
  holds are passed over, so two claims at once take different rows rather than both reaching
  for the same ones. The rows picked are leased in the same statement; candidates not picked
  are let go when the claim's transaction commits, a few milliseconds later.

A channel that is rate-limited or probing is *capped*: the claim takes no more of its rows
than its gate allows, in the same order. SQLite (the embedded default, one worker) reads the
same order with plain queries per key; fairness between several workers is, like ``SKIP
LOCKED``, a PostgreSQL property.

``OUTBOX_FAIR_CLAIM=false`` takes the oldest due rows first whatever their site or priority
(the order before priorities existed): a diagnostic switch, and the benchmark's reference.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.db.models import F, Field, Q

from notifications import db
from notifications.models import Notification

# A claim that falls short because a key filled its share reads again, at most this often.
MAX_ROUNDS = 4
# The columns delivery reads from a claimed row. (Channels with per-target outcomes send a retry
# only to the targets still owed it, from ``resolved_targets``; webhooks carry the site id.)
CLAIM_FIELDS = (
    "notification_id",
    "source_site_id",
    "type",
    "priority",
    "list_name",
    "subject",
    "body",
    "type_data",
    "resolved_targets",
    "status",
    "retry_count",
    "channel_failures",
    "created_at",
    "requeued_at",
    "claimed_by",
    "claimed_until",
    # A row the site delivered itself is settled without a delivery (notifications.local_delivery).
    "delivered_locally_at",
    # A row that asks for acknowledgement carries its link (email, Teams, SMS) and SMS reply code.
    "asks_ack",
)
# Within a key, rows without a due time first, then by it: the claim index's order.
DUE_ORDER = F("next_attempt_at").asc(nulls_first=True)
PRIORITIES_DESCENDING = sorted(Notification.Priority.values, reverse=True)


@dataclass
class ClaimLimits:
    """What one claim may take: ``limit`` rows in all, none of the ``closed`` channels, no
    more of a ``capped`` channel than its cap."""

    limit: int
    closed: set[str] = field(default_factory=set)
    capped: dict[str, int] = field(default_factory=dict)

    def taken(self, rows: Iterable[Notification]) -> None:
        """Count ``rows`` against the limit and the caps (a cap used up closes its channel)."""
        for row in rows:
            self.limit -= 1
            if row.type in self.capped:
                self.capped[row.type] -= 1
                if self.capped[row.type] <= 0:
                    del self.capped[row.type]
                    self.closed.add(row.type)


def notifications_claim_in_order(
    *, limits: ClaimLimits, worker_id: str, now: datetime, until: datetime
) -> list[Notification]:
    """Lock and lease (``worker_id`` until ``until``) the first ``limits.limit`` due rows of the
    claim's order that no other worker holds, within the channels' caps; returns them in that
    order. Call it inside the claim's transaction (``db.read_in_index_order`` in effect)."""
    fair = settings.OUTBOX_FAIR_CLAIM
    if connection.vendor != "postgresql":
        return _claim_portable(limits=limits, worker_id=worker_id, now=now, until=until, fair=fair)
    claimed: list[Notification] = []
    for _ in range(MAX_ROUNDS):
        if limits.limit <= 0:
            break
        rows, more = _claim_round(limits=limits, worker_id=worker_id, now=now, until=until, fair=fair)
        claimed += rows
        limits.taken(rows)
        if not (more and rows):
            break
    return claimed


def _claim_round(
    *, limits: ClaimLimits, worker_id: str, now: datetime, until: datetime, fair: bool
) -> tuple[list[Notification], bool]:
    """One statement: the rows it leased, in order, and whether a key filled its share (so a
    next round may find more)."""
    capped = sorted(limits.capped)
    params = {
        "now": now,
        "limit": limits.limit,
        "worker": worker_id,
        "until": until,
        "closed": sorted(limits.closed),
        "capped": capped,
        "caps": [limits.capped[name] for name in capped],
    }
    rows = list(Notification.objects.raw(_claim_sql(fair=fair), params))
    # UPDATE … RETURNING gives no order: each row brings its place (extra columns of a raw
    # query land in the instance's __dict__, taken out again here).
    places = {row.pk: vars(row).pop("claim_order") for row in rows}
    more = bool(rows) and bool(vars(rows[0])["claim_more"])
    for row in rows:
        del vars(row)["claim_more"]
    rows.sort(key=lambda row: places[row.pk])
    return rows, more


# --- the PostgreSQL statements ---------------------------------------------------------------------


def _column(name: str) -> str:
    return connection.ops.quote_name(str(cast(Field, Notification._meta.get_field(name)).column))


def _table() -> str:
    return connection.ops.quote_name(Notification._meta.db_table)


def _open(alias: str) -> str:
    statuses = ", ".join(f"'{status}'" for status in Notification.NON_TERMINAL)
    return f"{alias}.{_column('status')} IN ({statuses})"


def _unleased(alias: str) -> str:
    """Open, under no live lease, and not held for a flood digest (notifications.suppression:
    a held row waits for its digest and is never claimed)."""
    until = f"{alias}.{_column('claimed_until')}"
    held = f"{alias}.{_column('held_for_digest')}"
    return f"{_open(alias)} AND ({until} IS NULL OR {until} < %(now)s) AND {held} IS NULL"


def _due(alias: str) -> str:
    """The due time of ``alias``'s row, written as the claim index's expression."""
    return db.DUE_TIME_SQL.replace("next_attempt_at", f"{alias}.{_column('next_attempt_at')}")


def _still_due(alias: str) -> str:
    """Due and unleased, written so that no index matches it (``IS NOT DISTINCT FROM``, the
    column rather than the index's expression): it re-checks rows found by their primary key,
    and with statistics from before a backlog, PostgreSQL would otherwise read the backlog
    through the claim index for every row it locks."""
    status = f"{alias}.{_column('status')}"
    until = f"{alias}.{_column('claimed_until')}"
    due = f"{alias}.{_column('next_attempt_at')}"
    statuses = " OR ".join(f"{status} IS NOT DISTINCT FROM '{value}'" for value in Notification.NON_TERMINAL)
    held = f"{alias}.{_column('held_for_digest')}"
    return (
        f"({statuses}) AND ({until} IS NULL OR {until} < %(now)s) AND ({due} IS NULL OR {due} <= %(now)s) "
        f"AND {held} IS NULL"
    )


def _of_key(alias: str, key: str) -> str:
    site, priority, channel = (f"{alias}.{_column(name)}" for name in db.CLAIM_KEY_COLUMNS)
    return f"{site} = {key}.s AND {priority} = {key}.p AND {channel} = {key}.t"


def _due_rows(key: str, limit: str) -> str:
    """The due, unleased rows of key ``key`` in due order, at most ``limit``, locked and
    skipping rows another worker holds (so that two claims at once read past each other's
    rows instead of both reading the same ones): one index range."""
    pk = _column("notification_id")
    return (
        f"SELECT n.{pk} AS id, {_due('n')} AS due FROM {_table()} AS n "
        f"WHERE {_of_key('n', key)} AND {_unleased('n')} AND {_due('n')} <= %(now)s "
        f"ORDER BY {_due('n')} LIMIT {limit} FOR UPDATE OF n SKIP LOCKED"
    )


def _first_due_row(key: str) -> str:
    """The first due, unleased row of key ``key``, if any: one probe of its range. (A LIMIT, not
    EXISTS: PostgreSQL turns an EXISTS into a join that reads every due row of every key.)"""
    return (
        f"SELECT 1 FROM {_table()} AS n WHERE {_of_key('n', key)} AND {_unleased('n')} "
        f"AND {_due('n')} <= %(now)s ORDER BY {_due('n')} LIMIT 1"
    )


def _candidates_fair() -> str:
    """``shares(p, m)``: each priority's share per key; ``cand``: each key's due rows up to its
    share (a LIMIT cannot vary with the key, so one branch per priority); ``cut``: the highest
    priority at which a key filled its share (capped channels aside), or NULL."""
    branches = " UNION ALL ".join(
        f"SELECT k.s, k.p, k.t, r.id, r.due FROM open_keys AS k CROSS JOIN LATERAL "
        f"({_due_rows('k', f'COALESCE((SELECT m FROM shares WHERE p = {value}), 0)')}) AS r WHERE k.p = {value}"
        for value in PRIORITIES_DESCENDING
    )
    return (
        f"firsts AS (SELECT k.p FROM open_keys AS k CROSS JOIN LATERAL ({_first_due_row('k')}) AS f), "
        "shares AS (SELECT p, CEIL(%(limit)s::numeric / count(*))::int AS m FROM firsts GROUP BY p), "
        f"cand AS ({branches}), "
        "filled AS (SELECT p, t, count(*) AS got FROM cand GROUP BY s, p, t), "
        "cut AS (SELECT max(f.p) AS p FROM filled AS f JOIN shares AS sh ON sh.p = f.p "
        "WHERE f.got >= sh.m AND f.t <> ALL(%(capped)s::text[])), "
        "ranked AS (SELECT c.id, c.p, c.t, c.due, "
        "row_number() OVER (PARTITION BY c.s, c.p ORDER BY c.due, c.id) AS site_rank FROM cand AS c), "
        "eligible AS (SELECT r.* FROM ranked AS r, cut WHERE cut.p IS NULL OR r.p > cut.p "
        "OR (r.p = cut.p AND r.site_rank <= (SELECT m FROM shares WHERE shares.p = cut.p)))"
    )


def _candidates_oldest() -> str:
    """The same names for the oldest-first order: every key's due rows up to the whole limit,
    ranked by due time alone; never a cut."""
    return (
        "cand AS (SELECT k.s, k.p, k.t, r.id, r.due FROM open_keys AS k "
        f"CROSS JOIN LATERAL ({_due_rows('k', '%(limit)s')}) AS r), "
        "cut AS (SELECT NULL::smallint AS p), "
        "eligible AS (SELECT c.id, c.p, c.t, c.due, 1 AS site_rank FROM cand AS c)"
    )


@cache
def _claim_sql(*, fair: bool) -> str:
    """The claim's statement (one round): keys, candidates (locked as they are read), the caps
    of capped channels, the pick in the claim's order and the lease, returning the leased rows
    with their place (``claim_order``) and whether a key filled its share (``claim_more``).
    Candidates read but not picked stay locked only until the claim's transaction ends."""
    table = _table()
    pk = _column("notification_id")
    order = "e.p DESC, e.site_rank, e.due, e.id" if fair else "e.due, e.id"
    assert Notification._meta.pk is not None
    ids_type = f"{Notification._meta.pk.db_type(connection)}[]"
    returned = ", ".join(f"n.{_column(name)}" for name in CLAIM_FIELDS if name not in ("claimed_by", "claimed_until"))
    return (
        f"WITH RECURSIVE {db.claim_keys_cte(_open('o'))}, "
        "open_keys AS (SELECT s, p, t FROM keys WHERE t <> ALL(%(closed)s::text[])), "
        f"{_candidates_fair() if fair else _candidates_oldest()}, "
        f"in_caps AS (SELECT e.*, row_number() OVER (PARTITION BY e.t ORDER BY {order}) AS type_rank "
        "FROM eligible AS e), "
        f"picked AS (SELECT e.id, row_number() OVER (ORDER BY {order}) AS ord FROM in_caps AS e "
        "LEFT JOIN unnest(%(capped)s::text[], %(caps)s::int[]) AS cap(t, n) ON cap.t = e.t "
        "WHERE cap.n IS NULL OR e.type_rank <= cap.n), "
        # One array, in the claim's order: the lease finds its rows by primary key whatever the
        # statistics say (joined to the picked rows, PostgreSQL read the whole primary key).
        "chosen AS (SELECT array_agg(id ORDER BY ord) AS ids FROM picked WHERE ord <= %(limit)s) "
        f"UPDATE {table} AS n SET {_column('claimed_by')} = %(worker)s, {_column('claimed_until')} = %(until)s "
        f"WHERE n.{pk} = ANY(CAST((SELECT ids FROM chosen) AS {ids_type})) AND {_still_due('n')} "
        f"RETURNING {returned}, n.{_column('next_attempt_at')}, "
        f"array_position((SELECT ids FROM chosen), n.{pk}) AS claim_order, "
        "(SELECT p FROM cut) IS NOT NULL AS claim_more"
    )


@cache
def _first_due_sql() -> str:
    """Per key, the due time of its first unleased row (NULL: due at once)."""
    return (
        f"WITH RECURSIVE {db.claim_keys_cte(_open('o'))} SELECT k.t, f.due FROM keys AS k CROSS JOIN LATERAL ("
        f"SELECT n.{_column('next_attempt_at')} AS due FROM {_table()} AS n WHERE {_of_key('n', 'k')} "
        f"AND {_unleased('n')} ORDER BY {_due('n')} LIMIT 1) AS f"
    )


@cache
def _due_exists_sql() -> str:
    return (
        f"WITH RECURSIVE {db.claim_keys_cte(_open('o'))} SELECT EXISTS (SELECT 1 FROM keys AS k "
        f"CROSS JOIN LATERAL ({_first_due_row('k')}) AS f)"
    )


# --- the portable form (SQLite) ----------------------------------------------------------------------


def unleased_q(now: datetime) -> Q:
    """Not terminal, under no live lease and not held for a flood digest: due once its next
    attempt time has come."""
    return (
        Q(status__in=Notification.NON_TERMINAL)
        & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        & Q(held_for_digest__isnull=True)
    )


def due_q(now: datetime) -> Q:
    """The rule for "due": not terminal, its next attempt time has come (or it has none: a
    Pending row created by hand counts as due, never as lost), and no live lease."""
    return unleased_q(now) & (Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True))


@dataclass(frozen=True)
class Candidate:
    """A due row as the order sees it; ``due`` None: due at once (before every dated row)."""

    pk: Any
    site: str
    priority: int
    channel: str
    due: datetime | None


def claim_order(
    candidates: Sequence[Candidate], *, limit: int, capped: Mapping[str, int] | None = None, fair: bool = True
) -> list[Candidate]:
    """The first ``limit`` of ``candidates`` in the claim's order (module docstring), taking no
    more of a capped channel than its cap. ``candidates`` must hold, for every key, its first
    ``limit`` due rows at least (then the answer is exact)."""
    ordered = _fair_order(candidates) if fair else sorted(candidates, key=_due_key)
    room = dict(capped or {})
    chosen: list[Candidate] = []
    for candidate in ordered:
        if len(chosen) == limit:
            break
        if candidate.channel in room:
            if room[candidate.channel] <= 0:
                continue
            room[candidate.channel] -= 1
        chosen.append(candidate)
    return chosen


def _due_key(candidate: Candidate) -> tuple[bool, Any, str]:
    """Rows without a due time first, then by it; ties by id (as the statement breaks them)."""
    return (candidate.due is not None, candidate.due, str(candidate.pk))


def _fair_order(candidates: Sequence[Candidate]) -> list[Candidate]:
    """By priority (most urgent first), then rank within the row's site at that priority, then
    due time."""
    by_site: dict[tuple[str, int], list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_site[(candidate.site, candidate.priority)].append(candidate)
    ranked = []
    for rows in by_site.values():
        ranked += [(-row.priority, rank, _due_key(row), row) for rank, row in enumerate(sorted(rows, key=_due_key))]
    ranked.sort(key=lambda entry: entry[:3])
    return [row for *_, row in ranked]


def _claim_portable(
    *, limits: ClaimLimits, worker_id: str, now: datetime, until: datetime, fair: bool
) -> list[Notification]:
    """The claim with plain queries: each key's first ``limit`` due rows, put in order in
    Python, leased with one UPDATE (SQLite serialises claims: nothing to skip)."""
    waiting = Notification.objects.filter(due_q(now)).exclude(type__in=limits.closed)
    keys = waiting.order_by().values_list(*db.CLAIM_KEY_COLUMNS).distinct()
    rows: dict[Any, Notification] = {}
    for site, priority, channel in keys:
        of_key = waiting.filter(source_site_id=site, priority=priority, type=channel).order_by(DUE_ORDER, "pk")
        rows.update((row.pk, row) for row in of_key.only(*CLAIM_FIELDS, "next_attempt_at")[: limits.limit])
    candidates = [
        Candidate(pk=row.pk, site=row.source_site_id, priority=row.priority, channel=row.type, due=row.next_attempt_at)
        for row in rows.values()
    ]
    chosen = [rows[c.pk] for c in claim_order(candidates, limit=limits.limit, capped=limits.capped, fair=fair)]
    if chosen:
        Notification.objects.filter(db.pk_in([row.pk for row in chosen])).update(
            claimed_by=worker_id, claimed_until=until
        )
    limits.taken(chosen)
    return chosen


# --- due times -----------------------------------------------------------------------------------------


def first_due_by_channel(*, now: datetime) -> dict[str, datetime]:
    """Per channel with waiting rows (open, unleased), when its first one is due (``now`` for
    one due already). On PostgreSQL one probe of the claim index per key."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_first_due_sql(), {"now": now})
            found = list(cursor.fetchall())
    else:
        waiting = Notification.objects.filter(unleased_q(now))
        found = []
        for channel in waiting.order_by().values_list("type", flat=True).distinct():
            first = waiting.filter(type=channel).order_by(DUE_ORDER).values_list("next_attempt_at", flat=True)[:1]
            found.append((channel, first[0]))
    firsts: dict[str, datetime] = {}
    for channel, due in found:
        when = now if due is None or due < now else due
        firsts[channel] = min(firsts.get(channel, when), when)
    return firsts


def notifications_due_exist(*, now: datetime) -> bool:
    """Whether any row is due and unleased now (whatever its channel's gate)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_due_exists_sql(), {"now": now})
            return bool(cursor.fetchone()[0])
    return Notification.objects.filter(due_q(now)).exists()
