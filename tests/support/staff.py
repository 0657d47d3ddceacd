"""Staff API keys for tests, benchmarks and the chaos suite: issued as an administrator issues them."""

from datetime import timedelta
from typing import Any

from django.utils import timezone

from sites.services import staff_key_issue


def staff_key_header(user: Any, *, name: str = "tests", days: int = 30) -> str:
    """The ``Authorization`` header value (``Token <key>``) of a new staff key of ``user``, an
    active staff user, expiring in ``days`` days."""
    _, key = staff_key_issue(user=user, name=name, expiry_date=timezone.now() + timedelta(days=days))
    return f"Token {key}"
