"""The web server's application (gunicorn.conf.py runs it with gunicorn's ASGI worker).

Django's ASGI handler, behind :class:`notifications.middleware.AsgiRequestGuard`, which refuses
over-limit and unframed bodies before the handler would buffer them.
"""

import os
from pathlib import Path

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
django_application = get_asgi_application()

from notifications.middleware import AsgiRequestGuard  # noqa: E402  (needs Django set up)

# As in wsgi.py: WhiteNoise warns at every start when STATIC_ROOT is missing.
Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
application = AsgiRequestGuard(django_application)
