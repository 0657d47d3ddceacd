"""End to end: the real site agent against a real central (gunicorn on the test database) whose
rate limit the site has used up. The agent waits out the 429 for its ordinary notifications
(nothing counted, nothing parked) while its critical notification goes through at once; then
the ordinary ones follow. PostgreSQL only (several processes)."""

import uuid
from typing import Any

import pytest

from notifications.models import Notification
from sites.agent import SiteOutbox
from sites.models import Site
from sites.services import site_key_issue
from tests.support.processes import Central, poll

pytestmark = pytest.mark.slow

# A site may send 20 notifications at once, then one every half second.
LIMITS: dict[str, Any] = {"OUTBOX_BATCH_MAX_ITEMS": 20, "OUTBOX_SITE_RATE_LIMIT": 2, "OUTBOX_SITE_RATE_BURST": 20}


def test_the_agent_waits_out_a_429_for_ordinary_rows_while_a_critical_row_goes_through(
    transactional_db, postgres_only, tmp_path
):
    site = Site.objects.create(site_id="plant-e2e", name="Plant E2E")
    _, key = site_key_issue(site=site)
    with Central(workers=1, **LIMITS) as central:
        outbox = SiteOutbox(
            tmp_path / "buffer.sqlite3", central.url, key, retry_interval=0, batch_size=20, max_retries=1
        )
        notifier = outbox.notify("Operators")
        ordinary = [notifier.send(f"Tank {n} level low", "") for n in range(30)]

        first = outbox.forward_once()
        assert first.forwarded == 20
        assert first.throttled_for is not None and first.throttled_for >= 1  # 429: come back in a few seconds
        trip = notifier.send("Boiler 2 trip", "Flame failure.", priority="critical")
        second = outbox.forward_once()

        assert second.forwarded == 1
        assert Notification.objects.get(pk=trip).priority == Notification.Priority.CRITICAL
        held = [nid for nid in ordinary if not Notification.objects.filter(pk=nid).exists()]
        assert len(held) == 10  # still held for the 429
        assert [(outbox.status(nid) or {})["retry_count"] for nid in held] == [0] * 10  # a 429 is no failure
        assert outbox.stats() == {"buffered": 10, "parked": 0}

        poll(
            lambda: outbox.forward_once() is not None and outbox.stats()["buffered"] == 0,
            timeout=60,
            interval=0.5,
            message=f"the agent did not forward the rest after the 429: {outbox.stats()}",
        )
    assert Notification.objects.filter(source_site_id="plant-e2e").count() == 31
    assert outbox.stats() == {"buffered": 0, "parked": 0}


def test_a_buffer_written_by_an_old_agent_is_forwarded_by_the_new_one_and_accepted_as_normal(
    transactional_db, postgres_only, tmp_path
):
    from tests.agent.test_priority import OLD_FORWARDING, build_agent_0_3_buffer

    site = Site.objects.create(site_id="plant-e2e", name="Plant E2E")
    _, key = site_key_issue(site=site)
    buffer_path = tmp_path / "buffer.sqlite3"
    build_agent_0_3_buffer(buffer_path)  # agent 0.3's schema and payloads: no priority anywhere
    with Central(workers=1) as central:
        outbox = SiteOutbox(buffer_path, central.url, key, retry_interval=0)
        trip = outbox.notify("Operators").send("Boiler 2 trip", "", priority="critical")
        poll(
            lambda: outbox.forward_once() is not None and outbox.stats()["buffered"] == 0,
            timeout=30,
            interval=0.2,
            message=f"the upgraded buffer did not drain: {outbox.stats()}",
        )
        assert outbox.stats() == {"buffered": 0, "parked": 1}  # the row 0.3 had parked stays parked there
    stored = {row.pk: row for row in Notification.objects.filter(source_site_id="plant-e2e")}
    assert stored[uuid.UUID(OLD_FORWARDING)].priority == Notification.Priority.NORMAL
    assert stored[uuid.UUID(trip)].priority == Notification.Priority.CRITICAL
