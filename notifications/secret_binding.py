"""A stored credential is only ever sent to the destination it was entered for (docs/security.md).

:data:`BINDINGS` declares, per model and credential field, the destination fields the
credential is bound to. Every path that can keep a stored credential while other fields change
(the console's forms and their connection tests, the configuration file) asks
:func:`secret_kept_problem` first: a destination changed without the credential entered again
is refused, with the fields that changed named.

Beside each credential a digest of the destination it was entered for is stored
(``<field>_binding``: HMAC-SHA256 keyed with the credential itself, so it reveals nothing and
cannot be made without knowing the credential). It is set whenever the credential is entered
(:func:`secret_bind`; a model save that stores a new value does it too, see
:func:`secrets_bind_changed`) and never when only the destination changes. The adapters ask
:func:`secret_binding_problem` before sending: a credential whose destination changed behind the
forms' back (the Django shell, a direct UPDATE, a future API) is not sent, and delivery fails
as a ``configuration`` problem saying to enter it again.

Teams and Apprise URLs carry their credentials in the URL itself: they are always entered
whole, so they need no binding.

A leaf module: it knows field names, never the models.
"""

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from notifications.secrets import SecretDecryptionError


@dataclass(frozen=True)
class Binding:
    """One credential field and the destination fields it is bound to. ``label`` and
    ``destination`` are the words of the messages ("the stored <label> is only ever sent to the
    <destination> it was entered for"); ``removable``: the console and the file may clear it."""

    secret: str
    fields: tuple[str, ...]
    label: str
    destination: str
    removable: bool = True

    @property
    def binding_field(self) -> str:
        return f"{self.secret}_binding"


_SMTP_SERVER = ("host", "port", "security")
# The OAuth credential goes to the token endpoint (authority and tenant), and the access token
# obtained with it goes to the SMTP server.
_SMTP_OAUTH = (*_SMTP_SERVER, "oauth_authority", "oauth_tenant_id")

# By the model's ``_meta.model_name``.
BINDINGS: dict[str, tuple[Binding, ...]] = {
    "smtpconfiguration": (
        Binding("password", _SMTP_SERVER, "password", "server"),
        Binding("oauth_client_secret", _SMTP_OAUTH, "OAuth client secret", "token endpoint and server"),
        Binding("oauth_client_certificate", _SMTP_OAUTH, "OAuth client certificate path", "token endpoint and server"),
    ),
    "channelconfiguration": (
        Binding("auth_token", ("api_base", "account_sid"), "auth token", "API and account", removable=False),
    ),
    "webhooktarget": (Binding("secret", ("url",), "signing secret", "URL", removable=False),),
}


def bindings_of(instance: Any) -> tuple[Binding, ...]:
    """The bound credentials of ``instance``'s model (none for a model without credentials)."""
    return BINDINGS.get(instance._meta.model_name, ())


def binding_of(instance: Any, secret: str) -> Binding:
    """The binding of ``instance``'s credential field ``secret`` (KeyError if it has none)."""
    for binding in bindings_of(instance):
        if binding.secret == secret:
            return binding
    raise KeyError(f"{instance._meta.model_name}.{secret} is not a bound credential")


def secret_digest(*, binding: Binding, secret: str, values: Mapping[str, Any]) -> str:
    """The digest binding ``secret`` to the destination ``values`` (by field name); "" for no secret.
    Values are compared as text, so a port read back from the database or typed into a form
    digests alike."""
    if not secret:
        return ""
    destination = json.dumps([binding.secret, [str(values.get(name, "")) for name in binding.fields]])
    return hmac.new(secret.encode(), destination.encode(), hashlib.sha256).hexdigest()


def binding_problem(*, binding: Binding, secret: str, values: Mapping[str, Any], digest: str) -> str | None:
    """Why ``secret``, stored with ``digest``, must not be sent to the destination ``values``,
    or None (no secret, or the digest is the destination's)."""
    if not secret or hmac.compare_digest(digest, secret_digest(binding=binding, secret=secret, values=values)):
        return None
    return (
        f"The stored {binding.label} was entered for another {binding.destination} (its "
        f"{_words(binding.fields)} changed since without it being entered again), so it is not sent. "
        f"An administrator must enter the {binding.label} again."
    )


