import os
from pathlib import Path

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
# WhiteNoise serves STATIC_ROOT (filled by collectstatic) and warns at every start when the
# directory is missing; the web server is where it is first needed.
Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
application = get_wsgi_application()
