"""SMS through a fake of Twilio's Messages API over real HTTP, and Twilio's status callbacks
into central (a live server) signed as Twilio signs them."""

import pytest
from django.urls import reverse
from twilio.request_validator import RequestValidator

from notifications.adapters.sms import sms_text
from notifications.models import DeliveryAttempt, Notification, ProviderMessage, SmsTarget
from tests.channels.conftest import AUTH_TOKEN, configure_sms, make_due
from tests.dispatch.conftest import fresh, queue, run_pass

Status = Notification.Status
ALICE, BOB, CAROL = "+4930123456", "+4930123457", "+4930123458"


def add_numbers(channel_list, *numbers):
    for number in numbers:
        SmsTarget.objects.create(notification_list=channel_list, phone_number=number)


def queue_sms(**overrides):
    overrides.setdefault("type", "sms")
    overrides.setdefault("list_name", "Channels")
    (notification,) = queue(**overrides)
    return notification


@pytest.fixture
def central(live_server, settings):
    """Central served over real HTTP, and told its public address (the callback URL)."""
    settings.OUTBOX_PUBLIC_URL = live_server.url
    return live_server


def test_each_number_gets_one_message_with_the_status_callback_and_its_sid_is_kept(channel_list, twilio, central):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE, BOB)
    notification = queue_sms(subject="Pump 3 tripped", body="Overcurrent")
    assert run_pass().delivered == 1
    forms = sorted((request.form() for request in twilio.received), key=lambda form: form["To"])
    assert [form["To"] for form in forms] == [ALICE, BOB]
    assert forms[0]["From"] == "+15005550006"
    assert forms[0]["Body"] == "Pump 3 tripped\nOvercurrent"
    assert forms[0]["StatusCallback"] == central.url + "/api/v1/providers/twilio/status/"
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    for entry in notification.resolved_targets:
        assert entry["channel"] == "sms"
        assert entry["provider_id"].startswith("SM") and entry["provider_status"] == "queued"
    assert ProviderMessage.objects.filter(notification=notification).count() == 2


def test_a_signed_status_callback_records_the_provider_status_and_a_replay_changes_nothing(
    channel_list, twilio, central, api
):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE)
    notification = queue_sms()
    run_pass()
    (sid,) = twilio.messages
    assert twilio.callback(sid, "sent").status_code == 200
    response = twilio.callback(sid, "delivered")
    assert response.status_code == 200 and response.json() == {"recorded": True}
    (entry,) = fresh(notification).resolved_targets
    assert entry["provider_status"] == "delivered" and entry["provider_status_at"]
    stamped = entry["provider_status_at"]

    replay = twilio.callback(sid, "delivered")
    assert replay.status_code == 200 and replay.json() == {"recorded": False}
    late = twilio.callback(sid, "sent")  # out of order: never moves a target back
    assert late.status_code == 200 and late.json() == {"recorded": False}
    (entry,) = fresh(notification).resolved_targets
    assert (entry["provider_status"], entry["provider_status_at"]) == ("delivered", stamped)

    # The site sees it in the status record's targets (the number masked).
    record = api.get(f"/api/v1/notifications/{notification.pk}/").json()
    (target,) = record["targets"]
    assert target["channel"] == "sms" and target["target"] == "+49***456"
    assert (target["outcome"], target["provider_status"]) == ("delivered", "delivered")


def test_an_undelivered_callback_carries_twilio_error_code_into_the_status_records_targets(
    channel_list, twilio, central, api
):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE)
    notification = queue_sms()
    run_pass()
    (sid,) = twilio.messages
    (target,) = api.get(f"/api/v1/notifications/{notification.pk}/").json()["targets"]
    assert "provider_error_code" not in target  # none yet
    assert twilio.callback(sid, "undelivered", error_code="30003").status_code == 200
    (entry,) = fresh(notification).resolved_targets
    assert (entry["provider_status"], entry["provider_error_code"]) == ("undelivered", "30003")
    # The notification stays Delivered: the provider accepted it; the target shows what happened next.
    assert fresh(notification).status == Status.DELIVERED
    (target,) = api.get(f"/api/v1/notifications/{notification.pk}/").json()["targets"]
    assert (target["provider_status"], target["provider_error_code"]) == ("undelivered", "30003")


def test_the_error_code_twilio_refused_a_number_with_is_in_the_status_records_targets(channel_list, twilio, api):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE, twilio.INVALID)
    notification = queue_sms()
    run_pass()
    targets = api.get(f"/api/v1/notifications/{notification.pk}/").json()["targets"]
    by_outcome = {target["outcome"]: target for target in targets}
    assert by_outcome["refused"]["provider_error_code"] == "21211"
    assert "provider_error_code" not in by_outcome["delivered"]


@pytest.mark.parametrize("signature", ["", "bm90IHRoZSBzaWduYXR1cmU="])
def test_a_callback_with_a_missing_or_wrong_signature_is_403_and_changes_nothing(
    channel_list, twilio, central, signature
):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE)
    notification = queue_sms()
    run_pass()
    (sid,) = twilio.messages
    before = fresh(notification).resolved_targets
    response = twilio.callback(sid, "delivered", signature=signature)
    assert response.status_code == 403
    assert fresh(notification).resolved_targets == before
    assert ProviderMessage.objects.get(provider_id=sid).provider_status == ""


