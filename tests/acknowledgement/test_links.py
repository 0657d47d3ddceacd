"""Acknowledgement links and SMS replies through real components: the email composed and sent
to the real SMTP server, the Teams card posted to a real receiver, the SMS to the Twilio fake,
the page served by Django (CSRF enforced), Twilio's inbound webhook signed as Twilio signs."""

import re
import time
from unittest import mock

import pytest
from django.test import Client

from notifications import ack_links
from notifications.models import EmailRecipient, NotificationList, SmsTarget, TeamsTarget
from outbox_project.log_redaction import urls_redact
from tests.channels.conftest import AUTH_TOKEN, configure_sms
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.receivers import twilio_inbound

LINK = re.compile(r"https?://\S+/ack/([^/\s\"]+)/")
PUBLIC = "https://outbox.example.com"
ALICE, BOB, MALLORY = "+4930123456", "+4930123457", "+4930999999"


@pytest.fixture
def public_url(settings):
    settings.OUTBOX_PUBLIC_URL = PUBLIC
    return PUBLIC


def page_client():
    return Client(enforce_csrf_checks=True)


def confirm(client, token, **form):
    """GET the page, then POST its form with the CSRF token the page set."""
    page = client.get(f"/ack/{token}/")
    assert page.status_code == 200
    csrf = client.cookies["csrftoken"].value
    return client.post(f"/ack/{token}/", {"csrfmiddlewaretoken": csrf, **form})


def email_list(mode):
    notification_list = NotificationList.objects.create(name="Operators", recipient_mode=mode)
    for address in ("op1@example.com", "op2@example.com"):
        EmailRecipient.objects.create(notification_list=notification_list, email=address)
    return notification_list


# --- tokens -----------------------------------------------------------------------------------------


def test_a_token_says_which_notification_and_recipient_and_refuses_a_changed_character(db):
    row_id = "6f1c1d9e-8a53-4b7e-9a77-3f0e6f1c2b10"
    token = ack_links.ack_token_make(notification_id=row_id, recipient="op1@example.com")
    content = ack_links.ack_token_read(token)
    assert str(content.notification_id) == row_id and not content.asks_name
    assert ack_links.recipient_matches(content, "OP1@example.com")
    assert not ack_links.recipient_matches(content, "op2@example.com")
    changed = token[:5] + ("A" if token[5] != "A" else "B") + token[6:]
    with pytest.raises(ack_links.AckTokenInvalid) as refused:
        ack_links.ack_token_read(changed)
    assert not refused.value.expired


def test_a_token_older_than_the_setting_is_expired(settings):
    settings.OUTBOX_ACK_TOKEN_DAYS = 7
    # Made eight days ago: the signer reads the clock through time.time(), moved back for this.
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 8 * 86400):
        token = ack_links.ack_token_make(notification_id="6f1c1d9e-8a53-4b7e-9a77-3f0e6f1c2b10")
    with pytest.raises(ack_links.AckTokenInvalid) as refused:
        ack_links.ack_token_read(token)
    assert refused.value.expired


def test_logs_never_show_an_acknowledgement_token():
    line = 'GET /ack/Bq3xYz0AbC-_l:1tQ9ab:sig-sig_123/ HTTP/1.1" 200'
    assert urls_redact(line) == 'GET /ack/[redacted]/ HTTP/1.1" 200'
    assert "sig-sig" not in urls_redact(f"Bad Request: {PUBLIC}/ack/abc:def:ghi/")
    assert urls_redact("/api/v1/sites/commands/5/ack/") == "/api/v1/sites/commands/5/ack/"


# --- email ----------------------------------------------------------------------------------------


def test_an_individual_email_carries_a_link_bound_to_its_recipient(smtp_config, smtp_server, public_url):
    email_list("individual")
    (row,) = queue(priority="critical")
    assert row.asks_ack
    assert run_pass().delivered == 1
    links = {}
    for received in smtp_server.received:
        text = received.message.get_body(("plain",)).get_content()
        (token,) = LINK.findall(text)
        links[received.rcpt_tos[0]] = token
    assert set(links) == {"op1@example.com", "op2@example.com"}
    client = page_client()
    page = client.get(f"/ack/{links['op2@example.com']}/")
    assert b'name="name"' not in page.content  # bound to op2: no name asked
    response = confirm(client, links["op2@example.com"], note="on it")
    assert response.status_code == 200 and b"Acknowledged" in response.content
    stored = fresh(row)
    assert (stored.acknowledged_via, stored.acknowledged_by) == ("link", "op2@example.com")


