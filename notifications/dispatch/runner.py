"""The dispatch pass (docs/architecture.md, "How a notification is delivered"): claim due
notifications, deliver them on a thread pool, finish them.

The shape is the plain one: a loop that claims batches with a conditional update
(notifications.dispatch.claim), a ``concurrent.futures.ThreadPoolExecutor`` of
``OUTBOX_CONCURRENCY`` threads for the network calls, every adapter blocking with a timeout on
each call, and one function that records every result (notifications.dispatch.finish).

* Lists are resolved when a batch is claimed, at delivery time; every attempt is recorded
  before the network call. Each type's adapter opens one session for the pass, which reuses
  connections (SMTP, HTTP) across its deliveries.
* The next batch is claimed while the threads still have about one delivery each to do, so
  they never wait for a claim or for the slowest deliveries of a batch.
* A claim that takes all it asked for calls the pass's ``backlog`` hook (a django-q2 task asks
  for another dispatch task there), so that idle workers join a backlog at once.
* No delivery starts after the pass's time budget, after a stop request, close to the end of
  its batch's lease (another worker may then claim the row), or on a channel that has just
  failed often enough to open its breaker; those rows are released, due again, uncharged. No
  wait of a delivery outlives its lease (:func:`~notifications.adapters.base.delivery_deadline`).
"""

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from notifications.adapters import adapter_for
from notifications.adapters.base import Adapter, DeliveryError, DeliveryResult, Session, delivery_deadline
from notifications.clock import DatabaseClock, database_clock, database_now
from notifications.counts import counts_fold
from notifications.dispatch.claim import Claim, notifications_claim_due, notifications_due_exist, notifications_expire
from notifications.dispatch.finish import (
    DeliveryOutcome,
    Finish,
    FinishReport,
    delivery_attempts_record,
    notifications_finish,
)
from notifications.escalation import escalations_next_due, notifications_escalate_due
from notifications.health import Channel, dispatch_channels
from notifications.local_delivery import notifications_settle_delivered_locally
from notifications.models import Notification
from notifications.policies import delivery_policy_default
from notifications.suppression import digests_flush
from notifications.vocabulary import CHANNEL_FAILURES, HEALTHY_FAILURES, FailureClass, FailureCode

# The dispatcher logs under one name, whichever of its modules writes.
logger = logging.getLogger(__package__)

# While the database is briefly unavailable (a failover, a restart), results of deliveries that
# already happened are held and re-applied: dropping them would let the lease expire and the
# message be sent a second time. Bounded well inside the lease.
APPLY_RETRY_SECONDS = 0.5
# Results that complete within this window of each other are applied together: one
# transaction (and one fsync) for many results, while the crash window stays short.
APPLY_WINDOW_SECONDS = 0.02
# A claim takes no more rows than the pass's threads can start within about this long at the
# pace deliveries have been taking (and never more than the batch size): rows a worker has
# claimed but cannot start soon are rows the other workers cannot take. Against a slow relay
# (50 ms a message, 16 threads) a claim is about 80 rows, so that when a backlog runs out no
# worker is left with hundreds of rows while the others idle; against a fast one it is the
# whole batch, whose fixed cost (claim, attempts, clock) is then shared by the most rows.
CLAIM_HORIZON_SECONDS = 0.25


@dataclass
class PassReport:
    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    parked: int = 0
    released: int = 0
    lost: int = 0  # finished by someone else meanwhile (lease expired and re-claimed, …)
    expired: int = 0  # parked for their age before the pass claimed anything
    escalated: int = 0  # escalation steps taken (children created) before the pass's claims
    batches: int = 0
    seconds: float = 0.0
    more_due: bool = False  # stopped by the time budget or a stop request with rows still due

    def add(self, finished: FinishReport) -> None:
        for name in ("delivered", "retrying", "parked", "released", "lost"):
            setattr(self, name, getattr(self, name) + getattr(finished, name))

    def __str__(self) -> str:
        return (
            f"claimed {self.claimed}, delivered {self.delivered}, retrying {self.retrying}, "
            f"parked {self.parked}, released {self.released}"
            + (f", expired {self.expired}" if self.expired else "")
            + (f", escalated {self.escalated}" if self.escalated else "")
            + f" in {self.seconds:.2f} s"
        )


