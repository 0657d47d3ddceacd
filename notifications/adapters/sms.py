"""SMS through the Twilio Messages REST API (docs/channels.md).

One message per phone number: ``POST {api_base}/2010-04-01/Accounts/{sid}/Messages.json``
(form fields ``To``, ``From``, ``Body`` and, when OUTBOX_PUBLIC_URL is set, ``StatusCallback``
pointing at central's status callback endpoint), authenticated with the account SID and auth
token. The text is the subject and the body, cut to the configured number of segments.
Twilio's answer gives the message's ``sid`` (kept as the target's ``provider_id``, so status
callbacks find it) and its first status.

Twilio's error codes are classified in :func:`twilio_failure`; the HTTP status decides for
codes not named there (429 throttled, 5xx transient, other 4xx refused).
"""

from collections.abc import Callable
from typing import Any

import httpx
from django.conf import settings
from django.urls import reverse

from notifications.ack_links import ack_link, sms_ack_code
from notifications.adapters.base import DeliveryError, DeliveryResult, FailureClass
from notifications.adapters.http import TargetOutcome, TargetsAdapter, TargetsSession, http_exception, http_failure
from notifications.channel_targets import Target
from notifications.models import ChannelConfiguration, Notification
from notifications.secret_binding import secret_binding_problem
from notifications.secrets import SecretDecryptionError

