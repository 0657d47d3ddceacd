"""GET /metrics as production serves it: gunicorn with two workers, a dispatcher process
delivering to a real SMTP server, all counting into one metrics directory, after real
traffic through the API."""

import socket
import subprocess

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from notifications.models import Notification
from tests.dispatch.conftest import configure_smtp
from tests.support.payloads import make_payload
from tests.support.processes import Central, free_port, manage, poll

Status = Notification.Status
CONTRACT = (
    "outbox_queue_depth",
    "outbox_parked",
    "outbox_stuck",
    "outbox_oldest_pending_seconds",
    "outbox_site_backlog",
    "outbox_channel_open",
    "outbox_deliveries_total",
    "outbox_delivery_seconds",
    "outbox_ingest_to_delivered_seconds",
)


def non_loopback_address() -> str | None:
    """An IPv4 address of this host other than loopback (none sent: UDP connect only routes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def scrape(url: str, **headers: str) -> tuple[dict[str, set[str]], dict[tuple[str, tuple], float]]:
    """(sample names per family, ``{(sample, sorted labels): value}``) of one scrape."""
    response = requests.get(f"{url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    families: dict[str, set[str]] = {}
    values = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {sample.name for sample in family.samples}
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, values


@pytest.mark.slow
def test_metrics_through_gunicorn_after_real_traffic(transactional_db, smtp_server, site_key, operators_list, tmp_path):
    configure_smtp(smtp_server)
    metrics_dir = tmp_path / "metrics"
    remote = non_loopback_address()
    remote_port = free_port()
    options = ["--bind", f"{remote}:{remote_port}"] if remote else []
    auth = {"Authorization": f"Api-Key {site_key}"}
    server_env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir, "ALLOWED_HOSTS": f"127.0.0.1,{remote or '127.0.0.1'}"}
    with Central(workers=2, options=options, OUTBOX_METRICS_CACHE_SECONDS=0, **server_env) as central:
        sent = [make_payload() for _ in range(20)] + [make_payload(list_name="Nobody")]
        for start in range(0, len(sent), 7):
            response = requests.post(
                f"{central.url}/api/v1/notifications/batch/",
                json={"notifications": sent[start : start + 7]},
                headers=auth,
                timeout=10,
            )
            assert response.status_code in (200, 201, 207), response.text
        dispatcher = manage(
            "dispatch", "--once", PROMETHEUS_MULTIPROC_DIR=metrics_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = dispatcher.communicate(timeout=120)
        assert dispatcher.returncode == 0, err
        assert "delivered 20" in out and "parked 1" in out, out
        # Traffic the dispatcher has not seen yet: the queue is not empty when scraped.
        waiting = [make_payload() for _ in range(4)]
        assert requests.post(
            f"{central.url}/api/v1/notifications/batch/", json={"notifications": waiting}, headers=auth, timeout=10
        ).ok

        # Several scrapes, so that both gunicorn workers answer: each sums every process's files.
        for _ in range(6):
            families, values = scrape(central.url)
            names = set(families).union(*families.values())  # a counter's family drops "_total"
            for name in CONTRACT:
                assert name in names, f"{name} missing from /metrics"
            for histogram in ("outbox_delivery_seconds", "outbox_ingest_to_delivered_seconds"):
                assert f"{histogram}_bucket" in families[histogram]
            delivered_rows = Notification.objects.filter(status=Status.DELIVERED).count()
            assert delivered_rows == smtp_server.count == 20
            assert (
                values[("outbox_deliveries_total", (("channel", "email"), ("outcome", "delivered")))] == delivered_rows
            )
            assert values[("outbox_deliveries_total", (("channel", "email"), ("outcome", "parked")))] == 1
            assert values[("outbox_queue_depth", (("site", "plant-a"),))] == 4
            assert (
                values[("outbox_queue_depth", (("site", "plant-a"),))]
                == Notification.objects.filter(status__in=Notification.NON_TERMINAL).count()
            )
            assert values[("outbox_parked", (("site", "plant-a"),))] == 1
            assert values[("outbox_stuck", ())] == 0
            assert 0 < values[("outbox_oldest_pending_seconds", ())] < 60
            assert values[("outbox_channel_open", (("channel", "email"),))] == 0
            assert values[("outbox_delivery_seconds_count", (("channel", "email"),))] == 20
            assert 0 < values[("outbox_delivery_seconds_sum", (("channel", "email"),))] < 20
            assert values[("outbox_ingest_to_delivered_seconds_count", ())] == 20
            assert 0 < values[("outbox_ingest_to_delivered_seconds_sum", ())] < 20 * 120

        # Refused: a client relayed by a proxy, and (where this host has another address) a
        # client that is not on loopback at all.
        relayed = requests.get(f"{central.url}/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10)
        assert relayed.status_code == 403 and "outbox_" not in relayed.text
        if remote:
            poll(lambda: _answers(remote, remote_port), timeout=10, message=f"gunicorn is not listening on {remote}")
            refused = requests.get(f"http://{remote}:{remote_port}/metrics", timeout=10)
            assert refused.status_code == 403 and "outbox_" not in refused.text
            # The same client is served the API as usual: only /metrics is local.
            assert requests.get(f"http://{remote}:{remote_port}/healthz", timeout=10).status_code == 200

    # With a token, a remote scraper bearing it reads the metrics; without it, 401.
    if remote:
        with Central(workers=2, options=options, OUTBOX_METRICS_TOKEN="scrape-token", **server_env):
            url = f"http://{remote}:{remote_port}"
            assert requests.get(f"{url}/metrics", timeout=10).status_code == 401
            bad = requests.get(f"{url}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
            assert bad.status_code == 401
            _, values = scrape(url, Authorization="Bearer scrape-token")
            # Counters live in the files, across restarts of the web server.
            assert values[("outbox_deliveries_total", (("channel", "email"), ("outcome", "delivered")))] == 20


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
