"""Helpers for tests that start other processes against the test database."""

from urllib.parse import quote

from django.db import connection


def is_postgres():
    return connection.vendor == "postgresql"


def database_url():
    """A DATABASE_URL that points a child process at the database this test uses."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = quote(s.get("USER") or "")
    password = quote(s.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "localhost"
    port = s.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{s['NAME']}"
