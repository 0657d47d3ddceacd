"""manage.py dispatch — deliver due notifications outside django-q2 (or beside it).

--once: passes until nothing is due, then exit. Default: keep dispatching; when nothing is
due, wait OUTBOX_DISPATCH_INTERVAL seconds. SIGTERM or SIGINT stops it gracefully: deliveries
already started finish and are recorded, the rest of the batch is released at once.
"""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError, connection

from notifications.dispatch import dispatch_pass, worker_id_new


class Command(BaseCommand):
    help = "Deliver due notifications (loop until SIGTERM, or --once)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Exit when nothing is due.")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows claimed per batch.")
        parser.add_argument("--concurrency", type=int, default=None, help="Delivery threads.")
        parser.add_argument("--pass-seconds", type=float, default=60.0,
                            help="Time budget of one pass (claims stop after it).")  # fmt: skip

    def handle(self, *args, once, batch_size, concurrency, pass_seconds, **options):
        self.verbosity = options["verbosity"]
        self.stop = threading.Event()
        self.install_signal_handlers()
        self.options = {"batch_size": batch_size, "concurrency": concurrency, "time_budget": pass_seconds}
        self.totals = {"delivered": 0, "retrying": 0, "parked": 0}
        if once:
            self.run_until_idle()
        else:
            self.run_forever()
        self.stdout.write(
            f"dispatch finished: delivered {self.totals['delivered']}, retrying {self.totals['retrying']}, "
            f"parked {self.totals['parked']}"
        )

    def install_signal_handlers(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)

    def request_stop(self, signum, frame):
        # Set from another thread: the handler may interrupt this thread while it holds the
        # event's lock inside Event.wait(), and setting the event here would deadlock.
        threading.Thread(target=self._stop_now, daemon=True).start()

    def _stop_now(self):
        self.stderr.write("stopping: finishing deliveries in flight")
        self.stop.set()

    def run_pass(self):
        report = dispatch_pass(worker_id=worker_id_new(), stop=self.stop, progress=self.progress, **self.options)
        for key in self.totals:
            self.totals[key] += getattr(report, key)
        if report.claimed:
            self.stdout.write(f"pass: {report}")
        return report

    def progress(self, report):
        if self.verbosity >= 2:
            self.stdout.write(f"  batch {report.batches}: {report}")

    def run_until_idle(self):
        while not self.stop.is_set():
            report = self.run_pass()
            if report.claimed == 0 and not report.more_due:
                return

    def run_forever(self):
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
                self.stop.wait(settings.OUTBOX_DISPATCH_INTERVAL)
