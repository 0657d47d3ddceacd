#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys
from pathlib import Path


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
    # Worker processes (qcluster, dispatch) count deliveries into the metrics files that the web
    # processes of this host export (notifications/metrics.py); gunicorn.conf.py sets the same.
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(Path(__file__).resolve().parent / "var" / "metrics"))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