def secret_binding_problem(*, instance: Any, secret: str) -> str | None:
    """Why ``instance``'s credential ``secret`` must not be sent where ``instance`` now points,
    or None. A configuration built in memory and never saved (a test, the console testing a new
    configuration) holds what its maker gave it: without a digest, its credential counts as
    entered for its own values."""
    binding = binding_of(instance, secret)
    digest = getattr(instance, binding.binding_field)
    if not digest and instance._state.adding:
        return None
    return binding_problem(binding=binding, secret=getattr(instance, secret), values=_values(instance), digest=digest)


def secret_kept_problem(*, stored: Any | None, secret: str, changes: Mapping[str, Any]) -> str | None:
    """Why ``stored``'s credential ``secret`` may not be kept with ``changes`` (new values by
    field name; fields not in it keep their stored values), in words, or None. It may not when
    a destination field it is bound to changes: whoever moves the destination must know the
    credential, or the next connection would hand it to a server of their choosing. Nor when
    its digest already does not match (its destination was changed behind the forms' back):
    keeping it would bind it to that destination. Nothing stored: None."""
    if stored is None or getattr(stored, "pk", None) is None:
        return None
    binding = binding_of(stored, secret)
    value = getattr(stored, secret)
    if not value:
        return None
    moved = [name for name in binding.fields if name in changes and str(changes[name]) != str(getattr(stored, name))]
    again = f"Re-enter the {binding.label}" + (" (or remove it)" if binding.removable else "")
    if moved:
        return (
            f"{again}: the {_words(moved, 'and')} changed, and the stored {binding.label} is only ever sent to the "
            f"{binding.destination} it was entered for."
        )
    if binding_problem(
        binding=binding, secret=value, values=_values(stored), digest=getattr(stored, binding.binding_field)
    ):
        return (
            f"{again}: the stored {binding.label} was not entered for the current {_words(binding.fields)} (they "
            "were changed outside the console and the configuration file), so it is not sent anywhere."
        )
    return None


def secret_bind(*, instance: Any, secret: str) -> None:
    """Bind ``instance``'s credential ``secret`` to where ``instance`` points now: call when the
    credential is entered (not when only the destination changes)."""
    binding = binding_of(instance, secret)
    value = getattr(instance, secret)
    setattr(instance, binding.binding_field, secret_digest(binding=binding, secret=value, values=_values(instance)))


def secrets_bind_changed(*, instance: Any, update_fields: Iterable[str] | None) -> list[str] | None:
    """Before ``instance`` is saved: bind the credentials it stores anew (a new row, or a value
    other than the stored one), so that whatever path stores a credential binds it to the
    destination it is stored with. A credential saved unchanged keeps its digest, even when
    its destination changed. Returns ``update_fields`` with the digests it changed added."""
    bindings = bindings_of(instance)
    if update_fields is not None:
        update_fields = list(update_fields)
        bindings = tuple(binding for binding in bindings if binding.secret in update_fields)
    if not bindings:
        return update_fields
    stored: Mapping[str, Any] = {}
    new = instance._state.adding or instance.pk is None
    if not new:
        names = [binding.secret for binding in bindings]
        try:
            stored = type(instance)._default_manager.filter(pk=instance.pk).values(*names).first() or {}
        except SecretDecryptionError:
            stored = {}  # unreadable: what is saved now is what was entered
    for binding in bindings:
        value = getattr(instance, binding.secret)
        if new or binding.secret not in stored or stored[binding.secret] != value:
            secret_bind(instance=instance, secret=binding.secret)
            if update_fields is not None and binding.binding_field not in update_fields:
                update_fields.append(binding.binding_field)
    return update_fields


def teams_url_digest(url: str) -> str:
    """What tells two stored Teams URLs apart (their encrypted forms always differ): SHA-256 of
    the URL. It reveals nothing usable: the URL's signature is 256 random bits."""
    return hashlib.sha256(url.encode()).hexdigest()


def _values(instance: Any) -> dict[str, Any]:
    fields = {name for binding in bindings_of(instance) for name in binding.fields}
    return {name: getattr(instance, name) for name in fields}


def _words(names: Iterable[str], conjunction: str = "or") -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}"
