"""Settings for Outbox, read from the environment (and an optional `.env` file).

Every option has an explicit type and default; a value that cannot be parsed stops the
process at start with a message naming the variable.
"""

import contextlib
import os
import secrets
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import environ
from django.core.exceptions import ImproperlyConfigured

from outbox_project.env_file import LiteralEnv, env_file_load
from outbox_project.logging_json import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = LiteralEnv()
# OUTBOX_ENV_FILE=/etc/outbox/outbox.env: the systemd units' environment file, read with
# systemd's rules (no expansion), for commands run by hand. Variables already set win.
if os.environ.get("OUTBOX_ENV_FILE"):
    env_file_load(path=os.environ["OUTBOX_ENV_FILE"])
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)


def _read(name: str, cast: str, default: Any) -> Any:
    """Read one variable, naming it when the value does not parse."""
    try:
        return getattr(env, cast)(name, default=default)
    except (ValueError, TypeError, ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(f"Environment variable {name} is invalid: {exc}") from exc


def _positive(name: str, default: float, cast: str = "int") -> Any:
    value = _read(name, cast, default)
    if value <= 0:
        raise ImproperlyConfigured(f"Environment variable {name} must be positive, got {value!r}")
    return value


def _fraction(name: str, default: float) -> float:
    """A number above 0 and at most 1, read as written (django-environ's float drops any
    character that is not a digit, so "0.5x" would pass as 0.5)."""
    text = _read(name, "str", str(default)).strip()
    try:
        value = float(text)
    except ValueError:
        raise ImproperlyConfigured(f"Environment variable {name} is invalid: not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise ImproperlyConfigured(f"Environment variable {name} must be above 0 and at most 1, got {text!r}")
    return value


def _generated_secret_key(path: Path) -> str:
    """The secret key kept in ``path``, created (random, readable by its owner only) the first
    time. Safe when several processes start at once: the file appears complete or not at all
    (written aside, then hard-linked into place), and the first one to land wins."""
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, draft = tempfile.mkstemp(prefix=".secret_key-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        os.unlink(draft)
    return path.read_text().strip()


DEBUG = _read("DEBUG", "bool", False)
SECRET_KEY = _read("SECRET_KEY", "str", "")
# Before generated keys, an installation without SECRET_KEY used this one; secrets it encrypted
# (the SMTP password) keep decrypting with it (notifications/secrets.py) until rotate_secrets.
LEGACY_DEVELOPMENT_SECRET_KEY = "insecure-dev-key-" + str(BASE_DIR)
SECRET_KEY_GENERATED = not SECRET_KEY
if not SECRET_KEY:
    if _read("OUTBOX_HTTPS", "bool", False):
        raise ImproperlyConfigured("Environment variable SECRET_KEY must be set in production (OUTBOX_HTTPS=true)")
    # Without SECRET_KEY (development, `make run`): a random key generated once per installation
    # and kept in var/secret_key, so sessions survive restarts and nobody can predict it.
    SECRET_KEY = _generated_secret_key(Path(_read("OUTBOX_SECRET_KEY_FILE", "str", str(VAR_DIR / "secret_key"))))
# Earlier keys, still accepted for what was signed with them (sessions, acknowledgement links)
# while a rotation settles; Django signs with SECRET_KEY only.
SECRET_KEY_FALLBACKS = _read("SECRET_KEY_FALLBACKS", "list", [])
ALLOWED_HOSTS = _read("ALLOWED_HOSTS", "list", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = _read("CSRF_TRUSTED_ORIGINS", "list", [])

# --- Transport security -----------------------------------------------------------------------
# OUTBOX_HTTPS=true in production (served over TLS, directly or behind a proxy that sets
# X-Forwarded-Proto): HTTPS redirect, secure cookies and HSTS. Off by default so `make run`
# works on plain http://127.0.0.1. See README "Production".
OUTBOX_HTTPS = _read("OUTBOX_HTTPS", "bool", False)
SECURE_SSL_REDIRECT = OUTBOX_HTTPS
SESSION_COOKIE_SECURE = OUTBOX_HTTPS
CSRF_COOKIE_SECURE = OUTBOX_HTTPS
SECURE_HSTS_SECONDS = _read("SECURE_HSTS_SECONDS", "int", 31_536_000 if OUTBOX_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _read("SECURE_HSTS_INCLUDE_SUBDOMAINS", "bool", OUTBOX_HTTPS)
SECURE_HSTS_PRELOAD = _read("SECURE_HSTS_PRELOAD", "bool", OUTBOX_HTTPS)
OUTBOX_BEHIND_PROXY = _read("OUTBOX_BEHIND_PROXY", "bool", False)
if OUTBOX_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# /healthz is probed over plain HTTP by load balancers, and /metrics by a local Prometheus: no redirect.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Scripts, styles, images and fonts from this server only; inline style attributes (the admin
# uses them) but no inline scripts; no plugins, no framing, forms post here only.
OUTBOX_CONTENT_SECURITY_POLICY = _read(
    "OUTBOX_CONTENT_SECURITY_POLICY",
    "str",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "axes",  # console login lockouts (notifications/console_login.py)
    "django_filters",
    "drf_spectacular",
    "django_q",
    "notifications",
    "sites",
]

MIDDLEWARE = [
    # /healthz and /metrics answer whatever Host a load balancer or Prometheus sends; every other
    # path still refuses a Host not in ALLOWED_HOSTS (notifications/probes.py).
    "notifications.probes.ProbeMiddleware",
    "notifications.middleware.ApiGuardMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's static files from gunicorn itself (collectstatic into STATIC_ROOT).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "notifications.middleware.ContentSecurityPolicyMiddleware",
    # Answers a refused console login 429 (its page says why and how long to wait). Inside the
    # header middleware above, so that answer carries their headers; outside a synchronous one,
    # so that under the ASGI server it runs synchronously like them (as the last middleware it
    # would run asynchronously: one more thread switch for every request).
    "axes.middleware.AxesMiddleware",
    "notifications.console_time.ConsoleTimezoneMiddleware",
]

# django-axes first: a refused login never reaches the password check.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "outbox_project.urls"
WSGI_APPLICATION = "outbox_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# SQLite under var/ is the embedded default; production sets DATABASE_URL=postgres://…
try:
    DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'outbox.sqlite3'}")}
except (ValueError, ImproperlyConfigured) as exc:
    raise ImproperlyConfigured(f"Environment variable DATABASE_URL is invalid: {exc}") from exc

SUPPORTED_ENGINES = {"django.db.backends.postgresql", "django.db.backends.sqlite3"}
if DATABASES["default"].get("ENGINE") not in SUPPORTED_ENGINES:
    raise ImproperlyConfigured(
        "Environment variable DATABASE_URL must be a postgres://… or sqlite:///… URL "
        f"(got engine {DATABASES['default'].get('ENGINE')!r})"
    )

DATABASE_PGBOUNCER = False
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend, creating var/ when it first opens a database file there (nothing is
    # created on disk at import time).
    DATABASES["default"]["ENGINE"] = "outbox_project.sqlite_backend"
    DATABASES["default"]["OUTBOX_DATA_DIRECTORY"] = str(VAR_DIR)
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes the write lock at BEGIN, so two writers queue instead of deadlocking.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
    }
else:
    # A new connection per request costs a large share of ingest throughput: keep connections,
    # and check them before use (a restarted server leaves dead ones behind).
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
    # Behind PgBouncer in transaction mode (DATABASE_PGBOUNCER=true, or ?pgbouncer=true in
    # DATABASE_URL): consecutive transactions of one connection may run on different server
    # connections, so nothing may outlive a transaction there — no server-side cursors (they
    # live across fetches) and no prepared statements (psycopg prepares a query it has run
    # five times, on the server connection of that moment; Django's default, made explicit).
    # The only session setting, the time zone Django sets when the server's differs, is one
    # PgBouncer carries over to every server connection. See docs/deployment.md, "PgBouncer".
    _pgbouncer_option = str(DATABASES["default"]["OPTIONS"].pop("pgbouncer", "")).strip().lower()
    if _pgbouncer_option not in {"", "true", "false", "1", "0", "yes", "no", "on", "off"}:
        raise ImproperlyConfigured(
            f"Environment variable DATABASE_URL is invalid: pgbouncer= must be true or false, got {_pgbouncer_option!r}"
        )
    DATABASE_PGBOUNCER = _read("DATABASE_PGBOUNCER", "bool", _pgbouncer_option in {"true", "1", "yes", "on"})
    if DATABASE_PGBOUNCER:
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
    if _read("OUTBOX_DATABASE_POOL", "bool", False):
        # The web server (gunicorn.conf.py turns this on) runs each request in a thread of its
        # own, where a per-thread persistent connection would live for one request: a pool per
        # process keeps the connections instead. Worker and dispatcher processes keep theirs
        # per thread (no pool: django-q2 forks its workers, and a pool must not cross a fork).
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": _positive("OUTBOX_DATABASE_POOL_SIZE", 10, "int"),
            # A request waits at most this long for a free connection, then answers 503.
            "timeout": 10,
        }
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = _read("CONN_MAX_AGE", "int", 600)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# "SQLite does not support indexes with non-key columns": the claim index carries the list name
# for PostgreSQL's index-only reads (notifications.db.ClaimIndex) and is a plain index on SQLite
# by design, so the warning says nothing to act on.
SILENCED_SYSTEM_CHECKS = ["models.W040"]

# Django's default hashers; the first (every password set since Django 4) computed one at a time
# on the host, within a share of its time, at a low CPU priority (notifications/console_login.py),
# so that a flood of logins cannot starve ingest.
PASSWORD_HASHERS = [
    "notifications.console_login.GatedPBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Timestamps with seconds and zone everywhere in the console (outbox_project/formats).
FORMAT_MODULE_PATH = ["outbox_project.formats"]

STATIC_URL = "static/"
# `collectstatic` fills it; the web server creates it if missing (outbox_project/wsgi.py).
STATIC_ROOT = _read("STATIC_ROOT", "str", str(VAR_DIR / "static"))

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["sites.authentication.SiteKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["sites.authentication.IsActiveSite"],
    "DEFAULT_THROTTLE_CLASSES": ["sites.throttling.SiteRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["notifications.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "notifications.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    # ASCII-escaped JSON: an error that echoes a client's invalid string (an unpaired
    # surrogate, say) must still render, never turn into a 500.
    "UNICODE_JSON": False,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Outbox API",
    "DESCRIPTION": "Ingest and status API for site notifications. The contract is described in docs/api.md of the Outbox repository.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}
API_KEY_CUSTOM_HEADER = "HTTP_AUTHORIZATION"

# --- Outbox options -------------------------------------------------------------------------
OUTBOX_DISPATCH_INTERVAL = _positive("OUTBOX_DISPATCH_INTERVAL", 5.0, "float")  # seconds
OUTBOX_STUCK_AGE = _positive("OUTBOX_STUCK_AGE", 600, "int")  # seconds
OUTBOX_RETENTION_DAYS = _positive("OUTBOX_RETENTION_DAYS", 365, "int")
OUTBOX_BATCH_SIZE = _positive("OUTBOX_BATCH_SIZE", 200, "int")  # most rows claimed per batch
OUTBOX_CONCURRENCY = _positive("OUTBOX_CONCURRENCY", 16, "int")  # deliveries at a time (per process)
OUTBOX_LEASE_SECONDS = _positive("OUTBOX_LEASE_SECONDS", 120, "int")
OUTBOX_KPI_INTERVAL = _positive("OUTBOX_KPI_INTERVAL", 3600, "int")  # "delivered in last…"
OUTBOX_MAX_BODY_BYTES = _positive("OUTBOX_MAX_BODY_BYTES", 1_048_576, "int")
OUTBOX_BATCH_MAX_ITEMS = _positive("OUTBOX_BATCH_MAX_ITEMS", 1000, "int")
# Queue a django-q2 dispatch task after ingest commits (low latency). Off only where dedicated
# `manage.py dispatch` processes do all the delivering.
OUTBOX_DISPATCH_TRIGGER = _read("OUTBOX_DISPATCH_TRIGGER", "bool", True)
OUTBOX_PURGE_BATCH_SIZE = _positive("OUTBOX_PURGE_BATCH_SIZE", 200, "int")
# The share of time the purge works: after a batch that took t seconds it rests
# t × (1 / cycle − 1), so that sites posting meanwhile rarely meet it at work. 1: no rest.
OUTBOX_PURGE_DUTY_CYCLE = _fraction("OUTBOX_PURGE_DUTY_CYCLE", 0.2)
# How long a verified site key is trusted by one web process before it is checked again
# (revocation and deactivation reach the other processes within this time). 0 disables.
OUTBOX_KEY_CACHE_SECONDS = _read("OUTBOX_KEY_CACHE_SECONDS", "int", 10)
# Keys for secrets stored in the database (SMTP password); the first encrypts, all decrypt.
# Default: derived from SECRET_KEY. See notifications/secrets.py and docs/operations.md, "Secrets and key rotation".
OUTBOX_SECRET_KEYS = _read("OUTBOX_SECRET_KEYS", "list", [])
# Central's public base URL (https://outbox.example.com): the console link in Teams cards and
# the SMS status callback address (also what Twilio's callback signature is checked against).
# Empty: cards have no link and SMS is sent without status callbacks. See docs/channels.md.
OUTBOX_PUBLIC_URL = _read("OUTBOX_PUBLIC_URL", "str", "").rstrip("/")
if OUTBOX_PUBLIC_URL and not OUTBOX_PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"Environment variable OUTBOX_PUBLIC_URL must be an http(s) URL, got {OUTBOX_PUBLIC_URL!r}"
    )
# How long an acknowledgement link stays valid, in days (docs/acknowledgement.md). The links are
# OUTBOX_PUBLIC_URL + /ack/<token>/ and appear only when OUTBOX_PUBLIC_URL is set.
OUTBOX_ACK_TOKEN_DAYS = _positive("OUTBOX_ACK_TOKEN_DAYS", 7)
# Per-site rate limits, shared by every web process (sites/rate_limits.py, docs/operations.md
# "Rate limits"): notifications per second a site may send, sustained, and how many at once (a
# batch of N draws N); critical notifications on a budget of their own; and, per kind, the other
# requests a site makes (its agent's heartbeats and reports, watchdog pings, acknowledgements,
# reads). A site's own limits can be raised in the console (Sites). OUTBOX_SITE_RATE_LIMIT=0
# disables every site limit. A burst must hold the largest batch (OUTBOX_BATCH_MAX_ITEMS).
OUTBOX_SITE_RATE_LIMIT = _read("OUTBOX_SITE_RATE_LIMIT", "float", 100.0)
OUTBOX_SITE_RATE_BURST = _read("OUTBOX_SITE_RATE_BURST", "int", 5000)
OUTBOX_SITE_CRITICAL_RATE_LIMIT = _positive("OUTBOX_SITE_CRITICAL_RATE_LIMIT", 10.0, "float")
OUTBOX_SITE_CRITICAL_RATE_BURST = _read("OUTBOX_SITE_CRITICAL_RATE_BURST", "int", 1000)
OUTBOX_SITE_REQUEST_RATE_LIMIT = _positive("OUTBOX_SITE_REQUEST_RATE_LIMIT", 50.0, "float")
OUTBOX_SITE_REQUEST_RATE_BURST = _positive("OUTBOX_SITE_REQUEST_RATE_BURST", 1000, "int")
for _name in ("OUTBOX_SITE_RATE_BURST", "OUTBOX_SITE_CRITICAL_RATE_BURST"):
    if OUTBOX_SITE_RATE_LIMIT and globals()[_name] < OUTBOX_BATCH_MAX_ITEMS:
        raise ImproperlyConfigured(
            f"Environment variable {_name} must be at least OUTBOX_BATCH_MAX_ITEMS ({OUTBOX_BATCH_MAX_ITEMS}): "
            f"a batch that large could never be accepted, got {globals()[_name]!r}"
        )
if OUTBOX_SITE_RATE_LIMIT < 0:
    raise ImproperlyConfigured(
        f"Environment variable OUTBOX_SITE_RATE_LIMIT must be 0 or more, got {OUTBOX_SITE_RATE_LIMIT!r}"
    )
# Dispatch takes due rows by priority, then the sites in turn (notifications/dispatch/fair.py).
# false: the oldest due first whatever the site or priority (a diagnostic switch; the
# fairness benchmark's reference).
OUTBOX_FAIR_CLAIM = _read("OUTBOX_FAIR_CLAIM", "bool", True)
# A site whose agent has heart-beated and then sent no heartbeat for this many seconds is shown
# "silent" (console, KPIs); a site that only posts directly is never silent.
OUTBOX_SITE_SILENT_AFTER = _positive("OUTBOX_SITE_SILENT_AFTER", 300, "int")
# The longest a silence may last (docs/suppression.md), in days.
OUTBOX_SILENCE_MAX_DAYS = _positive("OUTBOX_SILENCE_MAX_DAYS", 7, "int")
# Failed authentications (API keys, staff tokens) allowed per client address and per credential
# in a burst, refilled at this many per minute, per web process; then 429 before any check.
# OUTBOX_AUTH_FAILURE_RATE=0 disables the limit. See sites/throttling.py.
OUTBOX_AUTH_FAILURE_BURST = _read("OUTBOX_AUTH_FAILURE_BURST", "int", 20)
OUTBOX_AUTH_FAILURE_RATE = _read("OUTBOX_AUTH_FAILURE_RATE", "float", 10.0)
OUTBOX_BENCH_RAW_VIEW = _read("OUTBOX_BENCH_RAW_VIEW", "bool", False)

# --- Console logins (notifications/console_login.py, docs/operations.md "Console logins") --------
# A user name is locked out *from one client address* after OUTBOX_LOGIN_FAILURE_LIMIT failed
# logins, for OUTBOX_LOGIN_LOCKOUT_MINUTES after the last one (never a user name everywhere).
OUTBOX_LOGIN_FAILURE_LIMIT = _positive("OUTBOX_LOGIN_FAILURE_LIMIT", 5, "int")
OUTBOX_LOGIN_LOCKOUT_MINUTES = _positive("OUTBOX_LOGIN_LOCKOUT_MINUTES", 15, "int")
# A client address may fail this many logins in a burst (any user names), refilled at this many
# per minute, per web process; then it is refused before its credentials are looked at.
OUTBOX_LOGIN_CLIENT_BURST = _positive("OUTBOX_LOGIN_CLIENT_BURST", 10, "int")
OUTBOX_LOGIN_CLIENT_RATE = _positive("OUTBOX_LOGIN_CLIENT_RATE", 5.0, "float")
# A refused login is answered after this many seconds (0: at once), so that a client retrying
# as soon as it has an answer costs the server one page a second, not all it can render.
OUTBOX_LOGIN_REFUSAL_DELAY = _read("OUTBOX_LOGIN_REFUSAL_DELAY", "float", 1.0)
if not 0 <= OUTBOX_LOGIN_REFUSAL_DELAY <= 30:
    raise ImproperlyConfigured(
        f"Environment variable OUTBOX_LOGIN_REFUSAL_DELAY must be 0 to 30 seconds, got {OUTBOX_LOGIN_REFUSAL_DELAY!r}"
    )
# A login waits at most this long for its password check, then is asked to retry. Checks run one
# at a time on the host: the web processes take turns through this lock file.
OUTBOX_PASSWORD_HASH_WAIT = _positive("OUTBOX_PASSWORD_HASH_WAIT", 10.0, "float")
OUTBOX_PASSWORD_HASH_LOCK = _read("OUTBOX_PASSWORD_HASH_LOCK", "str", str(VAR_DIR / "password-hashing.lock"))
# The share of the time the host may spend on password checks: after one that took t seconds the
# next waits t × (1 / cycle − 1). 1: no rest.
OUTBOX_PASSWORD_HASH_DUTY_CYCLE = _fraction("OUTBOX_PASSWORD_HASH_DUTY_CYCLE", 0.25)
AXES_ENABLED = True
AXES_HANDLER = "notifications.console_login.ConsoleLoginHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = OUTBOX_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=OUTBOX_LOGIN_LOCKOUT_MINUTES)
AXES_RESET_ON_SUCCESS = True
# Refused attempts are not recorded: the lockout ends when announced, whoever keeps knocking.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "notifications.console_login.login_client_address"
AXES_LOCKOUT_CALLABLE = "notifications.console_login.login_refusal_response"
AXES_VERBOSE = False

# GET /metrics (docs/observability.md): a bearer token that lets a scraper in from anywhere;
# without it only clients on this host (loopback, not relayed by a proxy) may read the metrics.
OUTBOX_METRICS_TOKEN = _read("OUTBOX_METRICS_TOKEN", "str", "")
# The database gauges are read at most once per this many seconds per web process.
OUTBOX_METRICS_CACHE_SECONDS = _read("OUTBOX_METRICS_CACHE_SECONDS", "float", 5.0)
if OUTBOX_METRICS_CACHE_SECONDS < 0:
    raise ImproperlyConfigured(
        f"Environment variable OUTBOX_METRICS_CACHE_SECONDS must be 0 or more, got {OUTBOX_METRICS_CACHE_SECONDS!r}"
    )
# Email attachments (type_data.attachments): their total decoded size per notification, and the
# content types a site may attach. Base64 makes an attachment a third larger in the request, so
# keep the bound well inside OUTBOX_MAX_BODY_BYTES (a system check warns otherwise).
OUTBOX_MAX_ATTACHMENT_BYTES = _positive("OUTBOX_MAX_ATTACHMENT_BYTES", 524_288, "int")
OUTBOX_ATTACHMENT_CONTENT_TYPES = [
    value.strip().lower()
    for value in _read(
        "OUTBOX_ATTACHMENT_CONTENT_TYPES",
        "list",
        [
            "application/pdf",
            "application/json",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            "image/gif",
            "image/jpeg",
            "image/png",
            "image/webp",
            "text/csv",
            "text/plain",
        ],
    )
    if value.strip()
]

DATA_UPLOAD_MAX_MEMORY_SIZE = OUTBOX_MAX_BODY_BYTES

# --- Worker (django-q2) ---------------------------------------------------------------------
# The ORM broker lives in the default database. A task must never outlive its broker lease
# (`retry`), or a second worker would run it again: timeout < retry, and dispatch passes are
# themselves time-boxed well below `timeout`. Q_BROKER_URL=redis://… uses Redis instead
# (docs/deployment.md, "Redis as the task broker").
Q_CLUSTER: dict[str, Any] = {
    "name": _read("OUTBOX_Q_CLUSTER_NAME", "str", "outbox"),
    "orm": "default",
    "workers": _positive("OUTBOX_Q_WORKERS", 2, "int"),
    "timeout": 90,
    "retry": 120,
    "max_attempts": 1,
    "catch_up": False,
    "poll": 0.2,
    # Each cluster's "pusher" takes tasks from the broker ahead of its task processes, up to
    # this many in its own queue plus one in hand: a cluster whose processes are all busy
    # holds at most two, and every further task goes to a cluster that has an idle process
    # (the default, workers², let a busy cluster take a backlog's "join me" tasks away from
    # an idle one for as long as its passes ran: notifications/trigger.py).
    "queue_limit": 1,
    "ack_failures": True,
    "save_limit": 200,
    "label": "Worker tasks",
}
Q_BROKER_URL = _read("Q_BROKER_URL", "str", "").strip()
if Q_BROKER_URL:
    if urlparse(Q_BROKER_URL).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(
            "Environment variable Q_BROKER_URL must be a redis://, rediss:// or unix:// URL "
            f"(empty: the database is the broker), got {Q_BROKER_URL!r}"
        )
    # Tasks travel through a Redis list; schedules, results and failures stay in the database.
    del Q_CLUSTER["orm"]
    Q_CLUSTER["redis"] = Q_BROKER_URL

# Logs go to standard error: LOG_FORMAT=text (default) as "time level logger message" lines,
# LOG_FORMAT=json as one JSON object per line (outbox_project/logging_json.py).
LOG_LEVEL = _read("LOG_LEVEL", "str", "INFO").strip().upper()
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        f"Environment variable LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {LOG_LEVEL!r}"
    )
_log_format = _read("LOG_FORMAT", "str", "text")
LOG_FORMAT = _log_format.strip().lower()
try:
    LOGGING = logging_config(log_format=LOG_FORMAT, level=LOG_LEVEL)
except ValueError:
    raise ImproperlyConfigured(
        f"Environment variable LOG_FORMAT must be one of text, json, got {_log_format!r}"
    ) from None
# With LOG_FORMAT=json also Python's warnings and whatever is printed to standard error.
LOGGING_CONFIG = "outbox_project.logging_json.logging_configure"
