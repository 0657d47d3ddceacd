"""Email addresses with international domains (IDN) and local parts, as SMTP carries them.

* **Domains** are converted to their ASCII form (punycode, ``xn--``) with IDNA 2008 and the
  UTS #46 mapping, by the ``idna`` package (:data:`IDNA_IMPLEMENTATION`; without the package,
  Python's own IDNA 2003 codec), for the envelope (MAIL FROM, RCPT TO) and for the
  From, To, Cc and Reply-To headers: ``ops@bücher.example`` goes out as
  ``ops@xn--bcher-kva.example``, which every relay accepts.
* **Local parts** have no ASCII form. A non-ASCII local part is sent only to a server that
  offers SMTPUTF8 (RFC 6531), with the SMTPUTF8 parameter on MAIL FROM; to any other server
  that recipient fails on its own, permanently, with a message saying why.

:func:`email_address_refusal` is the one rule an address must pass, wherever it comes from: the
list editor, the configuration file, the SMTP configuration and the test email (through
:func:`email_address_problem`, which names the address), and the ``reply_to`` and ``cc`` of a
notification, which ingest checks and delivery reads again with the same function
(notifications.email_content). No control character (a line break, TAB, VT, FF, NEL, the line
and paragraph separators …: even inside a quoted local part, which Django's syntax check lets
through, it could end a header), Django's email syntax, and a domain that IDNA 2008 can encode
(Django's own check uses the older IDNA 2003 codec, which lets through characters that cannot
be delivered).
"""

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from notifications.list_names import text_control_problem

try:
    import idna
except ImportError:  # pragma: no cover - idna is in requirements.txt; the fallback keeps email working
    idna = None  # type: ignore[assignment]

# Which IDNA implementation converts domains: "idna" (IDNA 2008 + UTS #46, the package in
# requirements.txt) or "stdlib" (Python's "idna" codec: IDNA 2003, used only without it).
IDNA_IMPLEMENTATION = "idna" if idna is not None else "stdlib"


class AddressNotSendable(ValueError):
    """The address cannot be written in an SMTP command for this server."""


def domain_ascii(domain: str) -> str:
    """``domain`` in ASCII (punycode labels for non-ASCII ones); ASCII domains unchanged.
    Raises AddressNotSendable when IDNA 2008 refuses it."""
    if domain.isascii():
        return domain
    try:
        if idna is None:
            return domain.encode("idna").decode("ascii")
        return idna.encode(domain, uts46=True).decode("ascii")
    except (UnicodeError, ValueError) as exc:  # idna.IDNAError is a UnicodeError
        raise AddressNotSendable(f"the domain {domain!r} is not a valid internationalised domain name ({exc})") from exc


def address_ascii_domain(address: str) -> str:
    """``address`` with its domain in ASCII; the local part as it is."""
    local, at, domain = address.rpartition("@")
    if not at:
        return address
    return f"{local}@{domain_ascii(domain)}"


def envelope_address(address: str, *, smtputf8: bool) -> str:
    """``address`` as written in MAIL FROM or RCPT TO to a server that offers SMTPUTF8 or
    not. Raises AddressNotSendable for a non-ASCII local part without SMTPUTF8."""
    converted = address_ascii_domain(address)
    if not converted.isascii() and not smtputf8:
        raise AddressNotSendable(
            f"{address} has a non-ASCII local part, which needs the SMTPUTF8 extension; the SMTP server does not "
            "offer it"
        )
    return converted


def needs_smtputf8(addresses: list[str]) -> bool:
    """True when one of ``addresses`` stays non-ASCII after its domain is converted."""
    for address in addresses:
        try:
            if not address_ascii_domain(address).isascii():
                return True
        except AddressNotSendable:
            continue  # refused on its own by envelope_address
    return False


def email_address_control_refusal(address: str) -> str | None:
    """The control character ``address`` must not hold, as a sentence, or None (the first part
    of :func:`email_address_refusal`)."""
    problem = text_control_problem(address)
    if problem is None and "\t" in address:  # allowed in one-line text, never in an address
        problem = "Must not contain control characters (found U+0009)."
    return problem


def email_address_refusal(address: str) -> str | None:
    """Why ``address`` cannot be delivered to, as a sentence about it ("Must not contain control
    characters (found U+000C).", "Is not a valid email address.", "Cannot be delivered: …"), or
    None when it can."""
    problem = email_address_control_refusal(address)
    if problem is not None:
        return problem
    try:
        validate_email(address)
    except ValidationError:
        return "Is not a valid email address."
    try:
        address_ascii_domain(address)
    except AddressNotSendable as exc:
        return f"Cannot be delivered: {exc}."
    return None


def email_address_problem(address: str) -> str | None:
    """Why ``address`` cannot be stored for delivery, in words naming it, or None
    (:func:`email_address_refusal`)."""
    refusal = email_address_refusal(address)
    if refusal is None:
        return None
    return f"{address!r} {refusal[0].lower()}{refusal[1:]}"
