"""manage.py serve_metrics — export this host's delivery counters on a host without a web server.

``GET /metrics`` of a web server sums the counters and histograms of every Outbox process of
its host (the files in PROMETHEUS_MULTIPROC_DIR) and adds the database gauges. A host that
runs only workers has no web server: this command serves its counters and histograms alone
(the gauges come from any web server), with the same access rule — a direct loopback client,
or a bearer OUTBOX_METRICS_TOKEN. SIGTERM or SIGINT stops it.
"""

import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from notifications import metrics
from notifications.metrics_files import MetricsFilesCollector


class Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, b"Not found: GET /metrics.\n", "text/plain; charset=utf-8")
            return
        refused = metrics.access_refusal(
            authorization=self.headers.get("Authorization", ""),
            remote_addr=self.client_address[0],
            relayed=any(self.headers.get(name) for name in ("X-Forwarded-For", "X-Real-IP", "Forwarded")),
        )
        if refused is not None:
            extra = {"WWW-Authenticate": 'Bearer realm="metrics"'} if refused == 401 else {}
            self._answer(refused, metrics.REFUSALS[refused].encode(), "text/plain; charset=utf-8", extra)
            return
        self._answer(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def _answer(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not worth a log line each


class Command(BaseCommand):
    help = "Serve this host's delivery counters at GET /metrics (for hosts that run only workers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:9464", help="HOST:PORT to listen on (127.0.0.1:9464).")

    def handle(self, *args: Any, bind: str, **options: Any) -> None:
        host, _, port = bind.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CommandError(f"--bind must be HOST:PORT (e.g. 127.0.0.1:9464), got {bind!r}")
        if not metrics.MULTIPROCESS:
            raise CommandError("PROMETHEUS_MULTIPROC_DIR is not set: there are no counters of other processes to serve")
        registry = CollectorRegistry(auto_describe=False)
        MetricsFilesCollector(registry, directory=os.environ["PROMETHEUS_MULTIPROC_DIR"])
        handler = type("MetricsHandler", (Handler,), {"registry": registry})
        try:
            server = ThreadingHTTPServer((host.strip("[]"), int(port)), handler)
        except OSError as exc:
            raise CommandError(f"cannot listen on {bind}: {exc}") from exc

        def stop(signum: int, frame: FrameType | None) -> None:
            # shutdown() waits for serve_forever to return: call it from another thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
        self.stdout.write(
            f"serving the counters in {os.environ['PROMETHEUS_MULTIPROC_DIR']} at http://{bind}/metrics", ending="\n"
        )
        self.stdout.flush()
        server.serve_forever()
        server.server_close()
