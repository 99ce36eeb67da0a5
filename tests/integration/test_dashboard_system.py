"""The dashboard against a running system: real workers, real Redis, the real CLI server.

One system per module (two workers, one ``celery aitp dashboard`` process with basic
auth): the JSON API and /metrics are compared with what the store and the broker hold,
then headless Chromium drives every page, checks rendered values against the store,
changes the stage through the form and saves a screenshot of each page.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_aitp.priority_policy import FACTORS
from tests.conftest import TEST_POLICY, _cleanup, environment
from tests.support.browser import browser_context
from tests.support.dashboard_process import DashboardCommand, free_port, wait_for
from tests.support.workers import ROOT, WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]

USER, PASSWORD = "ops", "s3cret:pw"
ORPHAN = "aitp.globex.gpu.mid"
ORPHAN_AGE_S = 30.0
TASKS = 24


class PredictStub:
    """Stands in for the prediction stage: a fixed estimate per task."""

    name = "predict"

    def __call__(self, request: Any, decision: Any, view: Any) -> None:
        decision.predicted_runtime_s = 0.05 if request.task.endswith(".lo") else 0.02
        decision.prediction_source = "test-stub"


class System:
    def __init__(self, proj: Any, url: str, port: int) -> None:
        self.proj = proj
        self.url = url
        self.port = port
        self.store = proj.app.aitp.store
        self.auth = (USER, PASSWORD)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("auth", self.auth)
        return httpx.get(self.url + path, timeout=10, **kwargs)

    def json(self, path: str) -> Any:
        response = self.get(path)
        assert response.status_code == 200, (path, response.text)
        return response.json()


def _push_orphaned_message(store: Any, queue: str, age_s: float) -> None:
    """A kombu-shaped message in a tier queue nobody serves (the janitor is slowed down)."""
    message = {"body": "", "headers": {"aitp": {"decided_at": time.time() - age_s}},
               "properties": {"delivery_info": {"routing_key": queue}}}
    store.client.lpush(queue, json.dumps(message))


def _publish(proj: Any) -> None:
    tasks = [proj.hi, proj.lo, proj.gpu, proj.add]
    tenants = ["acme", "globex", "default", None]
    results = []
    for i in range(TASKS):
        task, tenant = tasks[i % 4], tenants[(i // 4) % 4]
        headers = {"aitp_tenant": tenant} if tenant else {}
        args = (i, i) if task is proj.add else (i, 0.01)
        results.append(task.apply_async(args, headers=headers))
    for result in results:
        result.get(timeout=30)


@pytest.fixture(scope="module")
def system(redis_url: str) -> Iterator[System]:
    tag = uuid.uuid4().hex[:8]
    env = {"AITP_TEST_BROKER": redis_url, "AITP_TEST_PREFIX": f"aitptest-{tag}",
           "AITP_TEST_QUEUE": f"aitptest-{tag}", "AITP_TEST_POLICY": json.dumps(TEST_POLICY),
           "AITP_TEST_EVACUATE_INTERVAL": "3600"}  # keep the orphaned message in place
    with environment(env):
        sys.modules.pop("tests.apps.proj", None)
        proj = importlib.import_module("tests.apps.proj")
        mw = proj.app.aitp
        mw.use_stage("predict", PredictStub())
        workers = [WorkerProcess(f"acme-{tag}", ["--aitp-tenant", "acme",
                                                 "--aitp-no-default-queue"], env),
                   WorkerProcess(f"plain-{tag}", [], env)]
        dashboard = DashboardCommand(["--refresh", "0.5", "--basic-auth", f"{USER}:{PASSWORD}"])
        try:
            for worker in workers:
                worker.start()
            wait_for(lambda: "aitp.acme.cpu.hi" in mw.store.live_queues(), "advertisement")
            mw.live.refresh()
            try:
                _publish(proj)
            except Exception as exc:
                logs = "\n".join(f"--- {w.name}\n{w.output()[-2500:]}" for w in workers)
                raise AssertionError(f"tasks did not complete ({exc!r}):\n{logs}") from exc
            _push_orphaned_message(mw.store, ORPHAN, ORPHAN_AGE_S)
            mw.live.flush()
            obs = mw.store.keys.observations
            wait_for(lambda: len(mw.store.read_records(obs)) >= TASKS, "observations")
            dashboard.start()
            yield System(proj, dashboard.url, dashboard.port)
        finally:
            dashboard.stop()
            for worker in workers:
                worker.stop()
                worker.log.unlink(missing_ok=True)
            mw.close()
            sys.modules.pop("tests.apps.proj", None)
            _cleanup(redis_url, tag)
            for key in mw.store.client.scan_iter(f"{ORPHAN}*"):
                mw.store.client.delete(key)


def _stage(store: Any) -> str:
    """The effective stage: the store's document, else the policy's."""
    return str((store.read_stage() or {"stage": TEST_POLICY["stage"]})["stage"])


def _decision_counts(store: Any) -> Counter[str]:
    reasons: Counter[str] = Counter()
    for key, n in store.counts().items():
        if key.startswith("decisions:"):
            reasons[key.split(":", 5)[5]] += n
    return reasons


def test_api_reports_what_the_store_and_broker_hold(system):
    store = system.store
    overview = system.json("/api/overview")
    assert overview["stage"]["stage"] == _stage(store)
    reasons = _decision_counts(store)
    total = overview["decisions"]["total"]
    assert total["total"] == sum(reasons.values()) == TASKS
    assert {r["reason"]: r["count"] for r in total["reasons"]} == dict(reasons)
    assert overview["workers"]["alive"] == len(store.workers()) == 1  # only the flagged one
    assert overview["orphaned_queues"] == [ORPHAN]

    from celery_aitp_adapters.redis_queues import RedisQueueOps

    ops = RedisQueueOps(system.proj.app)
    queues = {q["queue"]: q for q in system.json("/api/queues")["queues"]}
    assert {name: q["depth"] for name, q in queues.items()} == ops.depths(list(queues))
    assert queues[ORPHAN]["orphaned"] and queues[ORPHAN]["depth"] == 1
    assert queues[ORPHAN]["oldest_age_s"] == pytest.approx(ORPHAN_AGE_S, abs=15)
    default = system.proj.app.conf.task_default_queue
    assert queues[default]["kind"] == "default"
    assert queues["aitp.acme.cpu.hi"]["consumers"] == [store.workers()[0]["worker"]]

    workers = system.json("/api/workers")["workers"]
    assert [w["worker"] for w in workers] == [w["worker"] for w in store.workers()]
    assert workers[0]["tenants"] == ["acme"] and workers[0]["accelerator"] == "cpu"

    runs = store.read_records(store.keys.observations)
    by_tenant = Counter(r["tenant"] for r in runs)
    tenants = {t["tenant"]: t for t in system.json("/api/tenants")["tenants"]}
    assert {name: t["runs"] for name, t in tenants.items() if t["runs"]} == dict(by_tenant)

    predictions = system.json("/api/predictions")
    assert len(predictions["points"]) == len(runs) == TASKS
    decision = store.read_records(store.keys.decisions)[3]
    task = system.json(f"/api/tasks/{decision['task_id']}")
    for key in ("tier", "tenant", "queue", "reason", "routed"):
        assert task["decision"][key] == decision[key], key
    assert task["run"]["worker"] and task["prediction"]["source"] == "test-stub"
    recorded = [name for name in FACTORS
                if isinstance((decision.get("factors") or {}).get(name), (int, float))]
    assert recorded and [f["factor"] for f in task["factors"]] == recorded
    assert task["note"] is None  # found in the decision log, decided by the active policy


def test_metrics_health_and_readiness(system):
    text = system.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("aitp_decisions", "aitp_queue_depth", "aitp_queue_oldest_age_seconds",
                 "aitp_queue_wait_seconds", "aitp_run_seconds", "aitp_prediction_error_seconds",
                 "aitp_prediction_relative_error", "aitp_sla_misses", "aitp_tenant_share_ratio",
                 "aitp_fairness_index", "aitp_priority_entropy", "aitp_model_loaded",
                 "aitp_model_info", "aitp_stage", "aitp_workers"):
        assert name in families, name
    decisions = sum(s.value for s in families["aitp_decisions"].samples)
    assert decisions == sum(_decision_counts(system.store).values())
    orphaned = {s.labels["queue"]: s.value for s in families["aitp_queue_orphaned"].samples}
    assert orphaned[ORPHAN] == 1 and sum(orphaned.values()) == 1
    assert families["aitp_store_up"].samples[0].value == 1
    assert families["aitp_broker_up"].samples[0].value == 1
    assert all("task_id" not in s.labels for f in families.values() for s in f.samples)

    health = httpx.get(system.url + "/healthz", timeout=5)  # no credentials: probes are open
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = httpx.get(system.url + "/readyz", timeout=5)
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["checks"]["store"]["ok"]
    assert body["checks"]["model"]["state"] == "cold_start"


def test_auth_and_cross_site_protection_on_the_running_server(system):
    assert system.get("/", auth=None).status_code == 401
    assert system.get("/api/overview", auth=(USER, "wrong")).status_code == 401
    assert system.get("/metrics", auth=None).status_code == 401
    with httpx.Client(base_url=system.url, auth=system.auth, timeout=10) as client:
        client.get("/stage")
        token = client.cookies["aitp_csrf"]
        before = system.store.read_stage()
        evil = client.post("/api/stage", json={"stage": "coexistence"}, headers={
            "X-AITP-CSRF": token, "Origin": "http://evil.example"})
        assert evil.status_code == 403 and "cross-site" in evil.json()["error"]
        assert client.post("/api/stage", json={"stage": "coexistence"}).status_code == 403
        assert system.store.read_stage() == before
        good = client.post("/api/stage", json={"stage": "takeover", "split": {}},
                           headers={"X-AITP-CSRF": token, "Origin": system.url})
        assert good.status_code == 200, good.text
    entry = system.store.stage_history(1)[0]
    assert entry["who"].startswith(f"dashboard:{USER}@") and entry["new"]["stage"] == "takeover"


def test_cli_refuses_a_public_address_without_auth(system):
    base = [sys.executable, "-m", "celery", "-A", "tests.apps.proj", "aitp", "dashboard"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    flag = subprocess.run([*base, "--address", "0.0.0.0", "--port", str(free_port())], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert flag.returncode != 0 and "--basic-auth" in flag.stderr
    by_env = subprocess.run(base, env=dict(env, AITP_DASHBOARD_ADDRESS="0.0.0.0"),
                            cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert by_env.returncode != 0 and "refusing to listen" in by_env.stderr


# --- the browser ----------------------------------------------------------------------


def _screens_dir(tmp_path: Path) -> Path:
    """Where the screenshots go: ``AITP_TEST_SCREENSHOTS`` to keep them, else the test's
    own temporary directory (pytest prunes it)."""
    wanted = os.environ.get("AITP_TEST_SCREENSHOTS")
    path = Path(wanted) if wanted else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def _open(page: Any, url: str, loads: int = 1) -> None:
    page.goto(url)
    page.wait_for_function("n => Number(document.body.dataset.loaded || 0) >= n", arg=loads,
                           timeout=15_000)


def _text_becomes(page: Any, selector: str, expected: str) -> None:
    page.wait_for_function(
        "([s, e]) => { const n = document.querySelector(s); "
        "return n && n.textContent.trim() === e; }",
        arg=[selector, expected], timeout=15_000)


def _visit_data_pages(page: Any, system: System, shots: Path) -> None:
    store, url = system.store, system.url
    _open(page, url + "/")
    _text_becomes(page, "#stage-value", _stage(store))
    _text_becomes(page, "#workers-value", str(len(store.workers())))
    routed = _decision_counts(store)["routed"]
    _text_becomes(page, "tr[data-reason='routed'] td[data-field='total']", str(routed))
    assert page.locator("#rate-chart svg, #rate-chart .empty").count() == 1
    assert page.locator("#reasons-chart svg rect[data-label]").count() >= 1
    page.screenshot(path=str(shots / "overview.png"), full_page=True)

    _open(page, url + "/tenants")
    runs = Counter(r["tenant"] for r in store.read_records(store.keys.observations))
    for tenant, n in runs.items():
        _text_becomes(page, f"tr[data-tenant='{tenant}'] td[data-field='runs']", str(n))
    assert page.locator("#share-chart svg rect[data-series]").count() >= len(runs)
    page.screenshot(path=str(shots / "tenants.png"), full_page=True)

    _open(page, url + "/queues")
    _text_becomes(page, f"tr[data-queue='{ORPHAN}'] td[data-field='depth']", "1")
    assert "orphaned" in (page.get_attribute(f"tr[data-queue='{ORPHAN}']", "class") or "")
    default = system.proj.app.conf.task_default_queue
    assert page.locator(f"tr.default[data-queue='{default}']").count() == 1
    assert page.locator("#depth-chart svg rect[data-label]").count() >= 2
    page.screenshot(path=str(shots / "queues.png"), full_page=True)

    _open(page, url + "/workers")
    for worker in store.workers():
        row = f"tr[data-worker='{worker['worker']}']"
        _text_becomes(page, f"{row} td[data-field='class']", worker["accelerator"])
        _text_becomes(page, f"{row} td[data-field='tenants']", ", ".join(worker["tenants"]))
    page.screenshot(path=str(shots / "workers.png"), full_page=True)

    _open(page, url + "/predictions")
    predicted = Counter(r["task"] for r in store.read_records(store.keys.observations)
                        if r.get("predicted_runtime_s") is not None)
    for task, n in predicted.items():
        _text_becomes(page, f"tr[data-task='{task}'] td[data-field='n']", str(n))
    points = page.get_attribute("#scatter-chart svg", "data-points")
    assert points == str(sum(predicted.values()))
    page.screenshot(path=str(shots / "predictions.png"), full_page=True)


def _visit_task(page: Any, system: System, shots: Path) -> None:
    store = system.store
    decision = store.read_records(store.keys.decisions, newest_first=True)[0]
    _open(page, system.url + "/tasks")
    link = page.locator(f"tr[data-task-id='{decision['task_id']}'] a")
    page.screenshot(path=str(shots / "tasks.png"), full_page=True)
    link.click()
    page.wait_for_url(f"**/tasks/{decision['task_id']}")
    page.wait_for_function("() => Number(document.body.dataset.loaded || 0) >= 1",
                           timeout=15_000)
    _text_becomes(page, "#tier-value", decision["tier"])
    _text_becomes(page, "tr[data-key='reason'] td", decision["reason"])
    _text_becomes(page, "tr[data-key='queue'] td", decision["queue"])
    recorded = [v for v in (decision.get("factors") or {}).values() if isinstance(v, (int, float))]
    assert page.locator("#factors-chart svg rect[data-label]").count() == len(recorded) > 0
    page.screenshot(path=str(shots / "task.png"), full_page=True)


def _change_stage(page: Any, system: System, shots: Path, errors: list[str]) -> None:
    store = system.store
    _open(page, system.url + "/stage")
    page.check("input[name=stage][value=split]")
    page.fill("#split-percent", "30")
    page.fill("#split-tenants", "acme")
    page.click("#stage-submit")
    _text_becomes(page, "#stage-result", "applied: split")
    doc = store.read_stage()
    assert doc["stage"] == "split" and doc["split"]["percent"] == 30
    assert doc["split"]["tenants"] == ["acme"]
    assert store.stage_history(1)[0]["who"].startswith(f"dashboard:{USER}@")
    _text_becomes(page, "#stage-value", "split")
    _text_becomes(page, "#split-value", "30%")
    page.screenshot(path=str(shots / "stage.png"), full_page=True)
    assert errors == [], errors
    page.fill("#split-percent", "150")  # refused by the policy's validation, field named
    page.click("#stage-submit")
    page.wait_for_function("() => document.querySelector('#stage-result').className === 'bad'")
    assert "split.percent" in page.inner_text("#stage-result")
    assert store.read_stage()["split"]["percent"] == 30
    # the browser logs the refused request itself; nothing else may appear
    assert errors and all("400" in e for e in errors), errors
    errors.clear()


ATTACKER = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{url}/api/stage">
<input name='{{"stage":"coexistence","x":"' value='"}}'></form>
<script>
fetch("{url}/api/stage", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{stage: "coexistence"}})}})
  .catch(() => null).then(() => document.getElementById("f").submit());
</script></body></html>"""