# The GSM 03.38 alphabet: a text only of these is sent 7-bit (160 characters a segment);
# anything else makes the whole text UCS-2 (70 UTF-16 units a segment).
GSM_BASIC = set(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§"
    "¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM_EXTENDED = set("^{}\\[~]|€\f")  # two septets each
ELLIPSIS_GSM = "..."
ELLIPSIS_UCS2 = "…"

# Twilio error codes whose meaning is narrower than their HTTP status.
# Permanent for that number: it is not a valid, reachable mobile number, or it opted out.
RECIPIENT_CODES = {21211, 21214, 21217, 21219, 21407, 21408, 21610, 21612, 21614, 30003, 30005, 30006}
# Permanent until the configuration changes: our From number or account cannot send.
CONFIGURATION_CODES = {20003, 20404, 21212, 21606, 21659, 21660, 21661}
THROTTLED_CODES = {20429, 14107, 30022}


# Room a message keeps for its subject and body before an acknowledgement link is added; when
# the link would leave less, the SMS carries only the reply code (the link needs two segments).
MIN_TEXT_BESIDE_LINK = 60


def sms_text(*, subject: str, body: str, max_segments: int, ack_code: str = "", ack_link: str = "") -> str:
    """Subject and body on separate lines, cut (with an ellipsis) to fit ``max_segments``. With
    ``ack_code``, a last line "Reply ACK <code>" is kept whole after them, with ``ack_link``
    ("… or open <link>") when that leaves MIN_TEXT_BESIDE_LINK characters for the message."""
    text = "\n".join(part for part in (subject.strip(), body.strip()) if part)
    if not ack_code:
        return _fitted(text, max_segments=max_segments)
    footer = f"Reply ACK {ack_code}"
    if ack_link:
        with_link = f"{footer} or open {ack_link}"
        limit, cost, _ = _alphabet(text + with_link, max_segments=max_segments)
        if limit - cost(with_link) - 1 >= MIN_TEXT_BESIDE_LINK:
            footer = with_link
    return _fitted(text, max_segments=max_segments, reserve=footer) + "\n" + footer


def _alphabet(text: str, *, max_segments: int) -> tuple[int, Callable[[str], int], str]:
    """For ``text``: the characters ``max_segments`` hold, the cost of a text, the ellipsis."""
    if all(ch in GSM_BASIC or ch in GSM_EXTENDED for ch in text):
        limit = 160 if max_segments == 1 else 153 * max_segments
        return limit, lambda s: sum(2 if ch in GSM_EXTENDED else 1 for ch in s), ELLIPSIS_GSM
    limit = 70 if max_segments == 1 else 67 * max_segments
    return limit, lambda s: len(s.encode("utf-16-le")) // 2, ELLIPSIS_UCS2


def _fitted(text: str, *, max_segments: int, reserve: str = "") -> str:
    """``text`` cut (with an ellipsis) so that it, a line break and ``reserve`` fit ``max_segments``."""
    limit, cost, ellipsis = _alphabet(text + reserve, max_segments=max_segments)
    if reserve:
        limit -= cost(reserve) + 1
    if cost(text) <= limit:
        return text
    room = limit - cost(ellipsis)
    kept: list[str] = []
    used = 0
    for ch in text:
        size = cost(ch)
        if used + size > room:
            break
        kept.append(ch)
        used += size
    return "".join(kept).rstrip() + ellipsis


def status_callback_url() -> str | None:
    base = settings.OUTBOX_PUBLIC_URL
    return base + reverse("provider-twilio-status") if base else None


def twilio_failure(response: httpx.Response) -> TargetOutcome:
    """The outcome of a Twilio error answer (``{"code", "message", "more_info", "status"}``)."""
    try:
        error: Any = response.json()
    except ValueError:
        error = {}
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(code, int):
        return http_failure(response)
    detail = f"Twilio error {code} (HTTP {response.status_code}): {message or ''}".strip()
    if code in RECIPIENT_CODES:
        # Permanent for this number: Twilio says it is invalid, unreachable or opted out.
        return TargetOutcome(
            "refused",
            detail,
            FailureClass.RECIPIENT_REJECTED,
            http_status=response.status_code,
            extra={"provider_code": code},
        )
    if code in CONFIGURATION_CODES:
        # Permanent until an administrator fixes the account or the From number.
        return TargetOutcome(
            "refused",
            detail,
            FailureClass.CONFIGURATION,
            http_status=response.status_code,
            extra={"provider_code": code},
        )
    if code in THROTTLED_CODES:
        outcome = http_failure(response)
        return TargetOutcome(
            "deferred",
            detail,
            FailureClass.THROTTLED,
            outcome.retry_after,
            response.status_code,
            {"provider_code": code},
        )
    outcome = http_failure(response)
    outcome.detail = detail
    outcome.extra = {"provider_code": code}
    return outcome


class SmsAdapter(TargetsAdapter):
    channel = "sms"

    def endpoint(self) -> str | None:
        api_base = ChannelConfiguration.objects.filter(channel=self.channel).values_list("api_base", flat=True).first()
        return api_base or None

    def open_session(self) -> "SmsSession":
        try:
            config = ChannelConfiguration.objects.filter(channel=self.channel).first()
        except SecretDecryptionError as exc:
            # Fail closed, with the reason: the auth token is stored but unreadable.
            raise DeliveryError(
                f"The sms channel's auth token: {exc}", failure_class=FailureClass.CONFIGURATION
            ) from None
        problem = config and secret_binding_problem(instance=config, secret="auth_token")
        if problem:
            # Fail closed: the token was entered for another API base URL or account, which
            # was changed behind the console's back; it goes nowhere until entered again.
            raise DeliveryError(f"The sms channel: {problem}", failure_class=FailureClass.CONFIGURATION)
        return SmsSession(config=config)


class SmsSession(TargetsSession):
    channel = "sms"

    def __init__(self, *, config: ChannelConfiguration | None) -> None:
        complete = config is not None and all(
            (config.provider, config.account_sid, config.auth_token, config.from_number, config.api_base)
        )
        # A snapshot, so that the delivery threads never read the database.
        self.configured = complete
        self.account_sid = config.account_sid if config else ""
        self.auth_token = config.auth_token if config else ""
        self.from_number = config.from_number if config else ""
        self.api_base = (config.api_base if config else "").rstrip("/")
        self.max_segments = config.max_segments if config else 1
        self.callback = status_callback_url()
        super().__init__(timeout=config.timeout_seconds if config else ChannelConfiguration.DEFAULT_TIMEOUT_SECONDS)

    def deliver(self, notification: Notification, targets: list[str]) -> DeliveryResult:
        if not self.configured:
            # Fail closed: without a provider account nothing can be sent.
            raise DeliveryError(
                f"List {notification.list_name!r}: the sms channel has no complete configuration "
                "(provider, account SID, auth token, from number, API base); an administrator must configure it.",
                failure_class=FailureClass.CONFIGURATION,
            )
        return super().deliver(notification, targets)

    def send_one(self, notification: Notification, target: Target) -> TargetOutcome:
        form = {
            "To": target.address,
            "From": self.from_number,
            "Body": sms_text(
                subject=notification.subject,
                body=notification.body,
                max_segments=self.max_segments,
                ack_code=sms_ack_code(notification.notification_id) if notification.asks_ack else "",
                ack_link=ack_link(notification=notification, recipient=target.address) or "",
            ),
        }
        if self.callback:
            form["StatusCallback"] = self.callback
        url = f"{self.api_base}/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        try:
            response = self.http.post(url, data=form, auth=(self.account_sid, self.auth_token))
        except httpx.HTTPError as exc:
            return http_exception(exc)
        if not response.is_success:
            return twilio_failure(response)
        try:
            message = response.json()
        except ValueError:
            message = {}
        sid = message.get("sid") if isinstance(message, dict) else None
        status = message.get("status") if isinstance(message, dict) else None
        extra: dict[str, Any] = {}
        if isinstance(sid, str):
            extra["provider"] = "twilio"
            extra["provider_id"] = sid
        if isinstance(status, str):
            extra["provider_status"] = status
        return TargetOutcome(
            "delivered",
            f"HTTP {response.status_code}: accepted by Twilio",
            http_status=response.status_code,
            extra=extra,
        )
