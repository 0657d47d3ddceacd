"""GET /metrics in this process: who may read it, what the gauges say against the database,
the cache, and the dispatcher's counters."""

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from notifications import metrics
from notifications.models import ChannelHealth, Notification, SmtpConfiguration
from sites.models import Site, SiteHeartbeat
from tests.dispatch.conftest import queue, run_pass

Status = Notification.Status


@pytest.fixture(autouse=True)
def _fresh_cache(settings):
    settings.OUTBOX_METRICS_CACHE_SECONDS = 0
    settings.OUTBOX_METRICS_TOKEN = ""
    metrics.kpi_cache.clear()


def scrape(client=None, **headers) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one scrape from loopback."""
    response = (client or Client()).get("/metrics", REMOTE_ADDR="127.0.0.1", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def parse(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# --- access -----------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1"])
def test_a_loopback_client_reads_the_metrics_without_a_token(db, address):
    assert Client().get("/metrics", REMOTE_ADDR=address).status_code == 200


@pytest.mark.parametrize("address", ["192.0.2.7", "10.1.2.3", "2001:db8::1"])
def test_a_remote_client_without_a_token_is_refused(db, address):
    response = Client().get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == 403
    assert b"outbox_" not in response.content


@pytest.mark.parametrize("header", ["HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED"])
def test_a_request_relayed_by_a_proxy_is_not_local(db, header):
    """A reverse proxy on this host connects from loopback: its clients are not local."""
    meta: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1", header: "203.0.113.9"}
    assert Client().get("/metrics", **meta).status_code == 403


def test_with_a_token_a_remote_scraper_bearing_it_reads_and_others_get_401(db, settings):
    settings.OUTBOX_METRICS_TOKEN = "s3cret-token"
    client = Client()
    ok = client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert ok.status_code == 200 and b"outbox_queue_depth" in ok.content
    for presented in ("", "Bearer wrong", "Basic czNjcmV0LXRva2Vu"):
        meta: dict[str, Any] = {"REMOTE_ADDR": "192.0.2.7"}
        if presented:
            meta["HTTP_AUTHORIZATION"] = presented
        refused = client.get("/metrics", **meta)
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    # A wrong token is refused even from loopback; no token from loopback is still let in.
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_only_get_is_served(db):
    assert Client().post("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 405


# --- gauges -----------------------------------------------------------------------------------


def test_the_suppression_gauges_count_suppressed_and_held_rows(db):
    suppressed = queue(2, site_id="plant-a")
    Notification.objects.filter(pk__in=[row.pk for row in suppressed]).update(
        status=Status.SUPPRESSED, suppressed_by="silence:1"
    )
    held = queue(3, site_id="plant-b")
    Notification.objects.filter(pk__in=[row.pk for row in held]).update(held_for_digest=timezone.now())
    values = scrape()
    assert values[("outbox_suppressed_last_interval", (("site", "plant-a"),))] == 2
    assert values[("outbox_held_for_digest", (("site", "plant-b"),))] == 3
    assert values[("outbox_queue_depth", (("site", "plant-b"),))] == 3  # held rows wait in the queue


def test_gauges_match_the_database(db, settings):
    Site.objects.create(site_id="plant-a", name="Plant A")
    quiet = Site.objects.create(site_id="plant-c", name="Plant C")
    SiteHeartbeat.objects.create(site=quiet, received_at=timezone.now(), agent_version="1", buffered=42)
    queue(3, site_id="plant-a")
    queue(2, site_id="plant-b")
    parked = queue(1, site_id="plant-b")[0]
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED)
    old = queue(1, site_id="plant-a")[0]
    Notification.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.OUTBOX_STUCK_AGE + 120)
    )
    SmtpConfiguration.objects.create(host="smtp.example.com", port=25, from_address="outbox@example.com")
    ChannelHealth.objects.create(channel="email", endpoint="smtp.example.com:25", state=ChannelHealth.State.OPEN)
    # An endpoint no longer configured (the relay was replaced) counts for nothing.
    ChannelHealth.objects.create(channel="teams", endpoint="old", state=ChannelHealth.State.OPEN)

    values = scrape()
    assert values[("outbox_queue_depth", (("site", "plant-a"),))] == 4
    assert values[("outbox_queue_depth", (("site", "plant-b"),))] == 2
    assert values[("outbox_parked", (("site", "plant-b"),))] == 1
    assert values[("outbox_parked", (("site", "plant-a"),))] == 0
    assert values[("outbox_suppressed_last_interval", (("site", "plant-a"),))] == 0
    assert values[("outbox_held_for_digest", (("site", "plant-b"),))] == 0
    assert values[("outbox_stuck", ())] == 1
    assert (
        settings.OUTBOX_STUCK_AGE + 110
        < values[("outbox_oldest_pending_seconds", ())]
        < settings.OUTBOX_STUCK_AGE + 180
    )
    assert values[("outbox_site_backlog", (("site", "plant-c"),))] == 42
    assert ("outbox_site_backlog", (("site", "plant-a"),)) not in values  # never heard from
    assert values[("outbox_channel_open", (("channel", "email"),))] == 1
    assert values[("outbox_channel_open", (("channel", "teams"),))] == 0
    assert (
        sum(v for (name, _), v in values.items() if name == "outbox_queue_depth")
        == Notification.objects.filter(status__in=Notification.NON_TERMINAL).count()
    )


def test_the_queue_depth_by_priority_sums_to_the_queue_depth_by_site(db):
    queue(3, site_id="plant-a")
    queue(2, site_id="plant-b", priority="critical")
    queue(1, site_id="plant-a", priority="high")
    queue(1, site_id="plant-c", priority="low")
    parked = queue(1, site_id="plant-b", priority="critical")[0]
    Notification.objects.filter(pk=parked.pk).update(status=Status.PARKED)

    values = scrape()

    by_priority = {
        labels[0][1]: value for (name, labels), value in values.items() if name == "outbox_queue_depth_by_priority"
    }
    assert by_priority == {"critical": 2, "high": 1, "normal": 3, "low": 1}
    # The per-site gauge keeps its labels: alerts summing it over sites count the same rows.
    by_site = sum(v for (name, _), v in values.items() if name == "outbox_queue_depth")
    assert by_site == sum(by_priority.values()) == 7


def test_an_empty_outbox_exports_zeroes(db):
    values = scrape()
    assert values[("outbox_stuck", ())] == 0
    assert values[("outbox_oldest_pending_seconds", ())] == 0
    assert values[("outbox_channel_open", (("channel", "email"),))] == 0


def test_scrapes_within_the_cache_time_share_one_kpi_pass(db, settings, django_assert_max_num_queries):
    settings.OUTBOX_METRICS_CACHE_SECONDS = 60
    queue(2)
    passes = metrics.kpi_cache.passes
    first = scrape()
    queue(3)
    with django_assert_max_num_queries(0):
        second = scrape()
    assert metrics.kpi_cache.passes == passes + 1
    assert (
        first[("outbox_queue_depth", (("site", "plant-a"),))]
        == second[("outbox_queue_depth", (("site", "plant-a"),))]
        == 2
    )
    metrics.kpi_cache.clear()
    assert scrape()[("outbox_queue_depth", (("site", "plant-a"),))] == 5


def test_a_scrape_costs_at_most_one_kpi_pass(db, django_assert_max_num_queries):
    queue(2)
    # One KPI pass (notifications.kpis: twelve short queries on PostgreSQL, which reads the kept
    # counts, with the deliveries' lists and members and the acknowledgement figures; eight on
    # SQLite), the database clock, the sites' heartbeats — what GET /api/v1/kpis/ costs — and the
    # last worker activity.
    # (One more each for the suppressed rows and the rows held for a digest.)
    with django_assert_max_num_queries(18 if connection.vendor == "postgresql" else 14):
        scrape()


# --- counters from the dispatcher ---------------------------------------------------------------


def test_the_dispatcher_counts_deliveries_and_times_them(smtp_server, smtp_config, operators_list):
    before = scrape()
    queue(3)
    queue(1, list_name="Nobody")  # an unknown list: parked, a configuration failure
    report = run_pass()
    assert (report.delivered, report.parked) == (3, 1)
    after = scrape()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("outbox_deliveries_total", channel="email", outcome="delivered") == 3
    assert delta("outbox_deliveries_total", channel="email", outcome="parked") == 1
    assert delta("outbox_deliveries_total", channel="email", outcome="retrying") == 0
    assert delta("outbox_delivery_seconds_count", channel="email") == 3  # the parked one never reached SMTP
    assert 0 < delta("outbox_delivery_seconds_sum", channel="email") < 10
    assert delta("outbox_ingest_to_delivered_seconds_count") == 3
    assert 0 <= delta("outbox_ingest_to_delivered_seconds_sum") < 30


def test_a_transient_failure_counts_as_retrying(smtp_server, smtp_config, operators_list):
    before = scrape()
    smtp_server.behave("4xx")
    queue(2)
    assert run_pass().retrying == 2
    after = scrape()
    key = ("outbox_deliveries_total", (("channel", "email"), ("outcome", "retrying")))
    assert after[key] - before.get(key, 0) == 2
    ingest = ("outbox_ingest_to_delivered_seconds_count", ())
    assert after.get(ingest, 0) == before.get(ingest, 0)
