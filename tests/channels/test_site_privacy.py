"""Sites see outcomes, not recipients: notifications delivered for real (aiosmtpd, the Teams,
webhook, Twilio and Apprise receivers on loopback), then read back through the API with the
site's key and with a staff token. No full address, number or URL the list holds appears
anywhere in what the site gets; staff see them; a receiver's response body reaches nobody's
``last_error``."""

import json

import pytest
from rest_framework.test import APIClient

from notifications.models import (
    AppriseTarget,
    DeliveryAttempt,
    EmailRecipient,
    Notification,
    NotificationList,
    SmsTarget,
    TeamsTarget,
    WebhookTarget,
)
from tests.admin.conftest import make_user
from tests.channels.conftest import configure_sms
from tests.dispatch.conftest import configure_smtp, fresh, run_pass, smtp_server
from tests.support.payloads import make_payload
from tests.support.receivers import Receiver, Reply, new_webhook_secret
from tests.support.staff import staff_key_header

__all__ = ["smtp_server"]  # the dispatch tests' SMTP server fixture, used here

Status = Notification.Status
MEMBERS = ["op1@example.com", "op2@example.com"]
CC = "chief@plant.example"
TEAMS_PATH = "/workflows/3f9c2a/triggers/manual/paths/invoke"
HOOK_PATH = "/hooks/plant-a/alarms"
NUMBER = "+4930123456"


@pytest.fixture
def staff_api(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=staff_key_header(make_user("sam")))
    return client


def post(api, **fields):
    """Submit a notification through the API as the site; its payload (to replay it)."""
    payload = make_payload(**fields)
    response = api.post("/api/v1/notifications/", payload, format="json")
    assert response.status_code == 201, response.content
    return payload


def reads(api, staff_api, payload):
    """What the site gets for ``payload``'s notification from each place it can read it (the
    status record, its page of the list, the answer to a replay), as raw JSON text; and the
    staff's status record."""
    notification_id = payload["notification_id"]
    record = api.get(f"/api/v1/notifications/{notification_id}/")
    listing = api.get("/api/v1/notifications/")
    replay = api.post("/api/v1/notifications/", payload, format="json")
    assert (record.status_code, listing.status_code, replay.status_code) == (200, 200, 200)
    staff = staff_api.get(f"/api/v1/notifications/{notification_id}/")
    assert staff.status_code == 200
    return [r.content.decode() for r in (record, listing, replay)], staff.json()


def assert_hidden_from_site(site_texts, full_targets):
    for text in site_texts:
        for full in full_targets:
            assert full not in text, f"{full!r} shown to the site"


def targets_of(record):
    return sorted((t["channel"], t["target"], t["outcome"]) for t in record["targets"])


@pytest.mark.parametrize("mode", ["bcc", "individual", "to"])
def test_a_site_reads_email_outcomes_with_every_address_masked_in_each_recipient_mode(
    api, staff_api, smtp_server, mode
):
    configure_smtp(smtp_server)
    crew = NotificationList.objects.create(name="Operators", recipient_mode=mode)
    for address in MEMBERS:
        EmailRecipient.objects.create(notification_list=crew, email=address)
    # The server defers op2 with a reply that names it: the row's last_error quotes that reply.
    smtp_server.greylist = {"op2@example.com"}
    payload = post(api, type_data={"cc": [CC], "reply_to": "control@plant.example"})
    run_pass()
    assert fresh(Notification.objects.get(pk=payload["notification_id"])).status == Status.RETRYING

    site_texts, staff = reads(api, staff_api, payload)
    assert_hidden_from_site(site_texts, [*MEMBERS, CC, "control@plant.example"])
    site = json.loads(site_texts[0])
    assert targets_of(site) == [
        ("email", "c***@plant.example", "delivered"),
        ("email", "o***@example.com", "deferred"),
        ("email", "o***@example.com", "delivered"),
    ]
    assert "Greylisted" in site["last_error"] and "<o***@example.com>" in site["last_error"]
    assert site["delivery_summary"] == staff["delivery_summary"]
    # Staff see who it went to, and the server's reply as it was.
    assert targets_of(staff) == [
        ("email", CC, "delivered"),
        ("email", "op1@example.com", "delivered"),
        ("email", "op2@example.com", "deferred"),
    ]
    assert "<op2@example.com>" in staff["last_error"]


def test_a_site_sees_teams_and_webhook_targets_as_hosts_only(
    api, staff_api, channel_list, teams_receiver, webhook_receiver
):
    teams_url = teams_receiver.url(TEAMS_PATH) + "?api-version=2016-06-01&sp=%2Ftriggers&sv=1.0&sig=SECRETSIG"
    TeamsTarget.objects.create(notification_list=channel_list, url=teams_url)
    secret = new_webhook_secret()
    webhook_receiver.secrets[HOOK_PATH] = secret
    WebhookTarget.objects.create(notification_list=channel_list, url=webhook_receiver.url(HOOK_PATH), secret=secret)
    teams = post(api, type="teams", list_name="Channels")
    hook = post(api, type="webhook", list_name="Channels")
    assert run_pass().delivered == 2

    for payload, url, path in ((teams, teams_url, TEAMS_PATH), (hook, webhook_receiver.url(HOOK_PATH), HOOK_PATH)):
        site_texts, staff = reads(api, staff_api, payload)
        assert_hidden_from_site(site_texts, [url, url.split("?")[0], path, "SECRETSIG", str(webhook_receiver.port)])
        channel = payload["type"]
        assert targets_of(json.loads(site_texts[0])) == [(channel, "127.0.0.1", "delivered")]
        # Staff see the URL, its secrets masked as stored.
        (staff_target,) = staff["targets"]
        assert path in staff_target["target"] and "SECRETSIG" not in staff_target["target"]


