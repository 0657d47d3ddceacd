"""Logging in to the operations console: lockouts, throttling, and a bounded price for password
checks.

Three rules, cheapest first, so that a flood of wrong passwords costs the server little:

* **Per client address** (throttling): every address may fail OUTBOX_LOGIN_CLIENT_BURST times in
  a burst, refilled at OUTBOX_LOGIN_CLIENT_RATE per minute, whatever user names it tries (a
  wrong password counts, and so does trying a locked-out user name again). An address with none
  left is refused before its credentials are looked at (no database query, no password hash).
  Token buckets in each web process, like the API's failed-authentication limit
  (sites/throttling.py).
* **Per user name and client address** (lockout, by django-axes in the database, shared by
  every web process): OUTBOX_LOGIN_FAILURE_LIMIT failures for one user name from one address
  lock that pair out for OUTBOX_LOGIN_LOCKOUT_MINUTES after its last failure. Never a user name
  alone: a guesser elsewhere cannot lock an operator out, and the operator can still log in from
  another address. Administrators unlock a pair in the console (Axes › Access attempts: delete
  the row) or with ``manage.py axes_reset_ip_username ADDRESS USERNAME``.
* **Password hashing** runs one hash at a time on the host, for at most a share of its time,
  at the lowest CPU priority (:class:`PasswordHashingGate`): a flood from many addresses, each
  within its allowance, makes logins wait, not ingest.

A refused login (throttled or locked out) is answered 429 with Retry-After and the login page
saying why and how long to wait, after OUTBOX_LOGIN_REFUSAL_DELAY seconds: a client that
retries as soon as it has an answer gets one a second, not as many as the server can render.
A login waiting (its refusal delay, its turn to hash) holds no database connection.
"""

import fcntl
import ipaddress
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from sites.throttling import AuthFailureLimiter, client_address

Result = TypeVar("Result")

# Failed console logins per client address (user names of every kind), per web process.
login_failures = AuthFailureLimiter(burst="OUTBOX_LOGIN_CLIENT_BURST", rate="OUTBOX_LOGIN_CLIENT_RATE")


def database_connection_release() -> None:
    """Hand this thread's database connection back (to the pool of the web process, where there
    is one) unless a transaction holds it: a login about to wait (its refusal delay, its turn at
    password hashing) must not keep a connection that ingest could use meanwhile. The next
    query takes one again."""
    if not connection.in_atomic_block:
        connection.close()


def login_client_address(request: HttpRequest) -> str | None:
    """The client's address as the API decides it (sites.throttling.client_address: behind the
    reverse proxy, the address it appended to X-Forwarded-For), or None when that is not an IP
    address (a request without one, a forged header sent straight to the web server)."""
    address = client_address(request)
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def _client_key(request: HttpRequest) -> list[tuple[str, str]]:
    return [("console-client", login_client_address(request) or "-")]


def login_throttle_wait(*, request: HttpRequest) -> float:
    """Seconds until the request's client address may fail a login again; 0 when it may now."""
    return login_failures.wait(_client_key(request))


def login_lockout_remaining(*, username: str, address: str | None) -> timedelta:
    """How long the lockout of ``username`` from ``address`` lasts from now (zero when it does
    not): the lockout period counted from the pair's last recorded failure."""
    last = AccessAttempt.objects.filter(username=username, ip_address=address).aggregate(last=Max("attempt_time"))[
        "last"
    ]
    if last is None:
        return timedelta(0)
    return max(timedelta(0), last + settings.AXES_COOLOFF_TIME - timezone.now())


