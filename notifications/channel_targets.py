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
import functools
import hashlib
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_http_url = URLValidator(schemes=["http", "https"])


UNDECRYPTABLE = (
    "Its stored secret cannot be decrypted with the configured keys (OUTBOX_SECRET_KEYS / SECRET_KEY changed?): "
    "restore the old key as a second OUTBOX_SECRET_KEYS entry or re-enter it."
)


class Target(str):
    """One target as resolved for a delivery: the masked text, plus ``address`` (the real URL
    or number), ``secret`` (webhooks), ``ref``, and ``refusal``: why it must not be sent to at
    all (its secret does not decrypt, or was entered for another URL), or ""."""

    address: str
    secret: str
    ref: str
    refusal: str

    def __new__(
        cls, masked: str, *, address: str, secret: str = "", refusal: str = "", ref: str | None = None
    ) -> "Target":
        target = super().__new__(cls, masked)
        target.address = address
        target.secret = secret
        target.refusal = refusal
        target.ref = ref or target_ref(address or masked)
        return target


def target_ref(address: str) -> str:
    """A short, stable reference to a target that does not reveal it."""
    return hashlib.sha256(address.encode()).hexdigest()[:16]


# --- checks -------------------------------------------------------------------------------


def http_url_problem(value: Any, *, what: str = "URL", echo: bool = True) -> str | None:
    """An http(s) URL a delivery can post to, or what is wrong with it. ``echo``: the problem
    may quote the URL's start (not for a URL that is itself a secret)."""
    if not isinstance(value, str) or not value:
        return f"{what} is required."
    if len(value) > 2000:
        return f"{what} must be at most 2000 characters."
    try:
        _http_url(value)
    except ValidationError:
        return (
            f"{value[:80]!r} is not a valid http:// or https:// URL."
            if echo
            else (f"{what} is not a valid http:// or https:// URL.")
        )
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


def teams_type_data_stored(type_data: dict[str, Any]) -> dict[str, Any]:
    """A Teams notification's ``type_data`` as it is stored: as sent, except that ``facts``
    given as an object (title → value) becomes the equivalent list of ``{"title", "value"}``
    in the order sent — PostgreSQL's jsonb keeps no order of an object's keys (it sorts them),
    and the card shows the facts in the order the site gave them. The fingerprint is of what
    was sent, so a replay of either form is judged as before."""
    facts = type_data.get("facts")
    if not isinstance(facts, dict):
        return type_data
    return {**type_data, "facts": [{"title": title, "value": value} for title, value in facts.items()]}


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


# --- what a site sees -----------------------------------------------------------------------
#
# A site learns how its notification went, not who its lists reach: every target a site can read
# (the status record's targets, its last_error, a command's reason) goes through
# :func:`target_site_masked` or :func:`text_site_masked`. Staff see the stored forms.

MASK = "***"


def email_masked(address: str) -> str:
    """``o***@example.com``: the first character of the local part, and the domain."""
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return MASK
    return f"{local[0]}{MASK}@{domain}"


def phone_masked(number: str) -> str:
    """``+49***456``: the country calling code (by ``phonenumbers``) and the last three digits;
    ``+***456`` when the country code is not one the library knows."""
    import phonenumbers

    digits = "".join(character for character in number if character.isdigit())
    if len(digits) < 7:
        return MASK
    try:
        country = f"+{phonenumbers.parse('+' + digits).country_code}"
    except phonenumbers.NumberParseException:
        country = "+"
    return f"{country}{MASK}{digits[-3:]}"


def url_host(url: str) -> str:
    """The host of ``url`` alone (no scheme, credentials, port, path or query), or ``***``."""
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        return MASK
    return host or MASK


def apprise_url_site_masked(url: str) -> str:
    """``scheme://host`` for an Apprise service addressed at a server of its own (``json://``,
    ``mailto://``, ``ntfy://`` on one's own server …), ``scheme://`` for the others, whose URL
    starts with a token or a topic instead (``tgram://``, ``slack://``, ntfy's public server).
    ``url`` may be Apprise's privacy form; one that Apprise cannot read shows its scheme only."""
    scheme, separator, _ = url.partition("://")
    if not separator or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,31}", scheme):
        return MASK
    host = _apprise_server(url)
    return f"{scheme.lower()}://{host}"


@functools.lru_cache(maxsize=1024)
def _apprise_server(url: str) -> str:
    """The server ``url`` (an Apprise URL) names, or "" when its service has none."""
    import apprise
    from apprise.manager_plugins import NotificationManager

    scheme = url.partition("://")[0].lower()
    plugins = NotificationManager()
    # Only a service whose URL templates name a {host} has a server; for the others Apprise keeps
    # the URL's first token (a bot token, a webhook id) where the host would be.
    if scheme not in plugins or "host" not in getattr(plugins[scheme], "template_tokens", {}):
        return ""
    plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    host = getattr(plugin, "host", "") if plugin is not None else ""
    return host if isinstance(host, str) else ""


def target_site_masked(*, channel: str, target: str) -> str:
    """One target as a site sees it: an email address as ``o***@example.com``, a phone number as
    ``+49***456``, a Teams or webhook URL as its host, an Apprise URL as its scheme (and host
    when the service has one), the local relay of a site that delivered a row itself as stored.
    ``target`` is the form stored in ``resolved_targets``."""
    if not isinstance(target, str) or not target:
        return MASK
    if channel == "email":
        return email_masked(target)
    if channel == "sms":
        return phone_masked(target)
    if channel in ("teams", "webhook"):
        return url_host(target)
    if channel == "apprise":
        return apprise_url_site_masked(target)
    if channel == "site":
        return target  # the site's own relay, named by the site id (notifications.local_delivery)
    return MASK


# In free text (an SMTP reply, a provider's message): URLs, then email addresses, then E.164
# numbers. A URL goes first because its user information looks like an address.
_TEXT_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31})://[^\s<>\"'`]*")
_TEXT_EMAIL = re.compile(r"[\w.!#$%&*+/=?^{|}~-]+@[\w-]+(?:\.[\w-]+)*")
_TEXT_PHONE = re.compile(r"(?<![\w+])\+[1-9][0-9]{6,14}(?![0-9])")
_TRAILING_PUNCTUATION = ".,;:!?)]}"


def text_site_masked(text: str) -> str:
    """``text`` with every URL, email address and phone number in it masked as targets are for
    sites: an http(s) URL becomes its host, another URL its scheme (and host, as Apprise
    URLs), an address ``o***@example.com``, a number ``+49***456``."""
    if not text:
        return text
    text = _TEXT_URL.sub(_url_in_text_masked, text)
    text = _TEXT_EMAIL.sub(lambda match: email_masked(match.group()), text)
    return _TEXT_PHONE.sub(lambda match: phone_masked(match.group()), text)


def _url_in_text_masked(match: re.Match[str]) -> str:
    url = match.group()
    kept = url.rstrip(_TRAILING_PUNCTUATION)
    trailing = url[len(kept) :]
    if match.group(1).lower() in ("http", "https"):
        return url_host(kept) + trailing
    return apprise_url_site_masked(kept) + trailing
