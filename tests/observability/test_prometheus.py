"""The monitoring files in docs/monitoring/ checked by Prometheus itself (Debian's prometheus
package: the server and promtool):

- the alert rules are valid PromQL and pass their unit tests (prometheus-alerts.test.yml:
  each alert fires on the series it is meant for, and stays quiet on its look-alikes);
- the scrape configuration (prometheus.yml: web hosts and worker hosts' serve_metrics) is valid;
- a real Prometheus server scrapes a real Outbox as that configuration does — a web host
  (gunicorn with two workers) and a worker host's serve_metrics, both with the bearer token,
  after real traffic — evaluates every Grafana panel's query and every alert rule without an
  error, and sees what the database holds, each delivery counted once.

Without Prometheus installed these tests are skipped with the reason; under CI=true (.ci/run
installs it) they fail instead.
"""

import functools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from notifications import tasks
from notifications.models import Notification
from tests.dispatch.conftest import configure_smtp
from tests.observability.test_monitoring_files import MONITORING, dashboard_expressions
from tests.support.payloads import make_payload
from tests.support.processes import ROOT, Central, free_port, manage, poll, stop

ALERTS = MONITORING / "prometheus-alerts.yml"
ALERT_TESTS = MONITORING / "prometheus-alerts.test.yml"
SCRAPE = MONITORING / "prometheus.yml"
TOKEN = "scrape-token-for-prometheus"


