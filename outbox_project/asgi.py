"""The web server's application (gunicorn.conf.py runs it with gunicorn's ASGI worker).

Django's ASGI handler, behind :class:`notifications.middleware.AsgiRequestGuard`, which refuses
over-limit and unframed bodies before the handler would buffer them.
"""

import os

from django.core.asgi import get_asgi_application

from outbox_project.static_files import static_root_check, static_root_create

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
# As in wsgi.py: STATIC_ROOT exists before WhiteNoise looks at it, and a warning says so when it
# lacks the console's files (collectstatic did not run on this host).
static_root_create()
django_application = get_asgi_application()
static_root_check()

from notifications.middleware import AsgiRequestGuard  # noqa: E402  (needs Django set up)

application = AsgiRequestGuard(django_application)