def test_an_html_email_carries_the_link_in_the_html_too(smtp_config, smtp_server, public_url):
    email_list("bcc")
    queue(priority="high", type_data={"html": "<p>Pump 3 <b>tripped</b></p>"})
    run_pass()
    (received,) = smtp_server.received
    html = received.message.get_body(("html",)).get_content()
    text = received.message.get_body(("plain",)).get_content()
    assert LINK.search(html) and LINK.search(text)
    assert 'href="https://outbox.example.com/ack/' in html


def test_a_notification_that_does_not_ask_has_no_link(smtp_config, smtp_server, public_url):
    email_list("bcc")
    queue(priority="normal")
    run_pass()
    (received,) = smtp_server.received
    assert "/ack/" not in received.content.decode()


# --- the page -------------------------------------------------------------------------------------


def test_get_never_acknowledges_and_post_without_csrf_is_refused(db):
    (row,) = queue(priority="high")
    token = ack_links.ack_token_make(notification_id=row.pk)
    client = page_client()
    for _ in range(3):  # a scanner opening the link, a preview, the person
        page = client.get(f"/ack/{token}/")
        assert page.status_code == 200
        assert page["Referrer-Policy"] == "same-origin"
        assert "no-store" in page["Cache-Control"]
    assert client.head(f"/ack/{token}/").status_code == 200
    assert fresh(row).acknowledged_at is None
    assert client.post(f"/ack/{token}/", {"name": "Jane"}).status_code == 403
    assert fresh(row).acknowledged_at is None


def test_a_list_link_asks_for_a_name_and_a_second_post_says_who_already_did(db):
    (row,) = queue(priority="high")
    token = ack_links.ack_token_make(notification_id=row.pk)
    client, colleague = page_client(), page_client()
    assert colleague.get(f"/ack/{token}/").status_code == 200  # has the page open meanwhile
    missing = confirm(client, token, name="")
    assert missing.status_code == 400 and fresh(row).acknowledged_at is None
    done = confirm(client, token, name="Jane Doe", note="driving over")
    assert done.status_code == 200 and b"Acknowledged" in done.content
    csrf = colleague.cookies["csrftoken"].value
    second = colleague.post(f"/ack/{token}/", {"csrfmiddlewaretoken": csrf, "name": "John Roe"})
    assert second.status_code == 200
    assert b"Already acknowledged" in second.content and b"Jane Doe" in second.content
    stored = fresh(row)
    assert (stored.acknowledged_by, stored.acknowledged_via, stored.acknowledged_note) == (
        "Jane Doe",
        "link",
        "driving over",
    )


def test_a_teams_token_acknowledges_via_teams(db):
    (row,) = queue(priority="high")
    token = ack_links.ack_token_make(notification_id=row.pk, teams=True)
    confirm(page_client(), token, name="Jane Doe")
    assert fresh(row).acknowledged_via == "teams"


def test_expired_and_changed_tokens_get_a_readable_page_with_a_4xx(db, settings):
    (row,) = queue(priority="high")
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 30 * 86400):
        old = ack_links.ack_token_make(notification_id=row.pk)
    expired = page_client().get(f"/ack/{old}/")
    assert expired.status_code == 410 and b"expired" in expired.content
    token = ack_links.ack_token_make(notification_id=row.pk)
    tampered = page_client().get(f"/ack/{token[:-3]}xyz/")
    assert tampered.status_code == 400 and b"not valid" in tampered.content
    assert page_client().post(f"/ack/{token[:-3]}xyz/").status_code in (400, 403)
    assert fresh(row).acknowledged_at is None


# --- Teams ----------------------------------------------------------------------------------------


