"""The console warns on the dashboard and the Notification Outbox page when no worker process
has run for two minutes: notifications are stored, but nothing delivers them."""

import socket
from datetime import timedelta

from django.urls import reverse

from notifications.models import WorkerProcess
from notifications.workers import worker_process_record

OUTBOX = reverse("admin:notifications_notification_changelist")
PAGES = (OUTBOX, reverse("admin:index"))


def test_both_pages_warn_while_no_worker_has_ever_run(operator_client):
    for url in PAGES:
        content = operator_client.get(url).content.decode()
        assert 'id="outbox-worker-silence"' in content, url
        assert "No worker process has ever run." in content


def test_both_pages_name_the_last_worker_seen_once_it_is_silent_for_two_minutes(operator_client):
    worker_process_record(action="dispatch sweep: claimed 0")
    for url in PAGES:
        assert b'id="outbox-worker-silence"' not in operator_client.get(url).content
    row = WorkerProcess.objects.get()
    WorkerProcess.objects.update(last_seen_at=row.last_seen_at - timedelta(minutes=3))
    for url in PAGES:
        content = operator_client.get(url).content.decode()
        assert "No worker is running." in content, url
        assert "was 3 min" in content and socket.gethostname() in content
        assert "dispatch sweep: claimed 0" in content


def test_staff_who_may_not_view_notifications_see_no_warning(client, db):
    from tests.admin.conftest import login, make_user

    login(client, make_user("sam"))
    assert b"outbox-worker-silence" not in client.get(reverse("admin:index")).content


def test_operators_see_each_worker_process_read_only(operator_client):
    worker_process_record(action="dispatch: claimed 3, delivered 3")
    url = reverse("admin:notifications_workerprocess_changelist")
    content = operator_client.get(url).content.decode()
    assert socket.gethostname() in content and "dispatch: claimed 3, delivered 3" in content
    row = WorkerProcess.objects.get()
    assert operator_client.post(reverse("admin:notifications_workerprocess_delete", args=[row.pk])).status_code == 403
    assert WorkerProcess.objects.filter(pk=row.pk).exists()
