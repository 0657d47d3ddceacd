"""Encryption at rest for configuration secrets (the SMTP password).

Values are Fernet tokens (AES-128-CBC + HMAC-SHA256) under keys derived from
OUTBOX_SECRET_KEYS — by default from SECRET_KEY (and, where SECRET_KEY is generated, also the
former fixed development key, for decrypting only). The first key encrypts; every key decrypts,
so keys rotate without downtime: put the new key first, keep the old one after it, run
``manage.py rotate_secrets`` (re-encrypts with the new key), then drop the old key.
"""

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "fernet:"


class SecretDecryptionError(Exception):
    """A stored secret cannot be decrypted with any configured key."""


def _fernet() -> MultiFernet:
    keys = list(settings.OUTBOX_SECRET_KEYS or [settings.SECRET_KEY])
    if not settings.OUTBOX_SECRET_KEYS and getattr(settings, "SECRET_KEY_GENERATED", False):
        # Decrypt-only: what an installation without SECRET_KEY encrypted before its key was
        # generated (the former fixed development key). rotate_secrets re-encrypts it.
        keys.append(settings.LEGACY_DEVELOPMENT_SECRET_KEY)
    derived = [
        Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"outbox-secret-at-rest:" + key.encode()).digest()))
        for key in keys
    ]
    return MultiFernet(derived)


def secret_encrypt(plaintext: str) -> str:
    """The stored form of ``plaintext`` ("" stays "", meaning "no secret")."""
    if not plaintext:
        return ""
    return PREFIX + _fernet().encrypt(plaintext.encode()).decode()


def secret_decrypt(stored: str | None) -> str:
    """The plaintext of a stored secret. Values stored before encryption are returned as they
    are (they are encrypted on the next save or by rotate_secrets)."""
    if not stored or not stored.startswith(PREFIX):
        return stored or ""
    try:
        return _fernet().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise SecretDecryptionError(
            "A stored secret cannot be decrypted with the configured keys (OUTBOX_SECRET_KEYS / SECRET_KEY "
            "changed?). Restore the old key as a second OUTBOX_SECRET_KEYS entry, or re-enter the secret."
        ) from None