def notification_deliver(*, notification: Notification, targets: list[str], session: Session) -> DeliveryOutcome:
    """Deliver one notification through an open adapter session, on this thread; never raises
    for delivery failures (they are returned as ``DeliveryOutcome.error``)."""
    clock = time.monotonic()
    result: DeliveryResult | None = None
    error: DeliveryError | None = None
    try:
        result = session.deliver(notification, targets)
    except DeliveryError as exc:
        error = exc
    except Exception as exc:  # a bug in an adapter must not kill the pass or lose the row
        logger.exception(
            "adapter crashed delivering %s",
            notification.pk,
            extra={"notification_id": str(notification.pk), "channel": notification.type, "outcome": "crashed"},
        )
        error = DeliveryError(f"Adapter error: {type(exc).__name__}: {exc}", failure_class=FailureClass.UNKNOWN)
    seconds = time.monotonic() - clock
    return DeliveryOutcome(result=result, error=error, duration_ms=int(seconds * 1000), adapter_called=True)


class _TypeContext:
    """Per pass and type: the adapter, its channel (policy and health) and an open session (or
    why not)."""

    def __init__(self, type_name: str, channel: Channel | None) -> None:
        self.adapter: Adapter | None = None
        self.session: Session | None = None
        self.error: DeliveryError | None = None
        self.channel = channel or Channel(
            name=type_name, endpoint=None, policy=delivery_policy_default(channel=type_name)
        )
        try:
            self.adapter = adapter_for(type_name)
        except KeyError:
            # No adapter: nothing can deliver this type, now or later.
            self.error = DeliveryError(
                f"No adapter is registered for type {type_name!r}.", failure_class=FailureClass.CONFIGURATION
            )
            return
        try:
            self.session = self.adapter.open_session()
        except DeliveryError as exc:
            self.error = exc

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


@dataclass
class _Streaks:
    """Per type: channel failures in a row, as the deliveries of a pass complete."""

    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def failing(self, type_name: str, *, threshold: int) -> bool:
        """The type has failed often enough in a row to open its channel."""
        with self.lock:
            return self.counts.get(type_name, 0) >= threshold

    def record(self, type_name: str, outcome: DeliveryOutcome) -> None:
        failure = outcome.error.failure_class if outcome.error is not None else None
        with self.lock:
            if failure in CHANNEL_FAILURES:
                self.counts[type_name] = self.counts.get(type_name, 0) + 1
            elif failure is None or failure in HEALTHY_FAILURES:
                self.counts[type_name] = 0


@dataclass
class _Pace:
    """How long this pass's deliveries take (a moving average), for the size of its claims."""

    seconds: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, duration_ms: int) -> None:
        seconds = max(duration_ms, 1) / 1000
        with self.lock:
            self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    def claim_size(self, *, batch_size: int, concurrency: int) -> int:
        """The rows to claim next: the batch size until a delivery has been timed, then what
        ``concurrency`` threads start within CLAIM_HORIZON_SECONDS, between ``concurrency``
        and ``batch_size``."""
        if self.seconds is None:
            return batch_size
        rounds = max(1, int(CLAIM_HORIZON_SECONDS / self.seconds))
        return max(1, min(batch_size, max(concurrency, concurrency * rounds)))


