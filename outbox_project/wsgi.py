import os

from django.core.wsgi import get_wsgi_application

from outbox_project.static_files import static_root_check, static_root_create

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
# WhiteNoise serves STATIC_ROOT (filled by collectstatic on this host) and looks at it once, when
# the application is built: the directory exists by then, and a warning says so when it lacks
# the console's files.
static_root_create()
application = get_wsgi_application()
static_root_check()
