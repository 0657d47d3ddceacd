"""List tools in the console: who would receive (per channel, for operators too), a test
notification through the ingest path delivered by a real dispatcher pass to a real SMTP server,
many addresses pasted at once (checked per line), and the read-only list for operators."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from notifications.dispatch.runner import dispatch_pass
from notifications.list_tools import addresses_parse
from notifications.models import EmailRecipient, Notification, NotificationList, SmtpConfiguration
from tests.admin.conftest import login, make_user
from tests.support.smtp import SmtpServer

pytestmark = [pytest.mark.django_db]


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def list_form(notification_list, **changes):
    data = {
        "name": notification_list.name,
        "description": notification_list.description,
        "recipient_mode": notification_list.recipient_mode,
        "email_recipients-TOTAL_FORMS": "0",
        "email_recipients-INITIAL_FORMS": "0",
        "email_recipients-MIN_NUM_FORMS": "0",
        "email_recipients-MAX_NUM_FORMS": "1000",
        "add_addresses": "",
    }
    for prefix in ("teams_targets", "webhook_targets", "sms_targets", "apprise_targets"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    data.update(changes)
    return data


def test_who_would_receive_lists_each_channels_targets_for_an_operator(client, operators_list):
    login(client, make_user("olivia", groups=["Operators"]))
    response = client.get(reverse("admin:notifications_notificationlist_recipients", args=[operators_list.pk]))
    assert response.status_code == 200
    [email] = response.context["preview"]
    assert email.channel == "email"
    assert email.targets == ["op1@example.com", "op2@example.com"]
    assert email.recipient_mode == operators_list.recipient_mode
    page = response.content.decode()
    assert "op1@example.com" in page and "2 targets" in page


def test_who_would_receive_says_when_nobody_would(admin_client_):
    empty = NotificationList.objects.create(name="Night-Shift")
    response = admin_client_.get(reverse("admin:notifications_notificationlist_recipients", args=[empty.pk]))
    assert "Nobody: a email notification to this list would be parked" in response.content.decode()


def test_operators_see_lists_read_only_without_the_admin_tools(client, operators_list):
    login(client, make_user("olivia", groups=["Operators"]))
    assert client.get(reverse("admin:notifications_notificationlist_changelist")).status_code == 200
    page = client.get(reverse("admin:notifications_notificationlist_change", args=[operators_list.pk]))
    assert page.status_code == 200
    content = page.content.decode()
    assert "op1@example.com" in content
    assert 'name="add_addresses"' not in content
    assert "list-send-test-link" not in content and "list-recipients-link" in content
    assert 'name="_save"' not in content
    response = client.post(
        reverse("admin:notifications_notificationlist_change", args=[operators_list.pk]),
        list_form(operators_list, add_addresses="intruder@example.com"),
    )
    assert response.status_code == 403
    assert (
        client.get(reverse("admin:notifications_notificationlist_send_test", args=[operators_list.pk])).status_code
        == 403
    )
    assert not EmailRecipient.objects.filter(email="intruder@example.com").exists()


def test_pasting_many_addresses_adds_the_new_ones_and_skips_those_present(admin_client_, operators_list):
    pasted = "new1@example.com\n\n  New2@Example.com ; OP1@example.com\n<new3@example.com>\nnew1@example.com\n"
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_change", args=[operators_list.pk]),
        list_form(operators_list, add_addresses=pasted),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert "Added 3 addresses to Operators. Already in the list, skipped: OP1@example.com." in texts(response)
    assert sorted(operators_list.email_recipients.values_list("email", flat=True)) == [
        "New2@Example.com",
        "new1@example.com",
        "new3@example.com",
        "op1@example.com",
        "op2@example.com",
    ]


def test_pasted_lines_that_are_not_addresses_are_named_and_nothing_is_added(admin_client_, operators_list):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_change", args=[operators_list.pk]),
        list_form(operators_list, add_addresses="good@example.com\nnot an address\n\nshift lead@\n"),
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["add_addresses"]
    assert errors == [
        "Line 2: “not an address” is not an email address.",
        "Line 4: “shift lead@” is not an email address.",
    ]
    assert operators_list.email_recipients.count() == 2


def test_paste_is_bounded():
    addresses, problems = addresses_parse("a@example.com\n" * 1001)
    assert addresses == [] and problems == ["Paste at most 1000 lines at a time (1001 were pasted)."]


def test_a_new_list_can_be_created_with_pasted_addresses(admin_client_):
    data = list_form(
        NotificationList(name="Night-Shift", recipient_mode="bcc"), add_addresses="a@example.com\nb@example.com"
    )
    response = admin_client_.post(reverse("admin:notifications_notificationlist_add"), data)
    assert response.status_code == 302
    created = NotificationList.objects.get(name="Night-Shift")
    assert created.email_recipients.count() == 2


@pytest.mark.django_db(transaction=True)
def test_send_test_notification_goes_through_ingest_and_is_delivered(client, operators_list):
    login(client, make_user("adam", groups=["Administrators"]))
    url = reverse("admin:notifications_notificationlist_send_test", args=[operators_list.pk])
    form = client.get(url)
    assert form.context["form"].initial["subject"] == "Test notification to Operators"
    response = client.post(url, {"channel": "email", "subject": "Is the pager working?", "body": "Please ignore."})
    assert response.status_code == 302
    notification = Notification.objects.get()
    assert response["Location"] == reverse("admin:notifications_notification_change", args=[notification.pk])
    assert (notification.subject, notification.list_name) == ("[TEST] Is the pager working?", "Operators")
    assert (notification.source_site_id, notification.source_script) == ("console", "console-test")
    assert notification.source_instance_id == "console user adam"
    assert notification.status == Notification.Status.PENDING
    assert notification.fingerprint  # computed by ingest's validation, as for a site's submission

    with SmtpServer() as smtp:
        SmtpConfiguration.objects.create(
            host=smtp.host, port=smtp.port, security="none", from_address="outbox@example.com", timeout_seconds=5
        )
        report = dispatch_pass(worker_id="list-test", time_budget=20)
        assert report.claimed == 1, report
        smtp.wait_for(1)
        assert sorted(smtp.received[0].rcpt_tos) == ["op1@example.com", "op2@example.com"]
    notification.refresh_from_db()
    assert notification.status == Notification.Status.DELIVERED


def test_send_test_notification_refusal_is_said_in_words(admin_client_, operators_list):
    url = reverse("admin:notifications_notificationlist_send_test", args=[operators_list.pk])
    # A control character the form lets through but ingest refuses in a one-line field.
    response = admin_client_.post(url, {"channel": "email", "subject": "red \x1b[31m alert", "body": "y"})
    assert response.status_code == 200
    [said] = texts(response)
    assert said.startswith("The test notification was refused (subject: ")
    assert Notification.objects.count() == 0
    response = admin_client_.post(url, {"channel": "pager", "subject": "x", "body": "y"})
    assert "channel" in response.context["form"].errors
