"""/healthz and /metrics answer whatever Host a load balancer or Prometheus sends (the backend
address of the web process), without a DisallowedHost record in the log; every other path
still refuses a Host that is not in ALLOWED_HOSTS. The metrics access rule is unchanged."""

import logging

import pytest
from django.test import Client, override_settings

from notifications import metrics
from tests.api.test_faults import unreachable_database

__all__ = ["unreachable_database"]

BACKEND = "10.0.0.5:8000"  # what a load balancer or Prometheus sends as Host


@pytest.fixture(autouse=True)
def _production_hosts(settings):
    settings.ALLOWED_HOSTS = ["outbox.example.com"]
    settings.OUTBOX_METRICS_TOKEN = ""
    settings.OUTBOX_METRICS_CACHE_SECONDS = 0
    metrics.kpi_cache.clear()


def disallowed_host_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "django.security.DisallowedHost"]


def test_healthz_answers_a_load_balancer_that_sends_the_backend_address_as_host(db, caplog):
    response = Client().get("/healthz", HTTP_HOST=BACKEND)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "up"}
    assert disallowed_host_records(caplog) == []


def test_metrics_answer_a_local_prometheus_that_sends_the_backend_address_as_host(db, caplog):
    response = Client().get("/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert b"outbox_queue_depth" in response.content
    assert disallowed_host_records(caplog) == []


def test_the_metrics_access_rule_still_applies_to_any_host(db, settings):
    remote = Client().get("/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="192.0.2.7")
    assert remote.status_code == 403 and b"outbox_" not in remote.content
    settings.OUTBOX_METRICS_TOKEN = "scrape-token"
    assert Client().get("/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="192.0.2.7").status_code == 401
    bearer = Client().get(
        "/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer scrape-token"
    )
    assert bearer.status_code == 200


@pytest.mark.parametrize("path", ["/admin/login/", "/api/v1/notifications/", "/healthz/", "/metrics/x"])
def test_every_other_path_still_refuses_a_host_not_allowed(db, path):
    assert Client().get(path, HTTP_HOST=BACKEND).status_code == 400


def test_probes_carry_the_headers_that_matter_for_a_response_that_is_not_a_page(db):
    response = Client().get("/healthz", HTTP_HOST=BACKEND)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_a_probe_is_only_answered_to_get(db):
    assert Client().post("/healthz", HTTP_HOST=BACKEND).status_code == 405
    assert Client().post("/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="127.0.0.1").status_code == 405


@override_settings(ALLOWED_HOSTS=["outbox.example.com"])
def test_healthz_answers_503_to_any_host_when_the_database_is_unavailable(unreachable_database):
    response = Client().get("/healthz", HTTP_HOST=BACKEND)
    assert response.status_code == 503


@override_settings(ALLOWED_HOSTS=["outbox.example.com"], OUTBOX_METRICS_CACHE_SECONDS=0)
def test_metrics_answer_503_not_500_when_the_database_is_unavailable(unreachable_database):
    metrics.kpi_cache.clear()
    response = Client().get("/metrics", HTTP_HOST=BACKEND, REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 503
    assert response.json()["error"] == "database_unavailable"
