"""The console's static files, checked where they are served: a web server whose STATIC_ROOT
lacks them says so at start.

Every web host serves the console's styles and scripts from its own STATIC_ROOT (WhiteNoise),
filled by ``manage.py collectstatic`` on that host (the systemd unit runs it at every start and
reload; docs/deployment.md). A host where that did not happen serves the console without CSS
and JavaScript, and nothing else would tell.
"""

import logging
from pathlib import Path

from django.apps import apps
from django.conf import settings

logger = logging.getLogger(__name__)


def static_files_missing(*, root: Path) -> tuple[list[str], int]:
    """The files ``collectstatic`` would copy that ``root`` does not hold (relative paths,
    sorted), and how many it would copy in all. Needs the applications loaded."""
    from django.contrib.staticfiles import finders

    ignore = apps.get_app_config("staticfiles").ignore_patterns  # type: ignore[attr-defined]
    expected = set()
    for finder in finders.get_finders():
        for path, storage in finder.list(ignore):
            prefix = getattr(storage, "prefix", None)
            expected.add(f"{prefix}/{path}" if prefix else path)
    return sorted(name for name in expected if not (root / name).is_file()), len(expected)


def static_root_create() -> None:
    """Create STATIC_ROOT if missing. Before the application is built: WhiteNoise looks at the
    directory once, then, and warns at every start when it is missing."""
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)


def static_root_check() -> None:
    """Log a warning naming STATIC_ROOT when it lacks the console's files (after Django is set
    up)."""
    root = Path(settings.STATIC_ROOT)
    missing, total = static_files_missing(root=root)
    if missing:
        logger.warning(
            "STATIC_ROOT %s lacks %d of the console's %d static files (%s%s): the console is served "
            "without its styles and scripts. Run `python manage.py collectstatic --noinput` on this host "
            "(outbox-web.service does at every start and reload).",
            root,
            len(missing),
            total,
            ", ".join(missing[:3]),
            ", …" if len(missing) > 3 else "",
        )
