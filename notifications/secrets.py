"""Encryption at rest for configuration secrets (the SMTP password).

Values are Fernet tokens (AES-128-CBC + HMAC-SHA256) under keys derived from
OUTBOX_SECRET_KEYS — by default from SECRET_KEY. The first key encrypts; every key decrypts,
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


def _fernet():
    keys = settings.OUTBOX_SECRET_KEYS or [settings.SECRET_KEY]
    derived = [
        Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"outbox-secret-at-rest:" + key.encode()).digest()))
        for key in keys
    ]
    return MultiFernet(derived)


def secret_encrypt(plaintext):
    """The stored form of ``plaintext`` ("" stays "", meaning "no secret")."""
    if not plaintext:
        return ""
    return PREFIX + _fernet().encrypt(plaintext.encode()).decode()


def secret_decrypt(stored):
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


def secret_needs_rotation(stored):
    """True when ``stored`` is plaintext or not encrypted with the first (current) key."""
    if not stored:
        return False
    if not stored.startswith(PREFIX):
        return True
    token = stored[len(PREFIX) :].encode()
    current = _fernet()._fernets[0]
    try:
        current.decrypt(token)
    except InvalidToken:
        return True
    return False


def check_secrets_decryptable(app_configs=None, **kwargs):
    """System check outbox.E001 (database tag, so run by migrate and `check --database default`):
    the stored SMTP password decrypts with the configured keys."""
    from django.core.checks import Error
    from django.db import DatabaseError

    from notifications.models import SmtpConfiguration

    try:
        SmtpConfiguration.objects.values_list("password", flat=True).first()
    except SecretDecryptionError as exc:
        return [Error(str(exc), id="outbox.E001")]
    except DatabaseError:
        pass  # no database or table yet (before migrate): nothing stored to check
    return []
