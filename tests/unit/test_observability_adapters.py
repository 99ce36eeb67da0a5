"""The shipped Grafana dashboard and Prometheus alert rules use only exported metrics."""

from __future__ import annotations

import json
import re
from importlib import resources

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_dashboard_api import make_client, seed

METRIC = re.compile(r"\baitp_[a-z0-9_]+\b")
REQUIRED_ALERTS = {"AitpSlaMisses", "AitpFallbackSurge", "AitpOrphanedQueue", "AitpStaleModel"}


def _adapter_file(name: str) -> str:
    return resources.files("celery_aitp_adapters").joinpath(name).read_text("utf-8")


def _exported(store) -> set[str]:
    """Every sample name a seeded dashboard's /metrics really exposes."""
    from celery_aitp.stubs import MemoryQueueOps

    ops = MemoryQueueOps()
    seed(store, ops)
    client, dashboard = make_client(store, ops)
    dashboard.fleet.snapshot()
    store.append_records(store.keys.observations, [
        {"task": "proj.render", "tenant": "acme", "tier": "hi", "wait_s": 1.5, "runtime_s": 0.1,
         "predicted_runtime_s": 0.2, "outcome": "SUCCESS"}], maxlen=100)
    store.client.hset(store.keys.model, mapping={"version": "v1", "trained_at": 1.0})
    text = client.get("/metrics").text
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
    return names


def _expressions_of_alerts() -> dict[str, str]:
    rules = yaml.safe_load(_adapter_file("prometheus_alerts.yml"))["groups"][0]["rules"]
    return {rule["alert"]: rule["expr"] for rule in rules}


def test_alert_rules_cover_the_required_cases_with_exported_metrics(store):
    exported = _exported(store)
    alerts = _expressions_of_alerts()
    assert set(alerts) >= REQUIRED_ALERTS
    for name, expr in alerts.items():
        used = set(METRIC.findall(expr))
        assert used, name
        assert used <= exported, (name, used - exported)


def test_grafana_dashboard_is_importable_and_uses_exported_metrics(store):
    exported = _exported(store)
    dashboard = json.loads(_adapter_file("grafana_dashboard.json"))
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    used: set[str] = set()
    ids = set()
    for panel in dashboard["panels"]:
        ids.add(panel["id"])
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used.update(METRIC.findall(target["expr"]))
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
    assert len(ids) == len(dashboard["panels"])
    assert used <= exported, used - exported
    # the panels show every metric family the issue asks for
    for family in ("aitp_decisions_total", "aitp_queue_depth", "aitp_queue_oldest_age_seconds",
                   "aitp_queue_wait_seconds_bucket", "aitp_run_seconds_bucket",
                   "aitp_prediction_error_seconds", "aitp_sla_misses_total",
                   "aitp_tenant_share", "aitp_fairness_index", "aitp_priority_entropy",
                   "aitp_model_info"):
        assert family in used, family


def test_docs_document_every_metric_endpoint_and_option():
    from pathlib import Path

    from celery_aitp.dashboard.api import ENDPOINTS
    from celery_aitp.dashboard.metrics import METRICS

    section = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text("utf-8")
    for name in METRICS:
        assert f"`{name}`" in section or f"`{name}`," in section, name
        for label in METRICS[name][1]:
            assert label in section, (name, label)
    for endpoint in ENDPOINTS:
        path = endpoint.split(" ", 1)[1].split("?")[0]
        assert path in section, endpoint
    for option in ("--port", "--address", "--basic-auth", "--url-prefix", "--read-only",
                   "AITP_DASHBOARD_PORT", "AITP_DASHBOARD_ADDRESS", "AITP_DASHBOARD_BASIC_AUTH",
                   "AITP_DASHBOARD_URL_PREFIX", "AITP_DASHBOARD_READ_ONLY", "/healthz", "/readyz"):
        assert option in section, option