def _cross_site_attempt(context: Any, system: System) -> None:
    """A page on another site posts to stage control, by fetch and by a classic form."""
    before = system.store.read_stage()
    page = context.new_page()
    page.route("http://attacker.test/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body=ATTACKER.format(url=system.url)))
    statuses: list[int] = []
    page.on("response", lambda r: statuses.append(r.status) if "/api/stage" in r.url else None)
    page.goto("http://attacker.test/")
    page.wait_for_url(f"{system.url}/api/stage", timeout=15_000)  # the form navigated
    assert statuses and all(s == 403 for s in statuses), statuses
    assert "cross-site" in page.inner_text("body")
    assert system.store.read_stage() == before
    page.close()


def test_browser_drives_every_page(system, tmp_path):
    shots = _screens_dir(tmp_path)
    errors: list[str] = []
    with browser_context(http_credentials={"username": USER, "password": PASSWORD},
                         viewport={"width": 1280, "height": 900}) as context:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        _visit_data_pages(page, system, shots)
        _visit_task(page, system, shots)
        _change_stage(page, system, shots, errors)
        _cross_site_attempt(context, system)
    assert errors == [], errors
    for name in ("overview", "tenants", "queues", "workers", "predictions", "tasks", "task",
                 "stage"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    print(f"screenshots: {shots}")


def test_browser_read_only_hides_stage_control(system):
    from celery_aitp.dashboard.config import DashboardConfig
    from celery_aitp.dashboard.server import BackgroundServer

    server = BackgroundServer(system.proj.app.aitp,
                              DashboardConfig(port=0, read_only=True, refresh_s=0.5)).start()
    errors: list[str] = []
    try:
        with browser_context() as context:
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            _open(page, f"http://127.0.0.1:{server.port}/stage")
            assert page.locator("#stage-control").count() == 0
            assert "Read-only mode" in page.inner_text("main")
            _text_becomes(page, "#stage-value", _stage(system.store))
            post = httpx.post(f"http://127.0.0.1:{server.port}/api/stage",
                              json={"stage": "coexistence"}, timeout=5)
            assert post.status_code == 405
    finally:
        server.stop()
    assert errors == [], errors
