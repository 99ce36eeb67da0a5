"""The deployment kits are what users copy: each file is read by the tool that reads it
where one runs here (docker compose's own parser, promtool, the Kubernetes API schemas),
and checked against what it configures (the policy, the worker flags, the metrics the
dashboard exports, the files it mounts).

No Docker engine runs here: ``docker compose config`` (or Debian's ``docker-compose``)
parses and validates the compose file without one. In CI a missing tool fails the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from celery_aitp.dashboard.metrics import METRICS
from celery_aitp.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPOSE = EXAMPLES / "compose"
KUBERNETES = EXAMPLES / "kubernetes"
POLICY = load_policy(str(EXAMPLES / "aitp.yaml"))
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")  # the oldest we name, and the newest schemas


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed: .ci/run must install it", pytrace=False)
        pytest.skip(f"{tool} is not installed")
    return found


# --- the policy file -----------------------------------------------------------------

def test_the_commented_policy_file_is_valid_for_the_command_line():
    celery_aitp = Path(sys.executable).with_name("celery-aitp")
    done = subprocess.run([str(celery_aitp), "validate", str(EXAMPLES / "aitp.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid: 4 tenant(s)" in done.stdout


def test_the_example_apps_tasks_declare_what_the_policy_has():
    from examples import proj

    for name in ("examples.proj.resize", "examples.proj.train"):
        declared = proj.app.tasks[name].aitp
        assert declared.get("tier", POLICY.tier_names[0]) in POLICY.tier_names
        assert declared.get("accelerator", POLICY.default_accelerator) in POLICY.accelerators
    assert proj.app.aitp.policy.tenants == POLICY.tenants  # it loads examples/aitp.yaml


# --- docker compose -------------------------------------------------------------------

def compose_config() -> dict[str, Any]:
    """The compose file as Docker Compose resolves it (v2 plugin, else Debian's v1)."""
    env = dict(os.environ, COMPOSE_PROJECT_NAME="aitp-kit")
    commands = [["docker", "compose"], ["docker-compose"]]
    for command in commands:
        if shutil.which(command[0]) is None:
            continue
        done = subprocess.run([*command, "config"], cwd=COMPOSE, env=env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            return yaml.safe_load(done.stdout)
        if "is invalid" in done.stderr or "validating" in done.stderr:
            pytest.fail(f"{' '.join(command)} config: {done.stderr}")
    need("docker-compose")  # neither parser is there
    raise AssertionError("unreachable")


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (either output format)."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        found[target] = Path(source)
    return found


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return compose_config()


def test_compose_runs_the_whole_kit(compose):
    assert set(compose["services"]) == {"redis", "producer", "worker-cpu", "worker-gpu",
                                        "dashboard", "prometheus", "grafana"}


def test_every_mounted_file_of_compose_exists(compose):
    for name, service in compose["services"].items():
        for target, source in mounts(service).items():
            assert source.exists(), (name, target, source)


def test_compose_has_a_worker_for_each_accelerator_class_and_one_default_queue(compose):
    workers = {name: service["command"] for name, service in compose["services"].items()
               if "worker" in service.get("command", [])}
    classes = {option(cmd, "--aitp-accelerator"): name for name, cmd in workers.items()}
    assert set(classes) == set(POLICY.accelerators)
    on_default = [name for name, cmd in workers.items() if "--aitp-no-default-queue" not in cmd]
    assert on_default == ["worker-cpu"]  # fallbacks have somewhere to run


def test_prometheus_scrapes_the_dashboard_and_loads_the_shipped_rules(compose):
    prometheus = compose["services"]["prometheus"]
    mounted = mounts(prometheus)
    config_path = mounted["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        in_container = str(PurePosixPath("/etc/prometheus") / rule_file)
        assert mounted[in_container].resolve() == ROOT / "adapters" / "prometheus_alerts.yml"
    (job,) = config["scrape_configs"]
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    dashboard = compose["services"][host]["command"]
    assert f"--port {port}" in " ".join(dashboard)
    secret = PurePosixPath(job["basic_auth"]["password_file"])
    assert secret.parent == PurePosixPath("/run/secrets")
    for service in (prometheus, compose["services"][host]):  # both see the one password
        assert secret.name in {s if isinstance(s, str) else s["source"]
                               for s in service["secrets"]}
    assert f"/run/secrets/{secret.name}" in " ".join(dashboard)


def test_promtool_accepts_the_prometheus_config_as_mounted(compose, tmp_path):
    promtool = need("promtool")
    for target, source in mounts(compose["services"]["prometheus"]).items():
        shutil.copy(source, tmp_path / PurePosixPath(target).name)  # /etc/prometheus/...
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout


def test_grafana_provisions_the_datasource_and_the_shipped_dashboard(compose):
    mounted = mounts(compose["services"]["grafana"])
    provisioning = mounted["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "celery_aitp.yml").read_text())["providers"]
    folder = PurePosixPath(provider["options"]["path"])
    dashboards = [source for target, source in mounted.items()
                  if PurePosixPath(target).parent == folder]
    assert [d.resolve() for d in dashboards] == [ROOT / "adapters" / "grafana_dashboard.json"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"  # the prometheus service
    dashboard = json.loads(dashboards[0].read_text())
    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])
                 if v.get("type") == "datasource"}
    for ref in datasource_refs(dashboard):
        uid = ref.get("uid", "")
        variable = re.fullmatch(r"\$\{?(\w+)\}?", uid)
        # A provisioned dashboard gets no import inputs: a ${NAME} must be a variable.
        assert (variable and variable.group(1) in variables) or uid == datasource["uid"], uid


def datasource_refs(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        ref = node.get("datasource")
        if isinstance(ref, dict):
            found.append(ref)
        for value in node.values():
            found.extend(datasource_refs(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(datasource_refs(value))
    return found


# --- Kubernetes -------------------------------------------------------------------------

def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in manifests() if doc["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"]["containers"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_objects_match_the_api_schemas(version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate") if not os.environ.get(
        "CI") else __import__("kubernetes_validate")
    checked = 0
    for doc in manifests():
        if "." in doc["apiVersion"].split("/")[0]:  # a custom resource: checked below
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked == 5  # a ConfigMap, three Deployments, a Service


def test_one_worker_deployment_per_accelerator_class_each_with_a_readiness_probe():
    workers = {}
    for name, deployment in of_kind("Deployment").items():
        for container in containers(deployment):
            command = container["command"]
            assert container["readinessProbe"], name
            if "worker" not in command:
                continue
            workers[option(command, "--aitp-accelerator")] = name
            node = option(command, "-n").split("@")[0]
            probe = " ".join(container["readinessProbe"]["exec"]["command"])
            assert f'ping -d "{node}@$HOSTNAME"' in probe  # the name -n gives it (%h)
    assert set(workers) == set(POLICY.accelerators)
    gpu = containers(of_kind("Deployment")[workers["gpu"]])[0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_every_reference_in_the_manifests_names_something_that_exists():
    config_maps = set(of_kind("ConfigMap"))
    secrets = set()
    for deployment in of_kind("Deployment").values():
        for container in containers(deployment):
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps
            for env in container.get("env", []):
                source = env.get("valueFrom", {})
                if "secretKeyRef" in source:
                    secrets.add(source["secretKeyRef"]["name"])
                elif source:  # the pod's own fields (its IP, for the dashboard's Host check)
                    assert source["fieldRef"]["fieldPath"].startswith("status."), env
    for monitor in of_kind("ServiceMonitor").values():
        for endpoint in monitor["spec"]["endpoints"]:
            secrets.update(ref["name"] for ref in endpoint["basicAuth"].values())
    assert secrets == {"aitp-dashboard-auth"}  # the one secret config.yaml says to create
    assert "aitp-dashboard-auth" in (KUBERNETES / "config.yaml").read_text()


def test_the_service_monitor_selects_the_dashboard_service_and_its_port():
    (monitor,) = of_kind("ServiceMonitor").values()
    (service,) = of_kind("Service").values()
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= service["metadata"]["labels"].items()
    ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    pods = of_kind("Deployment")["aitp-dashboard"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()


def matchers(selector: str) -> dict[str, str]:
    """``{label: value}`` of a PromQL selector's ``label="value"`` matchers."""
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', selector))


def test_keda_scales_each_worker_on_the_backlog_of_the_queues_it_serves():
    deployments = of_kind("Deployment")
    scaled = of_kind("ScaledObject")
    assert set(scaled) == {"aitp-worker-cpu", "aitp-worker-gpu"}
    for name, obj in scaled.items():
        spec = obj["spec"]
        target = deployments[spec["scaleTargetRef"]["name"]]
        command = containers(target)[0]["command"]
        accelerator = option(command, "--aitp-accelerator")
        assert spec["minReplicaCount"] >= 1  # a class at zero is never routed to: no depth
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA's rule
        selectors = re.findall(r"(aitp_[a-z_]+)\{([^}]*)\}", trigger["metadata"]["query"])
        kinds = set()
        for metric, selector in selectors:
            assert metric == "aitp_queue_depth", metric
            found = matchers(selector)
            assert set(found) <= set(METRICS[metric][1]), (metric, found)
            kinds.add(found["kind"])
            if found["kind"] == "tier":  # this class's tier queues, every tenant and tier
                assert found == {"kind": "tier", "accelerator": accelerator}, name
        # the default queue's backlog counts exactly where the worker serves it
        assert ("default" in kinds) == ("--aitp-no-default-queue" not in command), name
        assert "tier" in kinds, name