def test_a_callback_signed_with_another_token_is_403(channel_list, twilio, central):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE)
    queue_sms()
    run_pass()
    (sid,) = twilio.messages
    url = central.url + reverse("provider-twilio-status")
    params = {"MessageSid": sid, "MessageStatus": "delivered", "AccountSid": twilio.account_sid}
    forged = RequestValidator("another-token").compute_signature(url, params)
    assert twilio.callback(sid, "delivered", signature=forged).status_code == 403


def test_a_callback_for_an_unknown_message_is_404(db, twilio, central):
    import httpx

    configure_sms(twilio)
    url = central.url + reverse("provider-twilio-status")
    params = {"MessageSid": "SM" + "0" * 32, "MessageStatus": "delivered", "AccountSid": twilio.account_sid}
    signature = RequestValidator(AUTH_TOKEN).compute_signature(url, params)
    response = httpx.post(url, data=params, headers={"X-Twilio-Signature": signature})
    assert response.status_code == 404


def test_an_invalid_number_is_refused_for_that_number_and_the_others_are_delivered(channel_list, twilio):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE, twilio.INVALID)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    refused = next(entry for entry in notification.resolved_targets if entry["outcome"] == "refused")
    assert refused["target"] == twilio.INVALID and refused["provider_code"] == 21211
    assert "21211" in notification.last_error


def test_a_list_of_only_invalid_numbers_parks(channel_list, twilio):
    configure_sms(twilio)
    add_numbers(channel_list, twilio.INVALID)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert notification.last_error.startswith("Permanent failure (recipient_rejected)")


def test_throttled_by_twilio_waits_for_retry_after(channel_list, twilio):
    configure_sms(twilio)
    add_numbers(channel_list, twilio.THROTTLED)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert (notification.next_attempt_at - notification.last_attempt_at).total_seconds() >= 119
    assert DeliveryAttempt.objects.get(notification=notification).failure_class == "throttled"


def test_two_of_three_numbers_accepted_and_the_third_retried_alone(channel_list, twilio):
    configure_sms(twilio)
    add_numbers(channel_list, ALICE, BOB, twilio.DOWN)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert "HTTP 503" in notification.last_error
    make_due(notification)
    run_pass()
    sent_to = [request.form()["To"] for request in twilio.received]
    assert sorted(sent_to) == sorted([ALICE, BOB, twilio.DOWN, twilio.DOWN])


def test_wrong_credentials_are_a_configuration_failure(channel_list, twilio):
    configure_sms(twilio, auth_token="wrong")
    add_numbers(channel_list, ALICE)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "20003" in notification.last_error


def test_without_sms_configuration_delivery_fails_closed_naming_list_and_channel(channel_list):
    add_numbers(channel_list, ALICE)
    notification = queue_sms()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "'Channels'" in notification.last_error and "sms" in notification.last_error


def test_the_text_is_cut_to_the_configured_segments(channel_list, twilio):
    configure_sms(twilio, max_segments=2)
    add_numbers(channel_list, ALICE)
    queue_sms(subject="Pump 3 tripped", body="x" * 1000)
    run_pass()
    body = twilio.received[0].form()["Body"]
    assert len(body) == 306 and body.endswith("...")


def test_sms_text_counts_gsm_and_unicode_segments():
    assert sms_text(subject="Hi", body="there", max_segments=1) == "Hi\nthere"
    assert len(sms_text(subject="", body="a" * 200, max_segments=1)) == 160
    assert len(sms_text(subject="", body="a" * 400, max_segments=3)) == 400  # 3 × 153 = 459 fits
    cut = sms_text(subject="Überstrom ✓", body="é" * 200, max_segments=1)  # ✓ is not GSM: UCS-2, 70
    assert len(cut) == 70 and cut.endswith("…")
    # GSM extension characters take two septets: 78 of them and "..." fill 159 of 160.
    assert sms_text(subject="", body="€" * 100, max_segments=1) == "€" * 78 + "..."


def test_an_auth_token_the_keys_cannot_decrypt_parks_sms_with_the_reason_and_other_channels_go_on(
    channel_list, twilio, settings
):
    from notifications.models import WebhookTarget
    from tests.support.receivers import WebhookReceiver, new_webhook_secret

    configure_sms(twilio)
    add_numbers(channel_list, ALICE)
    settings.OUTBOX_SECRET_KEYS = ["a-new-key"]  # the token was encrypted under SECRET_KEY
    with WebhookReceiver() as receiver:
        WebhookTarget.objects.create(notification_list=channel_list, url=receiver.url(), secret=new_webhook_secret())
        sms = queue_sms()
        (hook,) = queue(type="webhook", list_name="Channels")
        run_pass()
        assert fresh(hook).status == Status.DELIVERED
    sms = fresh(sms)
    assert sms.status == Status.PARKED
    assert "auth token" in sms.last_error and "cannot be decrypted" in sms.last_error
    assert twilio.received == []
