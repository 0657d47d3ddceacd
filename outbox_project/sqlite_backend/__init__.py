"""Django's SQLite backend, creating the database file's directory on first connection."""
