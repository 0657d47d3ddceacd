"""OAuth 2.0 access tokens for SMTP AUTH XOAUTH2 (Microsoft 365 / Exchange Online).

The client-credentials flow of an app registration (tenant id, client id, and a client secret
or a client certificate: a PEM file with the certificate and its RSA private key) with
Microsoft's own library, ``msal``: ``ConfidentialClientApplication.acquire_token_for_client``
with the scope ``https://outlook.office365.com/.default``. The application objects are kept
per (authority, tenant, client id, credential), so msal's in-memory token cache serves the same
token to every connection and every dispatch pass until shortly before it expires; msal then
fetches a new one. The authority is configurable (``oauth_authority``, by default
``https://login.microsoftonline.com``) for national clouds, and so that tests can answer the
token requests with a local HTTPS server.
"""

import threading
from typing import Any

from notifications.adapters.base import DeliveryError, FailureClass
from notifications.adapters.smtp_connect import ConnectFailure, ConnectSettings

DEFAULT_AUTHORITY = "https://login.microsoftonline.com"
SCOPE = "https://outlook.office365.com/.default"
# Errors of the token endpoint that mean the request itself is wrong (not a passing outage).
_CREDENTIAL_ERRORS = frozenset({"invalid_client", "unauthorized_client", "invalid_request", "invalid_scope"})

_apps: dict[tuple[str, str, str, str], Any] = {}
_apps_lock = threading.Lock()


def oauth_token(settings: ConnectSettings) -> str:
    """An access token for ``settings`` (cached by msal). Raises ConnectFailure: class ``auth``
    when the token endpoint refuses the credentials (the channel waits until they are fixed),
    ``connection`` when it cannot be reached, ``configuration`` when a setting is missing."""
    missing = [name for name in ("oauth_tenant_id", "oauth_client_id") if not getattr(settings, name).strip()]
    if not settings.oauth_client_secret and not settings.oauth_client_certificate:
        missing.append("oauth_client_secret or oauth_client_certificate")
    if missing:
        raise ConnectFailure(
            DeliveryError(
                f"XOAUTH2 needs {', '.join(missing)} in the SMTP configuration.",
                failure_class=FailureClass.CONFIGURATION,
                detail={"stage": "AUTH"},
            )
        )
    credential = _credential(settings)
    try:
        result = _application(settings, credential).acquire_token_for_client(scopes=[SCOPE])
    except ValueError as exc:
        # msal could not use the authority (unknown tenant, discovery refused).
        raise ConnectFailure(
            DeliveryError(
                f"OAuth token request failed: {exc}"[:2000], failure_class=FailureClass.AUTH, detail={"stage": "AUTH"}
            )
        ) from exc
    except Exception as exc:  # requests' connection errors, TLS failures, bad JSON
        raise ConnectFailure(
            DeliveryError(
                f"OAuth token endpoint unreachable: {type(exc).__name__}: {exc}"[:2000],
                failure_class=FailureClass.CONNECTION,
                detail={"stage": "AUTH"},
            )
        ) from exc
    if "access_token" in result:
        return str(result["access_token"])
    error = str(result.get("error", "unknown_error"))
    description = str(result.get("error_description", "")).splitlines()[0] if result.get("error_description") else ""
    hint = " Check the tenant id, client id and client secret." if error in _CREDENTIAL_ERRORS else ""
    raise ConnectFailure(
        DeliveryError(
            f"OAuth token request refused: {error} {description}".strip() + "." + hint,
            failure_class=FailureClass.AUTH,
            detail={"stage": "AUTH", "oauth_error": error},
        )
    )


def _credential(settings: ConnectSettings) -> str | dict[str, str]:
    """msal's client credential: the secret, or the certificate's private key and SHA-1
    thumbprint read from ``oauth_client_certificate`` (a ConnectFailure of class
    ``configuration`` naming the file when it does not load)."""
    if not settings.oauth_client_certificate:
        return settings.oauth_client_secret
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    path = settings.oauth_client_certificate
    try:
        with open(path, "rb") as handle:
            pem = handle.read()
        certificate = x509.load_pem_x509_certificate(pem)
        key = serialization.load_pem_private_key(pem, password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConnectFailure(
            DeliveryError(
                f"The OAuth client certificate {path!r} cannot be loaded (a PEM file with the certificate and its "
                f"unencrypted private key is needed): {exc}",
                failure_class=FailureClass.CONFIGURATION,
                detail={"stage": "AUTH"},
            )
        ) from exc
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"private_key": key_pem, "thumbprint": certificate.fingerprint(hashes.SHA1()).hex()}


def _application(settings: ConnectSettings, credential: str | dict[str, str]) -> Any:
    import msal

    authority = (settings.oauth_authority or DEFAULT_AUTHORITY).rstrip("/")
    secret = credential if isinstance(credential, str) else credential["thumbprint"] + credential["private_key"]
    key = (authority, settings.oauth_tenant_id.strip(), settings.oauth_client_id.strip(), secret)
    with _apps_lock:
        app = _apps.get(key)
        if app is None:
            app = msal.ConfidentialClientApplication(
                key[2],
                client_credential=credential,
                authority=f"{authority}/{key[1]}",
                # Microsoft's hosts are known to msal; a national cloud or test authority is
                # taken as configured rather than looked up at login.microsoftonline.com.
                validate_authority=authority == DEFAULT_AUTHORITY,
                instance_discovery=None if authority == DEFAULT_AUTHORITY else False,
                timeout=settings.timeout,
            )
            _apps[key] = app
    return app


def oauth_cache_clear() -> None:
    """Forget every application and its cached tokens (tests, or after rotating a secret)."""
    with _apps_lock:
        _apps.clear()
