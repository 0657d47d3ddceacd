"""Run a Python program with the application's clock skewed by SECONDS.

    python chaos/skewed.py 3600 manage.py dispatch
    python chaos/skewed.py -3600 -m gunicorn outbox_project.wsgi:application …

Skews the clocks the application reads — ``time.time()`` and ``django.utils.timezone.now()``
— and leaves the monotonic clock (timeouts, sleeps) alone, as a drifting wall clock would.
libfaketime was tried first; it breaks timed waits in Python's threading on this platform.
"""

import runpy
import sys
import time
from datetime import timedelta

skew = float(sys.argv[1])
real_time = time.time
time.time = lambda: real_time() + skew

from django.utils import timezone  # noqa: E402

real_now = timezone.now
timezone.now = lambda: real_now() + timedelta(seconds=skew)

if sys.argv[2] == "-m":
    sys.argv = [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
