from typing import Any

from django.db import models

from notifications.secrets import secret_decrypt, secret_encrypt


class EncryptedTextField(models.TextField):
    """A text column stored encrypted (notifications.secrets); Python code sees plaintext."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        return secret_decrypt(value) if value is not None else value

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return secret_encrypt(value) if value else value
