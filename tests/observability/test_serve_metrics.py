"""manage.py serve_metrics: a host that runs only workers exports their delivery counters,
with the same access rule as GET /metrics."""

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.dispatch.conftest import configure_smtp, queue
from tests.support.processes import free_port, manage, manage_output, poll, stop


def start(metrics_dir, port, **env):
    server = manage("serve_metrics", "--bind", f"127.0.0.1:{port}", PROMETHEUS_MULTIPROC_DIR=metrics_dir, **env)
    try:
        poll(lambda: _up(port), timeout=20, message="serve_metrics did not listen")
    except AssertionError:
        stop(server)
        raise
    return server


def _up(port):
    try:
        requests.get(f"http://127.0.0.1:{port}/", timeout=1)
        return True
    except requests.ConnectionError:
        return False


@pytest.mark.slow
def test_a_worker_hosts_counters_are_served_without_a_web_server(
    transactional_db, smtp_server, operators_list, tmp_path
):
    configure_smtp(smtp_server)
    queue(6)
    metrics_dir = tmp_path / "metrics"
    out = manage_output("dispatch", "--once", PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    assert "delivered 6" in out
    port = free_port()
    server = start(metrics_dir, port)
    try:
        response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert response.status_code == 200
        values = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }
        assert values[("outbox_deliveries_total", (("channel", "email"), ("outcome", "delivered")))] == 6
        assert values[("outbox_ingest_to_delivered_seconds_count", ())] == 6
        assert "outbox_queue_depth" not in response.text  # the database gauges come from web servers
        relayed = requests.get(
            f"http://127.0.0.1:{port}/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10
        )
        assert relayed.status_code == 403
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
    finally:
        stop(server)

    server = start(metrics_dir, port, OUTBOX_METRICS_TOKEN="scrape-token")
    try:
        wrong = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
        right = requests.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer scrape-token"}, timeout=10
        )
        assert right.status_code == 200 and "outbox_deliveries_total" in right.text
    finally:
        stop(server)


def test_a_bad_bind_address_is_named(tmp_path):
    done = manage("serve_metrics", "--bind", "localhost", PROMETHEUS_MULTIPROC_DIR=tmp_path)
    _, err = done.communicate(timeout=60)
    assert done.returncode != 0
    assert "--bind must be HOST:PORT (e.g. 127.0.0.1:9464), got 'localhost'" in err


def test_a_port_in_use_is_named(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = manage("serve_metrics", "--bind", f"127.0.0.1:{port}", PROMETHEUS_MULTIPROC_DIR=tmp_path)
        _, err = done.communicate(timeout=60)
    assert done.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in err
