"""Django's SQLite backend, except that a connection to the embedded default database first
creates the directory its file lives in (``var/``). Settings create nothing on disk at import
time; the directory appears where it is first needed, whoever connects first (``migrate``,
the web server, a command). Any other database file is opened as configured: a missing
directory there is a configuration error, not something to paper over."""

from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base

# The key in DATABASES["default"] naming the directory this backend may create.
DATA_DIRECTORY = "OUTBOX_DATA_DIRECTORY"


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        directory = self.settings_dict.get(DATA_DIRECTORY)
        if directory and Path(str(conn_params["database"])).parent == Path(directory):
            Path(directory).mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)