def program_or_skip(name: str) -> str:
    """The path of ``name`` (from Debian's prometheus package); skip without it, fail under CI."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed (Debian package prometheus)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [program_or_skip("promtool"), *arguments], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_alert_rules_are_valid():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout, result.stdout


def test_the_alert_rules_pass_their_unit_tests():
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_scrape_configuration_is_valid_and_scrapes_web_and_worker_hosts(tmp_path):
    import yaml

    token = tmp_path / "outbox-metrics-token"
    token.write_text(TOKEN)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        SCRAPE.read_text()
        .replace("/etc/prometheus/rules/outbox-alerts.yml", str(ALERTS))
        .replace("/etc/prometheus/outbox-metrics-token", str(token))
    )
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    jobs = {job["job_name"]: job for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    assert set(jobs) == {"outbox", "outbox-workers"}
    # The worker hosts' port is the one outbox-metrics.service serves on.
    unit = (ROOT / "deploy" / "systemd" / "outbox-metrics.service").read_text()
    port = unit.split("serve_metrics --bind ", 1)[1].split()[0].rsplit(":", 1)[1]
    targets = [t for group in jobs["outbox-workers"]["static_configs"] for t in group["targets"]]
    assert targets and all(target.endswith(f":{port}") for target in targets)


def test_every_alert_rule_has_a_unit_test():
    import yaml

    rules = yaml.safe_load(ALERTS.read_text())
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    }
    firing = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert names == tested == firing, "every alert needs a case where it fires"


class Prometheus:
    """A Prometheus server scraping the targets of ``jobs`` (job name → host:port) every second
    with a bearer token and evaluating the alert rules every second; its data in
    ``directory``."""

    def __init__(self, *, jobs: dict[str, str], directory: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{ALERTS}']\n"
            "scrape_configs:\n"
            + "".join(
                f"  - job_name: {job}\n"
                "    authorization: {type: Bearer, credentials: " + TOKEN + "}\n"
                f"    static_configs: [{{targets: ['{target}']}}]\n"
                for job, target in jobs.items()
            )
        )
        self.log = (directory / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                program_or_skip("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expression: str) -> list[dict[str, Any]]:
        """The result of an instant query; fails the test on a PromQL or evaluation error."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{expression!r}: {body}"
        return body["data"]["result"]

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def scalar(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


@pytest.mark.slow
def test_prometheus_scrapes_outbox_and_evaluates_the_dashboard_and_the_alerts(
    transactional_db, smtp_server, site_key, operators_list, tmp_path
):
    program_or_skip("prometheus")
    configure_smtp(smtp_server)
    # A web host and a worker host, each with its own metrics directory, as prometheus.yml has them.
    metrics_dir, worker_metrics_dir = tmp_path / "metrics", tmp_path / "worker-metrics"
    worker_metrics_dir.mkdir()
    auth = {"Authorization": f"Api-Key {site_key}"}
    worker_port = free_port()
    with Central(
        workers=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir, OUTBOX_METRICS_TOKEN=TOKEN, OUTBOX_METRICS_CACHE_SECONDS=0
    ) as central:
        # Real traffic: 12 delivered, 1 parked (no such list), 3 still queued, a site heartbeat.
        sent = [make_payload() for _ in range(12)] + [make_payload(list_name="Nobody")]
        response = requests.post(
            f"{central.url}/api/v1/notifications/batch/", json={"notifications": sent}, headers=auth, timeout=10
        )
        assert response.status_code in (200, 201, 207), response.text
        dispatcher = manage(
            "dispatch",
            "--once",
            PROMETHEUS_MULTIPROC_DIR=worker_metrics_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = dispatcher.communicate(timeout=120)
        assert dispatcher.returncode == 0, err
        assert "delivered 12" in out and "parked 1" in out, out
        tasks.dispatch_task()  # a worker ran the sweep (the worker heartbeat): nothing was left due
        waiting = [make_payload() for _ in range(3)]
        assert requests.post(
            f"{central.url}/api/v1/notifications/batch/", json={"notifications": waiting}, headers=auth, timeout=10
        ).ok
        heartbeat: dict[str, Any] = {"agent_version": "test", "buffered": 7, "parked": 0}
        assert requests.post(f"{central.url}/api/v1/sites/heartbeat/", json=heartbeat, headers=auth, timeout=10).ok

        serve_metrics = manage(
            "serve_metrics",
            "--bind",
            f"127.0.0.1:{worker_port}",
            PROMETHEUS_MULTIPROC_DIR=worker_metrics_dir,
            OUTBOX_METRICS_TOKEN=TOKEN,
        )
        prometheus = Prometheus(
            jobs={"outbox": central.url.removeprefix("http://"), "outbox-workers": f"127.0.0.1:{worker_port}"},
            directory=tmp_path,
        )
        try:
            poll(prometheus.ready, timeout=30, message="Prometheus did not become ready")

            # Enough scrapes for rate() over the dashboard's windows to have two samples.
            def scraped_four_times(job: str) -> bool:
                scrapes = prometheus.query(f'count_over_time(up{{job="{job}"}}[1m])')
                return bool(scrapes) and scalar(scrapes) >= 4

            for job in ("outbox", "outbox-workers"):
                poll(
                    functools.partial(scraped_four_times, job),
                    timeout=30,
                    message=f"Prometheus did not scrape {job} four times",
                    interval=0.5,
                )
                assert scalar(prometheus.query(f'up{{job="{job}"}}')) == 1  # the bearer token is accepted

            # What Prometheus sees is what the database holds.
            waiting_rows = Notification.objects.filter(status__in=Notification.NON_TERMINAL).count()
            delivered_rows = Notification.objects.filter(status=Notification.Status.DELIVERED).count()
            assert (waiting_rows, delivered_rows) == (3, 12)
            assert scalar(prometheus.query("sum(max by (site) (outbox_queue_depth))")) == waiting_rows
            assert scalar(prometheus.query("sum(max by (site) (outbox_parked))")) == 1
            assert scalar(prometheus.query("max by (site) (outbox_site_backlog)")) == 7
            # Counted by the worker host alone, summed over both jobs once.
            delivered = prometheus.query('sum(outbox_deliveries_total{channel="email",outcome="delivered"})')
            assert scalar(delivered) == delivered_rows
            by_job = prometheus.query('sum by (job) (outbox_deliveries_total{channel="email",outcome="delivered"})')
            assert {entry["metric"]["job"]: float(entry["value"][1]) for entry in by_job} == {
                "outbox-workers": delivered_rows
            }

            # Every panel's query evaluates and has a series to draw.
            for expression in dashboard_expressions():
                assert prometheus.query(expression), f"the panel query {expression!r} returns nothing"

            # Every alert rule evaluates against real data without an error; none fires on a
            # healthy system (the one parking is more than an hour's increase() can extrapolate
            # from a minute of data, so OutboxParkedIncreasing may: it is allowed).
            def rules_evaluated() -> list[dict[str, Any]]:
                body = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()
                rules = [rule for group in body["data"]["groups"] for rule in group["rules"]]
                return rules if rules and all(rule.get("lastEvaluation", "").startswith("2") for rule in rules) else []

            poll(rules_evaluated, timeout=20, message="Prometheus did not evaluate the alert rules", interval=0.5)
            time.sleep(1.5)  # one more evaluation, with every series present
            for rule in rules_evaluated():
                assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
                if rule["name"] != "OutboxParkedIncreasing":
                    assert rule["state"] == "inactive", f"{rule['name']} is {rule['state']} on a healthy system"
        finally:
            prometheus.stop()
            stop(serve_metrics)
