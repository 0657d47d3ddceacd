"""Ingest under faults: concurrent replays of one id, and an unreachable database."""

import json
import threading
import uuid

import pytest
import requests
from django.db import connection
from rest_framework.test import APIClient

from notifications.models import Notification
from tests.support.payloads import make_payload


def test_eight_threads_posting_the_same_id_yield_one_row_and_only_201_or_200(
    postgres_only, live_server, site_key, transactional_db
):
    payload = make_payload()
    barrier = threading.Barrier(8)
    answers = []

    def post():
        session = requests.Session()
        barrier.wait()
        response = session.post(
            f"{live_server.url}/api/v1/notifications/",
            data=json.dumps(payload),
            headers={"Authorization": f"Api-Key {site_key}", "Content-Type": "application/json"},
            timeout=30,
        )
        answers.append(response.status_code)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [200] * 7 + [201]
    assert Notification.objects.filter(pk=payload["notification_id"]).count() == 1


def test_concurrent_batches_with_overlapping_ids_create_each_row_once(
    postgres_only, live_server, site_key, transactional_db
):
    shared = [make_payload() for _ in range(50)]
    barrier = threading.Barrier(4)
    results = []

    def post():
        barrier.wait()
        response = requests.post(
            f"{live_server.url}/api/v1/notifications/batch/",
            json={"notifications": shared},
            headers={"Authorization": f"Api-Key {site_key}"},
            timeout=30,
        )
        assert response.status_code == 200
        results.append([r["result"] for r in response.json()["results"]])

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_item = list(zip(*results, strict=False))
    assert all(sorted(outcomes) == ["created", "replayed", "replayed", "replayed"] for outcomes in per_item)
    assert Notification.objects.count() == 50


@pytest.fixture
def unreachable_database(transactional_db):
    """Point the connection at a database that cannot be reached, then restore it."""
    settings_dict = connection.settings_dict
    saved = dict(settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        settings_dict["NAME"] = f"/nonexistent-dir-{uuid.uuid4()}/db.sqlite3"
    else:
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", "1"
    yield
    connection.close()
    settings_dict.clear()
    settings_dict.update(saved)


def test_ingest_answers_503_when_the_database_is_unavailable(site_key, unreachable_database):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {site_key}")
    response = client.post("/api/v1/notifications/", json.dumps(make_payload()), content_type="application/json")
    assert response.status_code == 503
    assert response.json()["error"] == "database_unavailable"


def test_healthz_answers_503_when_the_database_is_unavailable(client, unreachable_database):
    response = client.get("/healthz")
    assert response.status_code == 503
