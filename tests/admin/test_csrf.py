"""Every console write needs the CSRF token: a forged form posted from another site changes nothing."""

import pytest
from django.test import Client
from django.urls import reverse

from notifications.models import Notification
from tests.admin.conftest import make_notification

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


@pytest.fixture
def csrf_client(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    return client


def test_retry_action_without_csrf_token_is_refused(csrf_client):
    parked = make_notification(status=Status.PARKED)
    response = csrf_client.post(OUTBOX, {"action": "retry_selected", "_selected_action": [parked.pk], "index": "0"})
    assert response.status_code == 403
    parked.refresh_from_db()
    assert parked.status == Status.PARKED


def test_detail_page_retry_and_discard_without_csrf_token_are_refused(csrf_client):
    parked = make_notification(status=Status.PARKED)
    assert csrf_client.post(reverse("admin:notifications_notification_retry", args=[parked.pk])).status_code == 403
    discard = reverse("admin:notifications_notification_discard", args=[parked.pk])
    assert csrf_client.post(discard, {"post": "yes"}).status_code == 403
    parked.refresh_from_db()
    assert parked.status == Status.PARKED


def test_retry_with_the_token_from_the_page_works(csrf_client):
    parked = make_notification(status=Status.PARKED)
    csrf_client.get(OUTBOX)
    token = csrf_client.cookies["csrftoken"].value
    response = csrf_client.post(
        OUTBOX,
        {"action": "retry_selected", "_selected_action": [parked.pk], "index": "0", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302
    parked.refresh_from_db()
    assert parked.status == Status.PENDING


def test_issuing_a_site_key_without_csrf_token_is_refused(administrator, site):
    client = Client(enforce_csrf_checks=True)
    client.force_login(administrator)
    assert client.post(reverse("admin:sites_site_issue_key", args=[site.pk])).status_code == 403
    assert site.api_keys.count() == 0
