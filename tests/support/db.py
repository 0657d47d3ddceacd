"""Databases for processes a test, a benchmark or the chaos suite starts."""

from urllib.parse import quote, urlparse, urlunparse

from django.db import connection


def database_url() -> str:
    """A DATABASE_URL that points a child process at the database this process's Django
    connection uses (inside a test: the test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = quote(s.get("USER") or "")
    password = quote(s.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "localhost"
    port = s.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{s['NAME']}"


def fresh_postgres_database(base_url: str, suffix: str) -> str:
    """Drop and create the PostgreSQL database ``<name of base_url>_<suffix>`` and migrate it.
    Returns its DATABASE_URL. ValueError if ``base_url`` is not a postgres:// URL."""
    from tests.support.processes import manage_output

    parsed = urlparse(base_url)
    if not parsed.scheme.startswith("postgres"):
        raise ValueError(f"a postgres://… URL is needed, got {base_url!r}")
    name = f"{parsed.path.lstrip('/') or 'outbox'}_{suffix}"
    import psycopg
    from psycopg import sql

    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = urlunparse(parsed._replace(path=f"/{name}"))
    manage_output("migrate", "--noinput", "-v0", database=url)
    return url


def drop_postgres_database(url: str) -> None:
    """Drop the PostgreSQL database at ``url`` (made by :func:`fresh_postgres_database`)."""
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(parsed.path.lstrip("/"))))
