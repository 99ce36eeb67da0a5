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
#: One counter key per named event family, so each exports a sample.
EVENT_KEYS = {"tenant_unknown": 2, "labels_unknown": 1, "visibility_eta": 1,
              "rejected:model": 1, "records_dropped:decisions": 4, "store_errors": 1,
              "history_dropped": 1, "evacuated": 3, "aged": 1, "aging_inspected": 5,
              "aging_no_age": 1, "from_a_newer_worker": 1}


def _adapter_file(name: str) -> str:
    return resources.files("celery_aitp_adapters").joinpath(name).read_text("utf-8")


def _exported(store) -> set[str]:
    """Every sample name a seeded dashboard's /metrics really exposes."""
    from celery_aitp.stubs import MemoryQueueOps

    ops = MemoryQueueOps()
    seed(store, ops)
    store.add_counts(EVENT_KEYS)
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


def _family_of(sample: str) -> str:
    """The METRICS entry a sample name belongs to (histogram series, info)."""
    from celery_aitp.dashboard.metrics import METRICS

    for suffix in ("", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample.removesuffix(suffix) in METRICS:
            return sample.removesuffix(suffix)
    raise AssertionError(f"{sample} is not an exported family")


def test_grafana_dashboard_is_importable_and_uses_exported_metrics(store):
    from celery_aitp.dashboard.metrics import METRICS

    exported = _exported(store)
    dashboard = json.loads(_adapter_file("grafana_dashboard.json"))
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert "__inputs" not in dashboard  # the data source is a variable: provisioning works
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "tenant", "tier"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "tenant", "tier"):
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
        assert METRIC.findall(variables[name]["definition"]), name
        assert f", {name})" in variables[name]["definition"], name  # label_values(..., name)
    assert variables["tenant"]["multi"] and variables["tier"]["includeAll"]
    used: set[str] = set()
    ids = set()
    for panel in dashboard["panels"]:
        ids.add(panel["id"])
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'job=~"$job"' in expr, (panel["title"], expr)
            # rate windows follow the scrape interval, never a fixed [1m] or [5m]
            assert not re.search(r"\[\d+[smhd]\]", expr), (panel["title"], expr)
            if "rate(" in expr:
                assert "[$__rate_interval]" in expr, (panel["title"], expr)
            names = METRIC.findall(expr)
            used.update(names)
            for label in ("tenant", "tier"):  # every family that has the label filters by it
                if any(label in METRICS[_family_of(n)][1] for n in names):
                    assert f'{label}=~"${label}"' in expr, (panel["title"], label, expr)
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
    assert len(ids) == len(dashboard["panels"])
    assert used <= exported, used - exported
    # the panels show every metric family the issue asks for
    for family in ("aitp_decisions_total", "aitp_queue_depth", "aitp_queue_oldest_age_seconds",
                   "aitp_queue_wait_seconds_bucket", "aitp_run_seconds_bucket",
                   "aitp_prediction_error_seconds", "aitp_sla_misses_total",
                   "aitp_tenant_share_ratio", "aitp_fairness_index", "aitp_priority_entropy",
                   "aitp_model_info", "aitp_split_ratio", "aitp_model_trained_timestamp_seconds",
                   "aitp_rejected_inputs_total", "aitp_records_dropped_total"):
        assert family in used, family


def test_docs_document_every_metric_endpoint_and_option():
    from pathlib import Path

    from celery_aitp.cli.celery_command import aitp
    from celery_aitp.dashboard.api import ENDPOINTS
    from celery_aitp.dashboard.config import ENV_PREFIX
    from celery_aitp.dashboard.metrics import METRICS

    section = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text("utf-8")
    rows = {}  # metric name -> (type, labels) from the reference table's rows
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`aitp_"):
            for name in re.findall(r"`(aitp_[a-z_]+)`", cells[0]):
                rows[name] = (cells[1], cells[2])
    assert set(rows) == set(METRICS), set(rows) ^ set(METRICS)
    for name, (kind, labels, _) in METRICS.items():
        assert rows[name] == (kind, ", ".join(labels) or "none"), name
    for endpoint in ENDPOINTS:
        path = endpoint.split(" ", 1)[1].split("?")[0]
        assert path in section, endpoint
    options = [row.split("|")[1].strip() for row in section.splitlines()
               if row.startswith("| `--")]  # the options table's first column
    for param in aitp.commands["dashboard"].params:  # each flag and its variable, from the code
        flag, env = param.opts[0], ENV_PREFIX + str(param.name).upper()
        assert any(cell.startswith(f"`{flag}") for cell in options), flag
        assert f"`{env}`" in section, env
    for path in ("/healthz", "/readyz", "/healthcheck"):
        assert path in section, path
