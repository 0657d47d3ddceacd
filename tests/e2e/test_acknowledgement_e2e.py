"""End to end, acknowledgement: central under gunicorn (production settings, JSON logs and an
access log), a real dispatcher process, the real SMTP server, a Teams receiver and the Twilio
fake on loopback. A site posts alarms over HTTP; people follow the links in what they received,
or text back, as they would."""

import html
import json
import re
import time
import uuid
from unittest import mock

import pytest
import requests

from notifications.ack_links import ack_token_make, sms_ack_code
from notifications.models import EmailRecipient, Notification, NotificationList, SmsTarget, TeamsTarget
from sites.models import Site
from sites.services import site_key_issue
from tests.channels.conftest import ACCOUNT_SID, AUTH_TOKEN, configure_sms
from tests.dispatch.conftest import configure_smtp
from tests.support.processes import Central, free_port, manage, poll, stop
from tests.support.receivers import TeamsReceiver, TwilioFake, twilio_inbound
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.slow
LINK = re.compile(r"(https?://\S+/ack/([^/\s\"<]+)/)")
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
ALICE, BOB, MALLORY = "+4930123456", "+4930123457", "+4930999999"


@pytest.fixture
def world(transactional_db, postgres_only, settings, tmp_path):
    settings.OUTBOX_DISPATCH_TRIGGER = False  # the dispatcher process delivers
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    settings.OUTBOX_PUBLIC_URL = public
    with (
        SmtpServer() as smtp,
        TeamsReceiver() as teams,
        TwilioFake(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as twilio,
    ):
        configure_smtp(smtp, timeout_seconds=5, retry_interval_seconds=1)
        configure_sms(twilio, max_segments=2)
        operators = NotificationList.objects.create(name="Operators", recipient_mode="bcc")
        for address in ("op1@example.com", "op2@example.com"):
            EmailRecipient.objects.create(notification_list=operators, email=address)
        channels = NotificationList.objects.create(name="Channels")
        TeamsTarget.objects.create(notification_list=channels, url=teams.url())
        for number in (ALICE, BOB):
            SmsTarget.objects.create(notification_list=channels, phone_number=number)
        site = Site.objects.create(site_id="plant-ack", name="Plant Ack")
        _, key = site_key_issue(site=site)
        logs = tmp_path / "central.log"
        access = tmp_path / "access.log"
        with logs.open("wb") as log_file:
            central = Central(
                port=port,
                stderr=log_file,
                options=["--access-logfile", str(access)],
                OUTBOX_PUBLIC_URL=public,
                LOG_FORMAT="json",
                LOG_LEVEL="INFO",
            ).start()
            dispatcher = manage("dispatch", OUTBOX_DISPATCH_INTERVAL=0.2, OUTBOX_PUBLIC_URL=public)
            try:
                yield {
                    "url": public,
                    "key": key,
                    "smtp": smtp,
                    "teams": teams,
                    "twilio": twilio,
                    "logs": logs,
                    "access": access,
                }
            finally:
                stop(dispatcher)
                central.stop()


def found(pattern, text):
    """The groups of ``pattern``'s first match in ``text`` (failing the test when there is none)."""
    match = pattern.search(text)
    assert match is not None, f"{pattern.pattern!r} not in {text[:500]!r}"
    return match.groups()


def post_alarm(world, **fields):
    body = {
        "notification_id": str(uuid.uuid4()),
        "list_name": "Operators",
        "subject": "Gas detector 4 fault",
        "body": "Detector 4 reports a fault.",
        "priority": "critical",
        **fields,
    }
    response = requests.post(
        f"{world['url']}/api/v1/notifications/",
        json=body,
        headers={"Authorization": f"Api-Key {world['key']}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    assert response.json()["asks_ack"] is True
    return body["notification_id"]


def status_record(world, notification_id):
    response = requests.get(
        f"{world['url']}/api/v1/notifications/{notification_id}/",
        headers={"Authorization": f"Api-Key {world['key']}"},
        timeout=10,
    )
    assert response.status_code == 200
    return response.json()


def test_the_emails_link_shows_a_page_and_only_its_post_acknowledges(world):
    notification_id = post_alarm(world)
    poll(lambda: world["smtp"].count >= 1, timeout=30, message="the email did not arrive")
    (received,) = world["smtp"].received
    text = received.message.get_body(("plain",)).get_content()
    link, token = found(LINK, text)
    assert link.startswith(world["url"] + "/ack/")

    # A scanner, then the person, open the link: nothing is acknowledged by that.
    jane, john = requests.Session(), requests.Session()
    assert requests.get(link, timeout=10).status_code == 200
    page = jane.get(link, timeout=10)
    assert page.status_code == 200 and 'name="name"' in page.text  # bcc: the page asks who
    colleague_page = john.get(link, timeout=10)
    assert status_record(world, notification_id)["acknowledged_at"] is None

    done = jane.post(
        link,
        data={"csrfmiddlewaretoken": found(CSRF, page.text)[0], "name": "Jane Doe", "note": "driving over"},
        timeout=10,
    )
    assert done.status_code == 200 and "Acknowledged" in done.text
    record = status_record(world, notification_id)
    assert record["acknowledged_via"] == "link"
    assert record["acknowledged_by"] == "J***"  # a site sees the name masked
    assert record["acknowledged_note"] == "driving over"
    assert Notification.objects.get(pk=notification_id).acknowledged_by == "Jane Doe"

    # A colleague who had the page open as well is told who already did.
    second = john.post(
        link, data={"csrfmiddlewaretoken": found(CSRF, colleague_page.text)[0], "name": "John Roe"}, timeout=10
    )
    assert second.status_code == 200
    assert "Already acknowledged" in second.text and "Jane Doe" in html.unescape(second.text)
    assert Notification.objects.get(pk=notification_id).acknowledged_by == "Jane Doe"

    # Expired and changed links are refused with a page that says so.
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 8 * 86400):
        old = ack_token_make(notification_id=notification_id)  # made eight days ago
    expired = requests.get(f"{world['url']}/ack/{old}/", timeout=10)
    assert expired.status_code == 410 and "expired" in expired.text
    tampered = requests.get(f"{world['url']}/ack/{token[:-4]}AAAA/", timeout=10)
    assert tampered.status_code == 400 and "not valid" in tampered.text

    # No token reached a log: the application's JSON lines, gunicorn's access log.
    time.sleep(0.5)  # gunicorn writes its access log after answering
    logs = world["logs"].read_text() + world["access"].read_text()
    assert "/ack/[redacted]/" in logs
    for secret in (token, old, token[:-4]):
        assert secret not in logs
    json_lines = [line for line in world["logs"].read_text().splitlines() if line.startswith("{")]
    assert any("/ack/[redacted]/" in json.dumps(json.loads(line)) for line in json_lines)


def test_the_teams_card_has_the_acknowledge_action_and_an_sms_reply_acknowledges(world):
    notification_id = post_alarm(world, type="teams", list_name="Channels")
    poll(lambda: len(world["teams"].received) >= 1, timeout=30, message="the card did not arrive")
    actions = world["teams"].received[0].json()["attachments"][0]["content"]["actions"]
    (acknowledge,) = [action for action in actions if action["title"] == "Acknowledge"]
    assert acknowledge["type"] == "Action.OpenUrl" and acknowledge["url"].startswith(world["url"] + "/ack/")

    sms_id = post_alarm(world, type="sms", list_name="Channels")
    poll(lambda: len(world["twilio"].messages) >= 2, timeout=30, message="the SMS did not go out")
    code = sms_ack_code(sms_id)
    for form in world["twilio"].messages.values():
        assert f"Reply ACK {code}" in form["Body"]
    poll(
        lambda: status_record(world, sms_id)["status"] == "Delivered",
        timeout=30,
        message="the SMS was not recorded",
    )
    inbound = f"{world['url']}/api/v1/providers/twilio/inbound/"
    stranger = twilio_inbound(inbound, auth_token=AUTH_TOKEN, from_number=MALLORY, body=f"ACK {code}")
    assert stranger.status_code == 200
    assert status_record(world, sms_id)["acknowledged_at"] is None
    reply = twilio_inbound(inbound, auth_token=AUTH_TOKEN, from_number=ALICE, body=f"ACK {code}")
    assert reply.status_code == 200 and "acknowledged" in reply.text
    record = status_record(world, sms_id)
    assert (record["acknowledged_via"], record["acknowledged_by"]) == ("sms", "+49***456")
    assert status_record(world, notification_id)["acknowledged_at"] is None  # the Teams alarm is another one