def test_the_teams_card_has_an_acknowledge_action(db, teams_receiver, public_url):
    channels = NotificationList.objects.create(name="Channels")
    TeamsTarget.objects.create(notification_list=channels, url=teams_receiver.url())
    (row,) = queue(type="teams", list_name="Channels", priority="critical")
    assert run_pass().delivered == 1
    (received,) = teams_receiver.received
    actions = received.json()["attachments"][0]["content"]["actions"]
    (acknowledge,) = [action for action in actions if action["title"] == "Acknowledge"]
    assert acknowledge["type"] == "Action.OpenUrl"
    match = LINK.match(acknowledge["url"])
    assert match is not None
    token = match.group(1)
    assert ack_links.ack_token_read(token).bound_to == ack_links.TEAMS
    confirm(page_client(), token, name="Jane Doe")
    assert fresh(row).acknowledged_via == "teams"


# --- SMS ------------------------------------------------------------------------------------------


@pytest.fixture
def central(live_server, settings):
    settings.OUTBOX_PUBLIC_URL = live_server.url
    return live_server


def inbound(central, from_number, body, **kwargs):
    url = central.url + "/api/v1/providers/twilio/inbound/"
    return twilio_inbound(url, auth_token=AUTH_TOKEN, from_number=from_number, body=body, **kwargs)


@pytest.fixture
def texted(db, twilio, central):
    """A critical notification texted to Alice and Bob (two segments: room for the link)."""
    configure_sms(twilio, max_segments=2)
    channels = NotificationList.objects.create(name="Channels")
    for number in (ALICE, BOB):
        SmsTarget.objects.create(notification_list=channels, phone_number=number)
    (row,) = queue(type="sms", list_name="Channels", priority="critical", subject="Gas detector fault")
    assert run_pass().delivered == 1
    return row


def test_the_sms_carries_the_reply_code_and_a_link_bound_to_its_number(texted, twilio):
    code = ack_links.sms_ack_code(texted.pk)
    for form in twilio.messages.values():
        assert form["Body"].startswith("Gas detector fault")
        assert f"Reply ACK {code} or open " in form["Body"]
        (token,) = LINK.findall(form["Body"])
        assert ack_links.recipient_matches(ack_links.ack_token_read(token), form["To"])


def test_one_segment_keeps_the_message_and_the_code_without_the_link(db, twilio, central):
    configure_sms(twilio, max_segments=1)
    channels = NotificationList.objects.create(name="Channels")
    SmsTarget.objects.create(notification_list=channels, phone_number=ALICE)
    (row,) = queue(type="sms", list_name="Channels", priority="critical", body="x" * 300)
    run_pass()
    (form,) = twilio.messages.values()
    assert len(form["Body"]) <= 160
    assert form["Body"].endswith(f"\nReply ACK {ack_links.sms_ack_code(row.pk)}")


def test_an_ack_reply_from_a_recipients_number_acknowledges(texted, central):
    code = ack_links.sms_ack_code(texted.pk)
    response = inbound(central, MALLORY, f"ACK {code}")
    assert response.status_code == 200 and "<Message>" in response.text
    assert fresh(texted).acknowledged_at is None  # not a number it was sent to
    response = inbound(central, BOB, f"ack {code} on my way")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/xml")
    assert "acknowledged" in response.text
    stored = fresh(texted)
    assert (stored.acknowledged_via, stored.acknowledged_by) == ("sms", BOB)
    again = inbound(central, ALICE, f"ACK {code}")
    assert "already acknowledged" in again.text
    assert fresh(texted).acknowledged_by == BOB


def test_a_wrong_code_or_other_text_never_acknowledges_and_other_text_gets_no_reply(texted, central):
    code = ack_links.sms_ack_code(texted.pk)
    wrong = f"{(int(code) + 1) % 10_000:04d}"
    assert "<Message>" in inbound(central, ALICE, f"ACK {wrong}").text
    assert inbound(central, ALICE, "Thanks, who is this?").text.endswith("<Response></Response>")
    assert inbound(central, ALICE, "").status_code == 200
    assert fresh(texted).acknowledged_at is None


@pytest.mark.parametrize("signature", ["", "bm90IHRoZSBzaWduYXR1cmU="])
def test_an_inbound_message_without_twilios_signature_is_403_and_acknowledges_nothing(texted, central, signature):
    code = ack_links.sms_ack_code(texted.pk)
    response = inbound(central, ALICE, f"ACK {code}", signature=signature)
    assert response.status_code == 403
    assert fresh(texted).acknowledged_at is None
