"""Secrets by reference in the configuration file (docs/security.md).

Wherever the file may carry a secret (``smtp.password``, ``smtp.oauth_client_secret``,
``channels.sms.auth_token``, a webhook's ``secret``, a Teams or Apprise URL) it may say
``{"env": "NAME"}`` instead: the value of the environment variable ``NAME`` of the process that
imports the file, read at import time. The file can then live in version control while the
secrets stay in the deployment's environment (a systemd credential, a vault agent's output).
"""

import os
from typing import Any

REFERENCE_SHAPE = '{"env": "NAME"}'


def config_secret_resolve(container: dict[str, Any] | list[Any], key: Any, *, where: str, problems: list[str]) -> bool:
    """Replace ``container[key]`` by the environment variable it names when it is a reference;
    any other value stays for the usual checks. Returns False when a reference cannot be
    resolved (a missing or empty variable, a malformed reference): the problem, naming
    ``where`` and the variable, is added to ``problems``, and the entry is taken out of a
    dict (so that nothing else reports it again); the caller checks a list's entry no further."""
    value = container[key]
    if not isinstance(value, dict):
        return True
    name = value.get("env")
    if set(value) != {"env"} or not isinstance(name, str) or not name:
        problems.append(f"{where}: must be a string or {REFERENCE_SHAPE} naming an environment variable.")
    elif name not in os.environ:
        problems.append(f"{where}: the environment variable {name} is not set.")
    elif not os.environ[name]:
        problems.append(f"{where}: the environment variable {name} is empty.")
    else:
        container[key] = os.environ[name]
        return True
    if isinstance(container, dict):
        del container[key]
    return False
