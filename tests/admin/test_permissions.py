"""Who may do what in the console: roles from the data migration, read-only notifications,
and the custom retry/discard permissions."""

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from notifications.models import EmailRecipient, Notification, NotificationList
from tests.admin.conftest import login, make_notification, make_user

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


def perms(group_name):
    return {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Group.objects.get(name=group_name).permissions.select_related("content_type")
    }


@pytest.mark.django_db
def test_migration_creates_operators_who_view_and_act_on_notifications_and_view_channel_health():
    assert perms("Operators") == {
        "notifications.view_notification",
        "notifications.retry_notification",
        "notifications.discard_notification",
        "notifications.requeue_notification",
        "notifications.view_deliveryattempt",
        # Notifications parked at sites: seen, retried and discarded through the site's agent.
        "sites.view_siteparkednotification",
        "sites.retry_siteparkednotification",
        "sites.discard_siteparkednotification",
        "sites.view_sitecommand",
        "sites.view_siteheartbeat",
        "notifications.view_deliverypolicy",
        "notifications.view_channelhealth",
        # Notification lists and their recipients, read-only (who would receive a notification).
        "notifications.view_notificationlist",
        "notifications.view_emailrecipient",
        # The worker processes and what each last did (the worker heartbeat), read-only.
        "notifications.view_workerprocess",
        # Silences (set, change, end) and the maintenance windows, read-only (suppression).
        "notifications.view_silence",
        "notifications.add_silence",
        "notifications.change_silence",
        "notifications.delete_silence",
        "notifications.view_maintenancewindow",
        # The sites' watchdogs and the notifications they raised, read-only (Administrators retire them).
        "sites.view_watchdog",
        "sites.view_watchdogalert",
        # The sites' pages, read-only (silent or direct, last post, what is parked there).
        "sites.view_site",
    }


CHANNEL_INLINES_EMPTY = {
    f"{prefix}-{count}_FORMS": "0"
    for prefix in ("teams_targets", "webhook_targets", "sms_targets", "apprise_targets")
    for count in ("TOTAL", "INITIAL")
}


@pytest.mark.django_db
def test_migration_gives_administrators_lists_smtp_and_sites_as_well():
    granted = perms("Administrators")
    assert perms("Operators") <= granted
    for model in (
        "notifications.%s_notificationlist",
        "notifications.%s_emailrecipient",
        "notifications.%s_smtpconfiguration",
        "notifications.%s_deliverypolicy",
        "notifications.%s_teamstarget",
        "notifications.%s_webhooktarget",
        "notifications.%s_smstarget",
        "notifications.%s_apprisetarget",
        "notifications.%s_channelconfiguration",
        "sites.%s_site",
        "sites.%s_siteapikey",
    ):
        assert {model % action for action in ("view", "add", "change", "delete")} <= granted
    assert "sites.retire_watchdog" in granted
    assert (
        not {"notifications.add_notification", "notifications.change_notification", "notifications.delete_notification"}
        & granted
    )


def test_anonymous_visitor_is_sent_to_the_login_page(client, db):
    response = client.get(OUTBOX)
    assert response.status_code == 302
    assert reverse("admin:login") in response["Location"]


def test_operator_sees_the_outbox_page(operator_client):
    make_notification(subject="Boiler low water")
    response = operator_client.get(OUTBOX)
    assert response.status_code == 200
    assert b"Boiler low water" in response.content


def test_operator_sees_notification_lists_read_only_and_cannot_edit_them(operator_client, operators_list):
    assert operator_client.get(reverse("admin:notifications_notificationlist_changelist")).status_code == 200
    url = reverse("admin:notifications_notificationlist_change", args=[operators_list.pk])
    response = operator_client.post(url, {"name": "Hijacked", "description": ""})
    assert response.status_code == 403
    operators_list.refresh_from_db()
    assert operators_list.name == "Operators"
    assert operator_client.get(reverse("admin:notifications_notificationlist_add")).status_code == 403


def test_operator_cannot_open_smtp_configuration_and_only_reads_sites(operator_client, site):
    assert operator_client.get(reverse("admin:notifications_smtpconfiguration_changelist")).status_code == 403
    # A site's page is read-only for operators; its keys are the administrators'.
    assert operator_client.get(reverse("admin:sites_site_change", args=[site.pk])).status_code == 200
    assert operator_client.post(reverse("admin:sites_site_change", args=[site.pk]), {"name": "x"}).status_code == 403
    assert operator_client.post(reverse("admin:sites_site_issue_key", args=[site.pk])).status_code == 403


