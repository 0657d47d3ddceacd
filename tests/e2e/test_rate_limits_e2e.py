"""A site's notification budget is one budget however many web processes serve it: two gunicorn
servers (a process each) on the test database, batches sent to both, counted together.
PostgreSQL only (several processes)."""

import http.client
import json
from typing import Any

import pytest

from notifications.models import Notification
from sites.models import Site
from sites.services import site_key_issue
from tests.support.payloads import make_payload
from tests.support.processes import Central

pytestmark = pytest.mark.slow

LIMITS: dict[str, Any] = {
    "OUTBOX_BATCH_MAX_ITEMS": 100,
    "OUTBOX_SITE_RATE_LIMIT": 0.01,  # nothing comes back during the test
    "OUTBOX_SITE_RATE_BURST": 100,
    "OUTBOX_SITE_CRITICAL_RATE_LIMIT": 0.01,
    "OUTBOX_SITE_CRITICAL_RATE_BURST": 100,
}


def post_batch(server, key, count, **fields):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = json.dumps({"notifications": [make_payload(**fields) for _ in range(count)]})
    connection.request(
        "POST",
        "/api/v1/notifications/batch/",
        body,
        {"Content-Type": "application/json", "Authorization": f"Api-Key {key}"},
    )
    response = connection.getresponse()
    answer = (response.status, response.getheader("Retry-After"), json.loads(response.read() or b"null"))
    connection.close()
    return answer


def test_batches_sent_to_two_web_processes_draw_from_one_budget(transactional_db, postgres_only):
    site = Site.objects.create(site_id="plant-a", name="Plant A")
    _, key = site_key_issue(site=site)
    with Central(workers=1, **LIMITS) as first, Central(workers=1, **LIMITS) as second:
        assert post_batch(first, key, 60)[0] == 200
        status, retry_after, body = post_batch(second, key, 60)
        assert status == 429, body
        assert int(retry_after) >= 1
        assert "notifications budget" in body["detail"]
        assert post_batch(second, key, 40)[0] == 200
        assert post_batch(first, key, 1)[0] == 429
        # Critical notifications have their own budget, in both processes.
        assert post_batch(first, key, 50, priority="critical")[0] == 200
        assert post_batch(second, key, 50, priority="critical")[0] == 200
        assert post_batch(second, key, 1, priority="critical")[0] == 429
    assert Notification.objects.filter(source_site_id="plant-a").count() == 200