def test_a_site_sees_sms_numbers_masked_with_their_provider_status(
    api, staff_api, channel_list, twilio, live_server, settings
):
    settings.OUTBOX_PUBLIC_URL = live_server.url
    configure_sms(twilio)
    for number in (NUMBER, twilio.INVALID):
        SmsTarget.objects.create(notification_list=channel_list, phone_number=number)
    payload = post(api, type="sms", list_name="Channels")
    run_pass()
    (sid,) = twilio.messages
    assert twilio.callback(sid, "delivered").status_code == 200

    site_texts, staff = reads(api, staff_api, payload)
    assert_hidden_from_site(site_texts, [NUMBER, twilio.INVALID, NUMBER[1:], twilio.INVALID[1:]])
    site = json.loads(site_texts[0])
    delivered = next(t for t in site["targets"] if t["outcome"] == "delivered")
    assert delivered["target"] == "+49***456" and delivered["provider_status"] == "delivered"
    assert delivered["provider_status_at"]
    assert "21211" in site["last_error"] and "+1***001" in site["last_error"]
    assert sorted(t["target"] for t in staff["targets"]) == sorted([NUMBER, twilio.INVALID])
    assert twilio.INVALID in staff["last_error"]


def test_a_site_sees_an_apprise_service_as_its_scheme_and_host(api, staff_api, channel_list):
    with Receiver() as receiver:
        service = f"json://alarm-user:apprise-secret@127.0.0.1:{receiver.port}/notify/plant-a"
        AppriseTarget.objects.create(notification_list=channel_list, url=service)
        payload = post(api, type="apprise", list_name="Channels")
        assert run_pass().delivered == 1

    site_texts, staff = reads(api, staff_api, payload)
    assert_hidden_from_site(site_texts, [service, "apprise-secret", "alarm-user", "/notify/plant-a"])
    assert targets_of(json.loads(site_texts[0])) == [("apprise", "json://127.0.0.1", "delivered")]
    (staff_target,) = staff["targets"]
    assert "/notify/plant-a" in staff_target["target"] and "apprise-secret" not in staff_target["target"]


BODY = "INTERNAL-TRACE-7f3e: upstream db-04.corp.internal refused; session=abc123"


@pytest.mark.parametrize("channel", ["teams", "webhook"])
def test_a_receivers_error_body_never_reaches_last_error_but_operators_see_it_in_the_attempt(
    api, staff_api, channel_list, teams_receiver, webhook_receiver, channel
):
    receiver = teams_receiver if channel == "teams" else webhook_receiver
    if channel == "teams":
        TeamsTarget.objects.create(notification_list=channel_list, url=receiver.url(TEAMS_PATH) + "?sig=S")
    else:
        WebhookTarget.objects.create(
            notification_list=channel_list, url=receiver.url(TEAMS_PATH), secret=new_webhook_secret()
        )
    receiver.script(TEAMS_PATH, [Reply(500, BODY)])
    payload = post(api, type=channel, list_name="Channels")
    run_pass()
    notification = Notification.objects.get(pk=payload["notification_id"])
    assert notification.status == Status.RETRYING

    site_texts, staff = reads(api, staff_api, payload)
    for text in site_texts:
        assert "INTERNAL-TRACE" not in text and "db-04" not in text
    assert "HTTP 500" in json.loads(site_texts[0])["last_error"]
    assert "INTERNAL-TRACE" not in staff["last_error"]  # not even stored on the row
    # The console's attempt detail keeps the start of the body for the operator.
    (attempt,) = DeliveryAttempt.objects.filter(notification=notification)
    (target,) = attempt.detail["targets"]
    assert target["http_status"] == 500 and target["response_excerpt"] == BODY


def test_a_site_cannot_read_another_sites_status_record_but_staff_can(api, staff_api, other_site_key, db):
    payload = post(api, list_name="Nobody")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    assert other.get(f"/api/v1/notifications/{payload['notification_id']}/").status_code == 404
    assert staff_api.get(f"/api/v1/notifications/{payload['notification_id']}/").status_code == 200


def test_a_user_who_is_not_staff_cannot_read_status_records(api, db, django_user_model):
    payload = post(api, list_name="Nobody")
    user = django_user_model.objects.create_user("nosy", password="x")
    client = APIClient()
    client.force_login(user)  # a console session of a user who is not staff (no staff key can be issued to one)
    assert client.get(f"/api/v1/notifications/{payload['notification_id']}/").status_code == 403
    anonymous = APIClient().get(f"/api/v1/notifications/{payload['notification_id']}/")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"] == "Api-Key"
