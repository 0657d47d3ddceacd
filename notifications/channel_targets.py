"""List targets of the channels beyond email (docs/channels.md): how each is checked and shown
masked, and what a target resolved for delivery is (notifications.adapters.targets resolves
them). A leaf module: the models use its masks, so it imports no model.

One set of checks serves the console's inline forms, the configuration file and delivery, so a
target the console accepts is one delivery can use. Each check returns a problem in words, or
None.

A resolved target is a :class:`Target`: a ``str`` (its masked form, what the audit snapshot
and the console show) that also carries what delivery needs (the real address, the signing
secret) and a stable ``ref`` (a short digest of the address) that ties a target's outcome in
``resolved_targets`` to the target on the next attempt, without storing the address itself.
"""

import binascii
import hashlib
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_http_url = URLValidator(schemes=["http", "https"])


class Target(str):
    """One target as resolved for a delivery: the masked text, plus ``address`` (the real URL
    or number), ``secret`` (webhooks) and ``ref``."""

    address: str
    secret: str
    ref: str
    undecryptable: bool

    def __new__(cls, masked: str, *, address: str, secret: str = "", undecryptable: bool = False) -> "Target":
        target = super().__new__(cls, masked)
        target.address = address
        target.secret = secret
        # The stored secret (or Apprise URL) does not decrypt with the configured keys.
        target.undecryptable = undecryptable
        target.ref = target_ref(address or masked)
        return target


def target_ref(address: str) -> str:
    """A short, stable reference to a target that does not reveal it."""
    return hashlib.sha256(address.encode()).hexdigest()[:16]


# --- checks -------------------------------------------------------------------------------


def http_url_problem(value: Any, *, what: str = "URL") -> str | None:
    """An http(s) URL a delivery can post to, or what is wrong with it."""
    if not isinstance(value, str) or not value:
        return f"{what} is required."
    if len(value) > 2000:
        return f"{what} must be at most 2000 characters."
    try:
        _http_url(value)
    except ValidationError:
        return f"{value[:80]!r} is not a valid http:// or https:// URL."
    return None


def webhook_secret_problem(value: Any) -> str | None:
    """A Standard Webhooks signing secret: "whsec_" followed by base64 of at least 24 bytes."""
    if not isinstance(value, str) or not value:
        return "A signing secret is required."
    if not value.startswith("whsec_"):
        return 'The signing secret must start with "whsec_" (followed by base64).'
    try:
        key = binascii.a2b_base64(value[len("whsec_") :] + "==")
    except binascii.Error:
        return 'The part after "whsec_" is not valid base64.'
    if len(key) < 24:
        return "The signing secret is too short: use at least 24 random bytes (32 recommended)."
    return None


def phone_number_problem(value: Any) -> str | None:
    """An E.164 phone number: "+", country code and number, 7 to 15 digits, nothing else."""
    if not isinstance(value, str) or not value:
        return "A phone number is required."
    if not E164.match(value):
        return f"{value[:40]!r} is not an E.164 phone number (like +4930123456: '+', country code, digits only)."
    return None


def apprise_url_problem(value: Any) -> str | None:
    """An Apprise URL that Apprise knows how to send to."""
    if not isinstance(value, str) or not value:
        return "An Apprise URL is required."
    if len(value) > 4000:
        return "The Apprise URL must be at most 4000 characters."
    import apprise

    if apprise.Apprise.instantiate(value, suppress_exceptions=True) is None:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        known = "a scheme Apprise does not support" if scheme else "no scheme"
        return f"Not a usable Apprise URL ({known}; see https://github.com/caronc/apprise/wiki)."
    return None


MAX_FACTS = 50


def teams_type_data_validate(type_data: Any) -> dict[str, list[str]]:
    """Problems of a Teams notification's ``type_data.facts``, per field: an object of
    title → value (strings or numbers), or a list of ``{"title", "value"}``."""
    facts = type_data.get("facts") if isinstance(type_data, dict) else None
    if facts is None:
        return {}
    if isinstance(facts, dict):
        items = list(facts.items())
    elif isinstance(facts, list):
        items = []
        for index, fact in enumerate(facts):
            if not isinstance(fact, dict) or set(fact) != {"title", "value"}:
                return {f"type_data.facts[{index}]": ['Must be an object with exactly "title" and "value".']}
            items.append((fact["title"], fact["value"]))
    else:
        return {"type_data.facts": ['Must be an object (title → value) or a list of {"title", "value"}.']}
    if len(items) > MAX_FACTS:
        return {"type_data.facts": [f"Must hold at most {MAX_FACTS} facts (got {len(items)})."]}
    for title, value in items:
        if not isinstance(title, str) or isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return {"type_data.facts": [f"Fact {str(title)[:40]!r}: titles are strings, values strings or numbers."]}
    return {}


def channel_configuration_problems(values: dict[str, Any]) -> dict[str, str]:
    """Problems of a channel's settings, by field: SMS needs its provider account."""
    problems: dict[str, str] = {}
    if values.get("channel") != "sms":
        for name in ("provider", "account_sid", "auth_token", "from_number"):
            if values.get(name):
                problems[name] = "Only the sms channel has this setting."
        return problems
    if values.get("provider") != "twilio":
        problems["provider"] = 'SMS needs a provider: "twilio".'
    sid = values.get("account_sid") or ""
    if not (sid.startswith("AC") and len(sid) == 34 and sid[2:].isalnum()):
        problems["account_sid"] = 'A Twilio account SID is "AC" followed by 32 letters and digits.'
    if not values.get("auth_token"):
        problems["auth_token"] = "The account's auth token is required."
    number_problem = phone_number_problem(values.get("from_number") or "")
    if number_problem:
        problems["from_number"] = number_problem
    api_problem = http_url_problem(values.get("api_base") or "", what="The API base URL")
    if api_problem:
        problems["api_base"] = api_problem
    return problems


# --- masking ------------------------------------------------------------------------------


def url_masked(url: str) -> str:
    """``url`` with any credentials hidden: the user information and the query (a Teams
    Workflows URL carries its signature there) become ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    if parts.username or parts.password:
        netloc = f"***@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def apprise_url_masked(url: str) -> str:
    """Apprise's own privacy form of ``url`` (secrets elided), or the scheme alone."""
    import apprise

    plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True) if url else None
    if plugin is None:
        return f"{url.split('://', 1)[0]}://***" if "://" in url else "***"
    return str(plugin.url(privacy=True))