class ConsoleLoginHandler(AxesDatabaseHandler):
    """django-axes' database handler (lockout of user name and address pairs) with the per-address
    throttle in front: an address that has spent its failures is refused like a locked-out pair,
    before the database is asked, and that refusal is not recorded."""

    def is_locked(self, request: Any, credentials: dict[str, Any] | None = None) -> bool:
        if login_throttle_wait(request=request) > 0:
            request.outbox_login_throttled = True
            return True
        return bool(super().is_locked(request, credentials))

    def user_login_failed(self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
        if request is not None:
            if getattr(request, "outbox_login_throttled", False):
                return  # refused before anything was looked at: nothing to record
            # A wrong password, or a locked-out user name tried again: either counts against
            # the address, so that knocking at a lockout soon meets the cheaper refusal.
            login_failures.record(_client_key(request))
        super().user_login_failed(sender, credentials, request, **kwargs)


def _duration(seconds: float) -> str:
    if seconds < 120:
        whole = max(1, math.ceil(seconds))
        return f"{whole} second{'s' if whole != 1 else ''}"
    return f"{math.ceil(seconds / 60)} minutes"


def login_refusal(*, request: Any) -> tuple[str, float] | None:
    """Why the login ``request`` was refused, and for how many more seconds: ``(message,
    seconds)``; None when it was not refused (a wrong password is no refusal)."""
    if getattr(request, "outbox_login_throttled", False):
        wait = login_throttle_wait(request=request)
        return (
            f"Too many failed logins from your address. Try again in {_duration(wait)}; "
            "a correct password is refused until then too.",
            wait,
        )
    if getattr(request, "axes_locked_out", False):
        username = request.POST.get("username", "")
        wait = login_lockout_remaining(username=username, address=login_client_address(request)).total_seconds()
        return (
            f"Too many failed logins for “{username}” from your address. Try again in {_duration(wait)}, "
            "or ask an administrator to unlock it. Logging in from another address is not affected.",
            wait,
        )
    return None


class ConsoleLoginForm(AdminAuthenticationForm):
    """The console's login form. A refused login (address throttled, user name locked out from
    it) says so and how long to wait, in place of "wrong password"; a login that found password
    checking saturated (:class:`PasswordHashingBusy`) is asked to try again, and nothing is
    counted against it."""

    def clean(self) -> dict[str, Any]:
        token = password_hash_wait.set(settings.OUTBOX_PASSWORD_HASH_WAIT)
        try:
            return super().clean()
        except PasswordHashingBusy:
            raise ValidationError(
                "The console is busy checking other logins. Try again in a few seconds.", code="busy"
            ) from None
        except ValidationError:
            refusal = login_refusal(request=self.request)
            if refusal is None:
                raise
            message, self.request.outbox_login_retry_after = refusal  # type: ignore[union-attr]
            raise ValidationError(message, code="login_refused") from None
        finally:
            password_hash_wait.reset(token)


def login_refusal_response(
    request: HttpRequest, original_response: HttpResponse | None = None, *args: Any
) -> HttpResponse:
    """django-axes' lockout answer (AXES_LOCKOUT_CALLABLE), after OUTBOX_LOGIN_REFUSAL_DELAY
    seconds: the login page the console rendered (ConsoleLoginForm put the reason and the wait
    on it) answered 429 with Retry-After."""
    if settings.OUTBOX_LOGIN_REFUSAL_DELAY > 0:
        database_connection_release()
        time.sleep(settings.OUTBOX_LOGIN_REFUSAL_DELAY)
    retry_after = getattr(request, "outbox_login_retry_after", None)
    if original_response is None or retry_after is None:
        # Not the console's login form (nothing else here logs in with a password).
        refusal = login_refusal(request=request) or ("Too many failed logins. Try again later.", 60.0)
        original_response = HttpResponse(refusal[0], content_type="text/plain; charset=utf-8")
        retry_after = refusal[1]
    original_response.status_code = 429
    original_response["Retry-After"] = str(max(1, math.ceil(retry_after)))
    original_response["Cache-Control"] = "no-store"
    return original_response


# --- password hashing -------------------------------------------------------------------------


class PasswordHashingBusy(Exception):
    """A password check did not finish within the time its caller would wait."""


# How long a password check may wait for the hashing thread: logins wait OUTBOX_PASSWORD_HASH_WAIT
# seconds (ConsoleLoginForm), anything else (an administrator setting a password) as long as it takes.
password_hash_wait: ContextVar[float | None] = ContextVar("password_hash_wait", default=None)


class PasswordHashingGate:
    """Password hashes, computed one at a time on the whole host (a lock file shared by the web
    processes, OUTBOX_PASSWORD_HASH_LOCK), for at most OUTBOX_PASSWORD_HASH_DUTY_CYCLE of its
    time, each on a thread of its process that runs at the lowest CPU priority (nice 19, Linux's
    per-thread priority).

    A password check costs a fraction of a second of CPU by design. Left on the request threads,
    a flood of logins from many addresses (each within its allowance) takes every core, and
    ingest waits behind it (p95 20 ms → 1.9 s with 16 clients). One hash at a time per host
    bounds the flood to one core whatever the number of web processes, the duty cycle to a
    quarter of one, and the priority hands even that to ingest whenever ingest wants it
    (measured: docs/performance.md, "Logins under a flood"). A login waits for its turn up to
    OUTBOX_PASSWORD_HASH_WAIT seconds (:data:`password_hash_wait`), then gets PasswordHashingBusy
    (the login page asks to try again).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def _executor_here(self) -> ThreadPoolExecutor:
        # gunicorn forks its workers: a thread started before the fork does not exist after it.
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="password-hashing", initializer=_lowest_priority
                )
                self._pid = os.getpid()
            return self._executor

    def run(self, function: Callable[..., Result], *args: Any) -> Result:
        """``function(*args)`` on the hashing thread, alone on the host; PasswordHashingBusy if
        it has not finished within :data:`password_hash_wait` seconds (a check that has not
        started is dropped)."""
        future = self._executor_here().submit(_alone_on_this_host, function, *args)
        database_connection_release()
        try:
            return future.result(timeout=password_hash_wait.get())
        except FutureTimeout:
            future.cancel()
            raise PasswordHashingBusy("no password check could start in time") from None


MAX_REST_SECONDS = 5.0


def _alone_on_this_host(function: Callable[..., Result], *args: Any) -> Result:
    """``function(*args)`` while holding the host's hashing lock, after the rest the previous
    check on the host left (OUTBOX_PASSWORD_HASH_DUTY_CYCLE); the lock file holds when that rest
    ends, on the system-wide monotonic clock."""
    path = Path(settings.OUTBOX_PASSWORD_HASH_LOCK)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # released when the descriptor is closed
        try:
            rest_until = float(os.pread(descriptor, 64, 0) or b"0")
        except ValueError:
            rest_until = 0.0
        pause = rest_until - time.monotonic()
        if 0 < pause <= MAX_REST_SECONDS:
            time.sleep(pause)
        started = time.monotonic()
        try:
            return function(*args)
        finally:
            ended = time.monotonic()
            rest = (ended - started) * (1 / settings.OUTBOX_PASSWORD_HASH_DUTY_CYCLE - 1)
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, repr(ended + rest).encode(), 0)
    finally:
        os.close(descriptor)


def _lowest_priority() -> None:
    if sys.platform == "linux":
        # On Linux the nice value belongs to the calling thread, not the whole process.
        os.setpriority(os.PRIO_PROCESS, 0, 19)


password_hashing = PasswordHashingGate()


class GatedPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's default hasher (same algorithm, same stored hashes), computed through
    :data:`password_hashing`."""

    def encode(self, password: str, salt: str, iterations: int | None = None) -> str:
        return password_hashing.run(super().encode, password, salt, iterations)
