"""The console and email: a list's recipient mode in its form, and a notification's page showing
the composed message's headers and its HTML sanitised in a sandboxed frame."""

import base64
import html
import re

import pytest
from django.urls import reverse

from notifications.models import NotificationList, SmtpConfiguration
from tests.admin.conftest import make_notification

SCRIPTED_HTML = (
    "<h1>Pump 3 tripped</h1><script>alert('pwned')</script>"
    '<p onmouseover="alert(2)"><a href="javascript:alert(3)">ack</a></p><img src=x onerror="alert(4)">'
)


def detail(client, notification):
    return client.get(reverse("admin:notifications_notification_change", args=[notification.pk])).content.decode()


def preview_frame(content):
    """The HTML preview's iframe tag and its srcdoc document (unescaped)."""
    match = re.search(r'<iframe class="outbox-html-preview"[^>]*>', content)
    assert match, "no HTML preview frame on the page"
    tag = match.group(0)
    srcdoc = re.search(r'srcdoc="([^"]*)"', tag)
    assert srcdoc, "the preview frame has no srcdoc"
    return tag, html.unescape(srcdoc.group(1))


@pytest.fixture
def smtp_configured(db):
    return SmtpConfiguration.objects.create(host="smtp.example.com", from_address="outbox@plant.example")


def test_the_html_preview_is_sanitised_and_shown_in_an_empty_sandbox(operator_client, operators_list, smtp_configured):
    notification = make_notification(type_data={"html": SCRIPTED_HTML})
    tag, document = preview_frame(detail(operator_client, notification))
    assert ' sandbox="" ' in tag
    assert "<h1>Pump 3 tripped</h1>" in document
    for forbidden in ("<script", "alert(", "onmouseover", "onerror", "javascript:"):
        assert forbidden not in document, forbidden
    assert "default-src 'none'" in document  # nothing inside the frame loads either


def test_the_page_shows_the_composed_headers_with_no_member_in_bcc_mode(
    operator_client, operators_list, smtp_configured
):
    notification = make_notification(
        subject="Pump 3 tripped",
        type_data={"cc": ["chief@plant.example"], "reply_to": "control@plant.example", "priority": "high"},
    )
    content = detail(operator_client, notification)
    headers = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", content))
    assert headers["From"] == "outbox@plant.example"
    assert headers["To"] == "undisclosed-recipients:;"
    assert headers["Cc"] == "chief@plant.example"
    assert headers["Reply-To"] == "control@plant.example"
    assert headers["Subject"] == "Pump 3 tripped"
    assert headers["Message-ID"] == f"&lt;{notification.notification_id}@plant.example&gt;"
    assert headers["X-Priority"] == "1 (Highest)"
    assert headers["Content-Type"] == "text/plain; charset=&quot;utf-8&quot;"
    assert "Recipient mode of the list now: bcc" in content
    assert "— (no HTML part)" in content


def test_in_to_mode_the_headers_list_the_current_members(operator_client, operators_list, smtp_configured):
    operators_list.recipient_mode = NotificationList.RecipientMode.TO
    operators_list.save()
    content = detail(operator_client, make_notification())
    assert "<tr><th>To</th><td>op1@example.com, op2@example.com</td></tr>" in content


def test_attachments_are_listed_as_parts_and_their_base64_is_not_dumped_on_the_page(
    operator_client, operators_list, smtp_configured
):
    chart = base64.b64encode(b"\x89PNG" * 5000).decode()
    type_data = {
        "html": "<p>chart</p>",
        "attachments": [{"filename": "../trend chart.png", "content_type": "image/png", "content_base64": chart}],
    }
    content = detail(operator_client, make_notification(type_data=type_data))
    assert "attachment &#x27;trend_chart.png&#x27;: image/png, 20,000 bytes" in content
    assert "multipart/mixed" in content
    assert chart[:200] not in content
    assert f"({len(chart):,} characters of base64)" in content


def test_type_data_that_would_not_be_sent_shows_its_problems(operator_client, operators_list, smtp_configured):
    content = detail(operator_client, make_notification(type_data={"priority": "urgent"}))
    assert "type_data.priority: Must be one of high, normal, low." in content


def test_the_list_form_offers_the_recipient_mode_with_help_text(admin_client_, operators_list):
    url = reverse("admin:notifications_notificationlist_change", args=[operators_list.pk])
    content = admin_client_.get(url).content.decode()
    assert 'type="radio" name="recipient_mode" value="individual"' in content
    assert "none sees another" in content and "undisclosed-recipients" in html.unescape(content)
    data = {
        "name": "Operators",
        "description": "",
        "recipient_mode": "individual",
        "email_recipients-TOTAL_FORMS": "0",
        "email_recipients-INITIAL_FORMS": "0",
        **{
            f"{prefix}-{count}_FORMS": "0"
            for prefix in ("teams_targets", "webhook_targets", "sms_targets", "apprise_targets")
            for count in ("TOTAL", "INITIAL")
        },
    }
    assert admin_client_.post(url, data).status_code == 302
    operators_list.refresh_from_db()
    assert operators_list.recipient_mode == "individual"
