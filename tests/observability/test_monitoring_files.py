"""The Grafana dashboard and the alert rules in docs/monitoring/ use exactly the metric names
/metrics exports: a renamed metric would leave a panel empty and an alert silent."""

import json
import re

import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import ROOT

MONITORING = ROOT / "docs" / "monitoring"
METRIC_NAME = re.compile(r"\b(outbox_[a-z_]+)\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def exported(db: None) -> set[str]:
    """Every sample name one scrape of this process's /metrics shows, and its families'."""
    from notifications.metrics import kpi_cache

    kpi_cache.clear()
    text = Client().get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        if family.type == "counter":  # before its first count a counter has no sample yet
            names.add(family.name + "_total")
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((MONITORING / "prometheus-alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def test_the_dashboard_and_alerts_name_only_exported_metrics(db):
    names = exported(db)
    for expression in dashboard_expressions() + alert_expressions():
        for name in METRIC_NAME.findall(expression):
            assert name in names, f"{name} (in {expression!r}) is not exported by /metrics"


def test_the_dashboard_shows_every_exported_metric(db):
    used = {name for expression in dashboard_expressions() for name in METRIC_NAME.findall(expression)}
    families = {name for name in exported(db) if name.startswith("outbox_")}
    for family in ("outbox_deliveries_total", "outbox_delivery_seconds", "outbox_ingest_to_delivered_seconds"):
        assert any(name.startswith(family) for name in used), f"no panel shows {family}"
    for gauge in (
        "outbox_queue_depth",
        "outbox_parked",
        "outbox_stuck",
        "outbox_oldest_pending_seconds",
        "outbox_site_backlog",
        "outbox_channel_open",
        "outbox_worker_last_seen_seconds",
    ):
        assert gauge in families and gauge in used, f"no panel shows {gauge}"


def test_every_alert_rule_is_complete():
    rules = yaml.safe_load((MONITORING / "prometheus-alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) >= {"alert", "expr", "labels", "annotations"}, rule
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"]
