"""manage.py dispatch — deliver due notifications outside django-q2 (or beside it).

--once: passes until nothing is due, then exit. Default: keep dispatching; when nothing is
due, wait until the next due time, at most OUTBOX_DISPATCH_INTERVAL seconds. SIGTERM or SIGINT stops it gracefully: deliveries
already started finish and are recorded, the rest of the batch is released at once.
"""

import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import InterfaceError, OperationalError, connection

from notifications.clock import database_now
from notifications.dispatch.claim import dispatch_wake_at, worker_id_new
from notifications.dispatch.runner import PassReport, dispatch_pass, dispatcher_process_settle
from notifications.dispatch.wait import IDLE_PAUSE_SECONDS


class Command(BaseCommand):
    help = "Deliver due notifications (loop until SIGTERM, or --once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Exit when nothing is due.")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows claimed per batch.")
        parser.add_argument("--concurrency", type=int, default=None, help="Delivery threads.")
        parser.add_argument(
            "--pass-seconds", type=float, default=60.0, help="Time budget of one pass (claims stop after it)."
        )

    def handle(
        self,
        *args: Any,
        once: bool,
        batch_size: int | None,
        concurrency: int | None,
        pass_seconds: float,
        **options: Any,
    ) -> None:
        self.verbosity = options["verbosity"]
        dispatcher_process_settle()  # start-up done: the garbage collector leaves it alone
        self.stop = threading.Event()
        self.install_signal_handlers()
        self.batch_size, self.concurrency, self.pass_seconds = batch_size, concurrency, pass_seconds
        self.totals = {"delivered": 0, "retrying": 0, "parked": 0}
        if once:
            self.run_until_idle()
        else:
            self.run_forever()
        self.stdout.write(
            f"dispatch finished: delivered {self.totals['delivered']}, retrying {self.totals['retrying']}, "
            f"parked {self.totals['parked']}"
        )

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        # Set from another thread: the handler may interrupt this thread while it holds the
        # event's lock inside Event.wait(), and setting the event here would deadlock.
        threading.Thread(target=self._stop_now, daemon=True).start()

    def _stop_now(self) -> None:
        self.stderr.write("stopping: finishing deliveries in flight")
        self.stop.set()

    def run_pass(self) -> PassReport:
        report = dispatch_pass(
            worker_id=worker_id_new(),
            time_budget=self.pass_seconds,
            batch_size=self.batch_size,
            concurrency=self.concurrency,
            stop=self.stop,
            progress=self.progress,
        )
        for key in self.totals:
            self.totals[key] += getattr(report, key)
        if report.claimed:
            self.stdout.write(f"pass: {report}")
        return report

    def progress(self, report: PassReport) -> None:
        if self.verbosity >= 2:
            self.stdout.write(f"  batch {report.batches}: {report}")

    def run_until_idle(self) -> None:
        while not self.stop.is_set():
            report = self.run_pass()
            if report.claimed == 0 and not report.more_due:
                return

    def run_forever(self) -> None:
        while not self.stop.is_set():
            try:
                report = self.run_pass()
            except (OperationalError, InterfaceError) as exc:
                # The database restarts or fails over: wait and carry on; claimed rows whose
                # results could not be recorded become due again when their lease expires.
                self.stderr.write(f"database unavailable ({exc.__class__.__name__}); retrying shortly")
                connection.close()
                self.stop.wait(settings.OUTBOX_DISPATCH_INTERVAL)
                continue
            if report.claimed == 0 and not report.more_due:
                self.stop.wait(self.idle_seconds())

    def idle_seconds(self) -> float:
        """How long to wait when nothing could be claimed: until the next due time (a retry,
        a probe, a token), at most OUTBOX_DISPATCH_INTERVAL."""
        try:
            now = database_now()
            wake = dispatch_wake_at(now=now)
        except (OperationalError, InterfaceError):
            connection.close()  # the next pass reports the database's trouble
            return settings.OUTBOX_DISPATCH_INTERVAL
        if wake is None:
            return settings.OUTBOX_DISPATCH_INTERVAL
        return max(IDLE_PAUSE_SECONDS, min(settings.OUTBOX_DISPATCH_INTERVAL, (wake - now).total_seconds()))