@pytest.mark.parametrize("role", ["operator", "administrator", "superuser"])
def test_nobody_can_add_edit_or_delete_notification_rows(client, db, role):
    user = make_user(
        role,
        groups={"operator": ["Operators"], "administrator": ["Administrators"]}.get(role, []),
        superuser=role == "superuser",
    )
    login(client, user)
    notification = make_notification(subject="Original subject")
    change_url = reverse("admin:notifications_notification_change", args=[notification.pk])

    assert client.get(reverse("admin:notifications_notification_add")).status_code == 403
    page = client.get(change_url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert client.post(change_url, {"subject": "Edited", "status": "Delivered"}).status_code == 403
    assert (
        client.post(
            reverse("admin:notifications_notification_delete", args=[notification.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    response = client.post(OUTBOX, {"action": "delete_selected", "_selected_action": [notification.pk], "post": "yes"})
    notification.refresh_from_db()
    assert (notification.subject, notification.status) == ("Original subject", Status.PENDING)
    assert Notification.objects.filter(pk=notification.pk).exists()
    assert response.status_code in (200, 302)


def test_user_without_the_retry_permission_is_not_offered_retry_and_cannot_retry(client, viewer):
    login(client, viewer)
    parked = make_notification(status=Status.PARKED)
    page = client.get(OUTBOX)
    assert b"retry_selected" not in page.content
    assert b"discard_selected" not in page.content

    client.post(OUTBOX, {"action": "retry_selected", "_selected_action": [parked.pk], "index": "0"})
    detail = client.get(reverse("admin:notifications_notification_change", args=[parked.pk]))
    assert b"retry-button" not in detail.content
    assert client.post(reverse("admin:notifications_notification_retry", args=[parked.pk])).status_code == 403

    parked.refresh_from_db()
    assert parked.status == Status.PARKED and parked.retry_count == 10


def test_user_without_the_discard_permission_cannot_discard(client, viewer):
    login(client, viewer)
    parked = make_notification(status=Status.PARKED)
    client.post(OUTBOX, {"action": "discard_selected", "_selected_action": [parked.pk], "post": "yes", "reason": "no"})
    url = reverse("admin:notifications_notification_discard", args=[parked.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"post": "yes", "reason": "no"}).status_code == 403
    parked.refresh_from_db()
    assert parked.status == Status.PARKED


def test_retry_permission_alone_allows_retry_but_not_discard(client, db):
    user = make_user("rita", permissions=["view_notification", "retry_notification"])
    login(client, user)
    page = client.get(OUTBOX)
    assert b"retry_selected" in page.content and b"retry_now_selected" in page.content
    assert b"discard_selected" not in page.content
    assert b"requeue_selected" not in page.content


def test_requeue_needs_its_own_permission(client, db):
    user = make_user("ruth", permissions=["view_notification", "retry_notification", "discard_notification"])
    login(client, user)
    discarded = make_notification(status=Status.DISCARDED)
    assert b"requeue_selected" not in client.get(OUTBOX).content
    detail = client.get(reverse("admin:notifications_notification_change", args=[discarded.pk]))
    assert b"requeue-button" not in detail.content
    assert client.post(reverse("admin:notifications_notification_requeue", args=[discarded.pk])).status_code == 403
    discarded.refresh_from_db()
    assert discarded.status == Status.DISCARDED


def test_administrator_can_add_a_list_with_recipients(admin_client_):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"),
        {
            "name": "Shift leads",
            "description": "",
            "recipient_mode": "bcc",
            "email_recipients-TOTAL_FORMS": "2",
            "email_recipients-INITIAL_FORMS": "0",
            "email_recipients-0-email": "lead1@example.com",
            "email_recipients-1-email": "lead2@example.com",
            **CHANNEL_INLINES_EMPTY,
        },
    )
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    notification_list = NotificationList.objects.get(name="Shift leads")
    assert sorted(
        EmailRecipient.objects.filter(notification_list=notification_list).values_list("email", flat=True)
    ) == [
        "lead1@example.com",
        "lead2@example.com",
    ]
