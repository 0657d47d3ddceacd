"""Resolving the list targets of the channels beyond email for a delivery, at delivery time:
each list's targets for one channel as :class:`~notifications.channel_targets.Target` objects
(the masked text the audit shows, with the real address and secret for the adapter)."""

from collections.abc import Iterable

from django.db.models import TextField
from django.db.models.functions import Cast

from notifications.channel_targets import UNDECRYPTABLE, Target, target_ref, url_masked
from notifications.list_names import notification_lists_by_name
from notifications.models import AppriseTarget, SmsTarget, TeamsTarget, WebhookTarget
from notifications.secret_binding import BINDINGS, binding_problem
from notifications.secrets import SecretDecryptionError, secret_decrypt


def targets_resolve(*, channel: str, list_names: Iterable[str]) -> dict[str, list[str]]:
    """``{list_name: [Target, …]}`` of ``channel`` for the named lists that exist (matched as
    notifications.list_names compares names); a list without targets for the channel maps to
    an empty list."""
    found = notification_lists_by_name(names=set(list_names))
    by_pk: dict[int, list[str]] = {item.pk: [] for item in found.values()}
    if by_pk:
        if channel == "teams":
            teams = TeamsTarget.objects.filter(notification_list__in=list(by_pk)).values_list(
                "notification_list_id", "url_digest", Cast("url", TextField())
            )
            for list_id, digest, stored in teams:
                url = _decrypted(stored)
                if url is None:
                    # Told apart from the list's other Teams targets by the URL's digest.
                    masked = "(a Teams URL)"
                    by_pk[list_id].append(Target(masked, address="", refusal=UNDECRYPTABLE, ref=target_ref(digest)))
                else:
                    by_pk[list_id].append(Target(url_masked(url), address=url))
        elif channel == "webhook":
            binding = BINDINGS["webhooktarget"][0]
            rows = WebhookTarget.objects.filter(notification_list__in=list(by_pk)).values_list(
                "notification_list_id", "url", Cast("secret", TextField()), "secret_binding"
            )
            for list_id, url, stored, digest in rows:
                secret = _decrypted(stored)
                if secret is None:
                    refusal = UNDECRYPTABLE
                else:
                    # Defence in depth: a secret whose URL changed behind the forms' back is not sent.
                    refusal = binding_problem(binding=binding, secret=secret, values={"url": url}, digest=digest) or ""
                by_pk[list_id].append(Target(url_masked(url), address=url, secret=secret or "", refusal=refusal))
        elif channel == "sms":
            for list_id, number in SmsTarget.objects.filter(notification_list__in=list(by_pk)).values_list(
                "notification_list_id", "phone_number"
            ):
                by_pk[list_id].append(Target(number, address=number))
        elif channel == "apprise":
            services = AppriseTarget.objects.filter(notification_list__in=list(by_pk)).values_list(
                "notification_list_id", "display", Cast("url", TextField())
            )
            for list_id, display, stored in services:
                service_url = _decrypted(stored)
                by_pk[list_id].append(
                    Target(
                        display or "***",
                        address=service_url or "",
                        refusal=UNDECRYPTABLE if service_url is None else "",
                    )
                )
        else:
            raise ValueError(f"no list targets for channel {channel!r}")
    return {name: by_pk[item.pk] for name, item in found.items()}


def _decrypted(stored: str) -> str | None:
    """The plaintext of a stored secret, or None when the configured keys cannot decrypt it
    (that target is then refused with a message saying so; the others are delivered)."""
    try:
        return secret_decrypt(stored)
    except SecretDecryptionError:
        return None