class _Results:
    """The deliveries' results as they complete (each future's done callback), collected by the
    pass thread in groups: the first result wakes it, then it sleeps out the window unless
    every delivery in flight completes first — it is never woken once per result. (A queue
    woke it for every result: measured, about 11 µs of thread hand-overs a delivery.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: list[Future[Finish]] = []
        self._some = threading.Event()  # a result waits to be collected
        self._all = threading.Event()  # every delivery in flight has completed
        self._all.set()
        self._outstanding = 0  # submitted and not yet collected

    def watch(self, future: "Future[Finish]") -> None:
        with self._lock:
            self._outstanding += 1
            self._all.clear()
        future.add_done_callback(self._completed)

    def _completed(self, future: "Future[Finish]") -> None:
        with self._lock:
            self._done.append(future)
            if len(self._done) == self._outstanding:
                self._all.set()
            self._some.set()

    def collect(self, window: float) -> list["Future[Finish]"]:
        """Wait for a result, then up to ``window`` seconds for the others in flight; what
        completed."""
        self._some.wait()
        self._all.wait(window)
        with self._lock:
            done, self._done = self._done, []
            self._outstanding -= len(done)
            self._some.clear()
            if self._outstanding:
                self._all.clear()
        return done


@dataclass(eq=False)  # a batch is itself, whatever its fields hold (a key of the finish)
class _Batch:
    """One claimed batch: its rows' attempts, when its deliveries must start and end (from its
    lease), and how many of them are queued or running."""

    claim: Claim
    clock: DatabaseClock
    attempts: dict[Any, Any]
    contexts: dict[str, _TypeContext]
    lease_deadline: float  # time.monotonic() when the lease ends
    start_by: float  # no delivery of the batch starts after this
    lease_margin: float  # left of the lease when a delivery must be over: time to record it
    pending: int = 0

    def finish(self, row: Notification, outcome: DeliveryOutcome) -> Finish:
        return Finish(
            notification=row,
            attempt=self.attempts[row.pk],
            outcome=outcome,
            channel=self.contexts[row.type].channel,
            probe=row.pk in self.claim.probes,
        )


class _Pass:
    """One dispatch pass: claims batches, hands their deliveries to the pool and finishes
    their results, until nothing is due, the budget is spent or a stop is requested."""

    def __init__(
        self,
        *,
        worker_id: str,
        stop: threading.Event,
        deadline: float,
        batch_size: int,
        concurrency: int,
        report: PassReport,
        progress: Callable[[PassReport], None] | None,
        backlog: Callable[[], object] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.stop = stop
        self.deadline = deadline
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.report = report
        self.progress = progress
        self.backlog = backlog
        self.channels = dispatch_channels()
        self.contexts: dict[str, _TypeContext] = {}
        # Shared by the pass's batches: per type, channel failures in a row as deliveries complete.
        self.streaks = _Streaks()
        self.pace = _Pace()
        self.in_flight: dict[Future[Finish], _Batch] = {}
        self.results = _Results()
        self.drained = False  # a claim found fewer rows than asked: nothing more is due (or claimable)
        # Why the pass stops early: a delivery raised (a bug), or the database failed at a claim.
        # Nothing more starts, the deliveries under way are recorded, then it is raised.
        self.halt: BaseException | None = None

    def run(self, pool: ThreadPoolExecutor) -> None:
        """Claim, deliver and finish until done. A delivery that raised (a bug: adapters'
        failures are results) stops the pass: nothing more starts, the deliveries under way are
        recorded (the rows not started released), and then it is raised. So does a database
        failure while claiming (a restart, a failover) when deliveries are under way: their
        messages have gone out, and their results are recorded once the database is back
        (:meth:`_finish_durably`), so that they are not sent again when their lease ends."""
        while True:
            # The next batch is claimed while the threads still have about one delivery each
            # to do, so they never wait for a claim (or for a batch's last, slowest
            # deliveries): a relay's latency, not the batch rhythm, bounds the pace.
            if self._claiming() and len(self.in_flight) <= self.concurrency:
                try:
                    self._claim(pool)
                except (OperationalError, InterfaceError) as error:
                    if not self.in_flight:
                        raise
                    logger.warning("database unavailable while claiming; recording the deliveries under way first")
                    connection.close()
                    self.halt = error
            elif self.in_flight:
                self._collect()
            else:
                break
        if self.halt is not None:
            raise self.halt

    def close(self) -> None:
        for context in self.contexts.values():
            context.close()

    def _claiming(self) -> bool:
        return not (self.drained or self.halt or self.stop.is_set()) and time.monotonic() < self.deadline

    def _claim(self, pool: ThreadPoolExecutor) -> None:
        # The database clock, read once per batch: one query, not one per result.
        clock = database_clock()
        self._escalate(clock)
        limit = self.pace.claim_size(batch_size=self.batch_size, concurrency=self.concurrency)
        claim = notifications_claim_due(worker_id=self.worker_id, limit=limit, now=clock.now(), channels=self.channels)
        if len(claim.rows) < limit:
            self.drained = True  # the next trigger, wake-up or sweep takes what comes later
        else:
            self._backlog_found()
        if not claim.rows:
            return
        self.report.batches += 1
        self.report.claimed += len(claim.rows)
        self._start(claim, clock, pool)

    def _escalate(self, clock: DatabaseClock) -> None:
        """Take the escalation steps that are due (notifications.escalation) before a claim, so
        that the claim takes their children: at every claim, not only at the pass's start, so
        that a step falling due during a long pass (a backlog) waits for a batch, not the pass."""
        due = escalations_next_due()
        if due is not None and due <= clock.now():
            self.report.escalated += notifications_escalate_due(now=clock.now()).created

    def _backlog_found(self) -> None:
        """A claim took all it asked for: more may be due than this pass can take. Others are
        asked to join now, not when this pass ends (a backlog is drained by every worker)."""
        if self.backlog is None:
            return
        try:
            self.backlog()
        except Exception:
            # Asking for help must never stop the deliveries: the pass goes on alone.
            logger.exception("could not ask other workers to join a backlog")

    def _start(self, claim: Claim, clock: DatabaseClock, pool: ThreadPoolExecutor) -> None:
        """Settle the rows their site delivered itself, resolve, record the attempts, finish the
        rows that cannot be delivered, and hand the deliveries of the rest to ``pool``."""
        if not self._settle_delivered_locally(claim, clock):
            return
        lease = settings.OUTBOX_LEASE_SECONDS
        lease_deadline = time.monotonic() + lease
        for row in claim.rows:
            if row.type not in self.contexts:
                self.contexts[row.type] = _TypeContext(row.type, self.channels.get(row.type))
        plans = self._plan(claim.rows)
        attempts = delivery_attempts_record(
            worker_id=self.worker_id, notifications=[row for row, _, _ in plans], now=clock.now()
        )
        # Stop starting deliveries well before the lease runs out, so a slow batch never
        # overlaps a re-claim by another worker; the margin covers one delivery's network calls.
        timeouts = [context.session.timeout for context in self.contexts.values() if context.session is not None]
        start_margin = min(max(timeouts, default=10) * 4, lease / 2)
        batch = _Batch(
            claim=claim,
            clock=clock,
            attempts=attempts,
            contexts=self.contexts,
            lease_deadline=lease_deadline,
            start_by=min(self.deadline, lease_deadline - start_margin),
            lease_margin=min(10.0, lease / 10),
        )
        early: list[Finish] = []
        for row, targets, error in plans:
            if error is not None:
                early.append(batch.finish(row, DeliveryOutcome(error=error)))
                continue
            future = pool.submit(self._deliver, batch, row, targets)
            batch.pending += 1
            self.in_flight[future] = batch
            self.results.watch(future)
        if early:
            self._finish_durably(batch, early)

    def _settle_delivered_locally(self, claim: Claim, clock: DatabaseClock) -> bool:
        """Finish the claimed rows their site delivered itself (unless their list resends them),
        without an attempt, and leave the others in ``claim``; whether any are left."""
        settled = notifications_settle_delivered_locally(worker_id=self.worker_id, rows=claim.rows, now=clock.now())
        if settled:
            done = {row.pk for row in settled}
            claim.rows = [row for row in claim.rows if row.pk not in done]
            self.report.delivered += len(settled)
        return bool(claim.rows)

    def _plan(self, rows: list[Notification]) -> list[tuple[Notification, list[str], DeliveryError | None]]:
        """Each row with its targets, resolved now (one query per type), or the error that
        stops it before delivery."""
        plans: list[tuple[Notification, list[str], DeliveryError | None]] = []
        by_type: dict[str, list[Notification]] = {}
        for row in rows:
            by_type.setdefault(row.type, []).append(row)
        for type_name, typed_rows in by_type.items():
            context = self.contexts[type_name]
            resolved: dict[str, list[str]] = {}
            if context.error is None and context.adapter is not None:
                resolved = context.adapter.resolve_targets(list_names={row.list_name for row in typed_rows})
            plans += [(row, *_targets_or_error(row, context, resolved)) for row in typed_rows]
        return plans

    def _deliver(self, batch: _Batch, row: Notification, targets: list[str]) -> Finish:
        """On a pool thread: deliver one row, unless it must not start now (never a database
        query here: the result is recorded by the pass's own thread)."""
        context = self.contexts[row.type]
        assert context.session is not None, "rows without a session are finished before delivery"
        if not self._may_start(batch, row, context.channel):
            return batch.finish(row, DeliveryOutcome(started=False))
        # No wait of the adapter's may outlive the claim: another worker would send again.
        with delivery_deadline(batch.lease_deadline - batch.lease_margin):
            outcome = notification_deliver(notification=row, targets=targets, session=context.session)
        if outcome.adapter_called:
            self.pace.observe(outcome.duration_ms)
        self.streaks.record(row.type, outcome)
        return batch.finish(row, outcome)

    def _may_start(self, batch: _Batch, row: Notification, channel: Channel) -> bool:
        # An open channel takes no attempts but its probe, and neither does one that has just
        # failed often enough to open (its results may not be recorded yet): rows wait.
        if row.pk not in batch.claim.probes and (
            channel.halted or self.streaks.failing(row.type, threshold=channel.policy.breaker_threshold)
        ):
            return False
        return not (self.halt or self.stop.is_set()) and time.monotonic() < batch.start_by

    def _collect(self) -> None:
        """Wait until a delivery completes, then finish every delivery that completed meanwhile
        (within APPLY_WINDOW_SECONDS), each batch's in one transaction: a crash then
        re-delivers little more than what was in flight, and finishing stays cheap. A delivery
        that raised is kept as the pass's halt (:meth:`run`); its row stays claimed until its
        lease ends."""
        by_batch: dict[_Batch, list[Finish]] = {}
        for future in self.results.collect(APPLY_WINDOW_SECONDS):
            batch = self.in_flight.pop(future)
            batch.pending -= 1
            error = future.exception()
            if error is None:
                by_batch.setdefault(batch, []).append(future.result())
            elif self.halt is None:
                self.halt = error
            else:
                logger.error("another delivery raised after the first", exc_info=error)
        for batch, results in by_batch.items():
            self._finish_durably(batch, results)
        if self.progress and any(not batch.pending for batch in by_batch):
            self.progress(self.report)

    def _finish_durably(self, batch: _Batch, outcomes: list[Finish]) -> None:
        deadline = time.monotonic() + settings.OUTBOX_LEASE_SECONDS / 2
        while True:
            try:
                finished = notifications_finish(worker_id=self.worker_id, outcomes=outcomes, now=batch.clock.now())
            except (OperationalError, InterfaceError):
                if time.monotonic() > deadline:
                    raise
                logger.warning("database unavailable while recording %d results; retrying", len(outcomes))
                connection.close()
                time.sleep(APPLY_RETRY_SECONDS)
            else:
                self.report.add(finished)
                return


def _targets_or_error(
    row: Notification, context: _TypeContext, resolved: dict[str, list[str]]
) -> tuple[list[str], DeliveryError | None]:
    """The row's targets, or why it cannot be delivered now."""
    if context.error is not None:
        return [], context.error
    if row.list_name not in resolved:
        # An unknown list cannot be guessed: fail closed.
        error = f"Unknown notification list {row.list_name!r}."
        return [], DeliveryError(error, failure_class=FailureClass.CONFIGURATION, code=FailureCode.UNKNOWN_LIST)
    if not resolved[row.list_name]:
        error = f"Notification list {row.list_name!r} has no {row.type} recipients."
        return [], DeliveryError(error, failure_class=FailureClass.CONFIGURATION, code=FailureCode.NO_RECIPIENTS)
    return resolved[row.list_name], None


_settled = threading.Lock()
_settled_done = False


def dispatcher_process_settle() -> bool:
    """Once per process that dispatches for a long time (``manage.py dispatch``, a django-q2
    worker): hand every object alive now — modules, classes, Django's set-up — to the
    garbage collector's permanent generation (``gc.freeze()``), so that its collections no
    longer walk them. A pass allocates and frees thousands of objects per batch, and each full
    collection walked every object of the start-up again (docs/performance.md). Objects still
    die by reference counting as before; only cycles that exist at this moment are never
    collected. Returns True the first time, False after."""
    global _settled_done
    with _settled:
        if _settled_done:
            return False
        gc.freeze()
        _settled_done = True
        return True


def dispatch_pass(
    *,
    worker_id: str,
    time_budget: float,
    stop: threading.Event | None = None,
    batch_size: int | None = None,
    concurrency: int | None = None,
    progress: Callable[[PassReport], None] | None = None,
    backlog: Callable[[], object] | None = None,
) -> PassReport:
    """Expire rows past their channel's maximum age, then claim and deliver batches until
    nothing is due (or claimable), ``time_budget`` seconds have passed, or ``stop`` is set;
    before each claim, take the escalation steps that are due (notifications.escalation).
    Returns a :class:`PassReport`.

    ``backlog``, if given, is called after every claim that took as many rows as it asked for
    (more may be due than this pass can take): a django-q2 task asks for another dispatch task
    there, so that idle workers join at once. Its failures are logged, never raised.

    No delivery starts after the budget (or after a batch's lease is close to expiry, or after
    its channel opened); deliveries already started finish, and rows not started are released
    to be due again.
    """
    concurrency = concurrency or settings.OUTBOX_CONCURRENCY
    started = time.monotonic()
    report = PassReport()
    run = _Pass(
        worker_id=worker_id,
        stop=stop or threading.Event(),
        deadline=started + time_budget,
        batch_size=batch_size or settings.OUTBOX_BATCH_SIZE,
        concurrency=concurrency,
        report=report,
        progress=progress,
        backlog=backlog,
    )
    # Flood digests whose window has ended: made before the claim, so that they go out in this
    # pass (notifications.suppression).
    digests_flush()
    report.expired = notifications_expire(channels=run.channels)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="deliver")
    try:
        run.run(pool)
        if not run.drained:  # stopped by the budget or a stop request
            report.more_due = notifications_due_exist(now=database_now())
    except BaseException:
        # Deliveries only queued are dropped rather than made: their results could not be
        # recorded, and their rows are due again when their lease ends.
        pool.shutdown(cancel_futures=True)
        raise
    finally:
        pool.shutdown()
        run.close()
    counts_fold()  # the pass's status changes, summed per key (notifications.counts)
    report.seconds = time.monotonic() - started
    return report
