"""The web server's configuration. gunicorn reads this file from the directory it starts in
(the project root), so ``gunicorn`` with no arguments serves Outbox as production should;
command-line options (``--bind``, ``--workers``) override what is set here.

Worker class: gunicorn's own asyncio ASGI worker, running Django's ASGI application. It parses
HTTP on an event loop and hands a request to Django only once its headers and its whole body
have arrived, so clients that send slowly (by accident or on purpose) cost a few kilobytes each,
not a worker or a thread: ``/healthz`` and real clients keep being served. The synchronous
workers (``sync``, ``gthread``) read each request in a worker thread, and a handful of
dribbling clients take the server down. See README, "Production".
"""

import os
from pathlib import Path

wsgi_app = "outbox_project.asgi:application"
worker_class = "asgi"
# Django's ASGI handler implements no lifespan protocol; do not probe for it at every start.
asgi_lifespan = "off"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
bind = [os.environ.get("OUTBOX_BIND", "127.0.0.1:8000")]
# A request's headers and body must arrive within this many seconds (the ASGI worker bounds
# its wait for body data by it), and a worker that stops answering its master is replaced.
timeout = 30
graceful_timeout = 20
keepalive = 5
# Open connections per worker, slow ones included; beyond it new connections wait in the
# listen backlog.
worker_connections = 1000

# Django runs each ASGI request in a thread of its own, so per-thread persistent database
# connections would be opened and dropped per request; a connection pool per worker process
# is used instead (PostgreSQL; see outbox_project/settings.py).
os.environ.setdefault("OUTBOX_DATABASE_POOL", "true")

# Metrics (notifications/metrics.py): every process of this host, web and worker (manage.py sets
# the same default), writes its counters to files in one directory; a scrape sums them.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(Path(__file__).resolve().parent / "var" / "metrics"))


# Which of the project's applications each kind of worker can serve.
APPLICATIONS = {"asgi": "outbox_project.asgi", "wsgi": "outbox_project.wsgi"}


def on_starting(server: object) -> None:
    """Refuse, in one line, to serve one of the project's applications with a worker that cannot:
    ``gunicorn outbox_project.wsgi`` (the command most guides show) would run the WSGI
    application in the ASGI worker configured here and answer 500 to every request. A WSGI
    worker (``-k gthread``/``sync``) with the WSGI application is fine, for whoever wants one."""
    from gunicorn.workers.gasgi import ASGIWorker

    app_uri = server.app.app_uri or ""  # type: ignore[attr-defined]  # the positional APP_MODULE, or wsgi_app
    module = app_uri.partition(":")[0]
    uses_asgi = issubclass(server.cfg.worker_class, ASGIWorker)  # type: ignore[attr-defined]
    if uses_asgi and module == APPLICATIONS["wsgi"]:
        raise SystemExit(
            f"gunicorn: {app_uri} is the WSGI application and this server runs the ASGI worker "
            "(gunicorn.conf.py): run `gunicorn` with no application argument (gunicorn.conf.py names it), "
            "or add `-k gthread` to serve the WSGI application."
        )
    if not uses_asgi and module == APPLICATIONS["asgi"]:
        raise SystemExit(
            f"gunicorn: {app_uri} is an ASGI application and needs the ASGI worker: leave out --worker-class "
            "(gunicorn.conf.py sets it), or name outbox_project.wsgi to run a WSGI worker."
        )


def child_exit(server: object, worker: object) -> None:
    """A web worker ended: its metrics files join the archive (its counters stay counted; see
    notifications/metrics_files.py)."""
    from notifications.metrics_files import metrics_files_compact

    metrics_files_compact(directory=os.environ["PROMETHEUS_MULTIPROC_DIR"])


# LOG_FORMAT=json: gunicorn's own messages are JSON lines too, like the application's.
if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    from outbox_project.logging_json import gunicorn_logging_config

    logconfig_dict = gunicorn_logging_config()

# gunicorn's runtime control socket (one path per user, shared by every instance) is not used.
control_socket_disable = True

# The access log never shows secrets a client put in a query string (an API key, say).
logger_class = "outbox_project.weblog.RedactingLogger"
