"""The dashboard's HTTP surface on fakes: pages, JSON API, metrics, auth, CSRF, read-only."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import fakeredis
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from celery_aitp.dashboard.api import MAX_JSON_DEPTH, Dashboard, parse_json_body
from celery_aitp.dashboard.app import create_app
from celery_aitp.dashboard.config import DashboardConfig
from celery_aitp.dashboard.fleet import Fleet
from celery_aitp.dashboard.metrics import METRICS, family_name
from celery_aitp.policy import parse_policy
from celery_aitp.priority_policy import FACTORS
from celery_aitp.scheduling.usage import UsageStore, read_usage
from celery_aitp.store import Keys, RedisStore
from celery_aitp.stubs import MemoryQueueOps
from tests.conftest import TEST_POLICY

TASKS = ("proj.render", "proj.report")
#: The Host Starlette's test client sends: a name the dashboard must be told to answer to.
TEST_HOST = "testserver"


def seed(store: RedisStore, ops: MemoryQueueOps) -> None:
    """A small fleet: one gpu worker for acme, decisions, runs, an orphaned queue."""
    now = time.time()
    store.advertise("gpu1@host", ["aitp.acme.gpu.hi", "aitp.acme.gpu.mid"],
                    {"tenants": ["acme"], "accelerator": "gpu", "tiers": ["hi", "mid"],
                     "default_queue": False}, ttl_s=60)
    store.add_counts({"decisions:takeover:acme:hi:gpu:routed": 6,
                      "decisions:takeover:globex:mid:cpu:no_live_worker": 3,
                      "decisions:takeover:::unknown:error:KeyError": 1,
                      "tenant_unknown": 2})
    decisions = [
        {"task": TASKS[0], "task_id": f"id-{i}", "tenant": "acme", "tier": "hi",
         "accelerator": "gpu", "queue": "aitp.acme.gpu.hi", "routed": True, "reason": "routed",
         "stage": "takeover", "decided_at": now - 5, "predicted_runtime_s": 0.5,
         "factors": {"tenant": 0.7, "sla": 0.5, "age": 0.2, "impact": "bad"},
         "score": 0.8, "profile": {"memory_mb": 512}}
        for i in range(6)
    ] + [{"task": TASKS[1], "task_id": "g-1", "tenant": "globex", "tier": "mid"}]  # older shape
    store.append_records(store.keys.decisions, decisions, maxlen=1000)
    runs = [
        {"task": TASKS[0], "task_id": f"id-{i}", "tenant": "acme", "tier": "hi", "wait_s": 0.5 + i,
         "runtime_s": 0.4, "predicted_runtime_s": 0.5, "outcome": "SUCCESS", "worker": "gpu1@host"}
        for i in range(6)
    ] + [{"task": TASKS[1], "task_id": "g-1", "tenant": "globex", "tier": "mid", "wait_s": 2.0,
          "runtime_s": 1.2, "outcome": "SUCCESS"}]
    store.append_records(store.keys.observations, runs, maxlen=1000)
    # the scheduler's decayed usage, as producers and workers write it: globex asked for
    # 4 tasks of 0.2 s and got 1 run, acme got all 6 of its 0.4 s: less than fair for globex
    UsageStore(store, parse_policy(TEST_POLICY).fair_share.half_life_s).add_and_read(
        {"p:acme": 3.0, "n:acme": 6, "o:acme": 2.4, "r:acme": 6, "p:globex": 0.8,
         "n:globex": 4, "o:globex": 0.2, "r:globex": 1, "t:hi": 6, "t:mid": 1}, now)
    ops.queues["aitp.globex.cpu.lo"].append((now - 42.0, b"stranded"))
    ops.queues["default-q"].append((now - 3.0, b"waiting"))


def make_client(store: RedisStore, ops: MemoryQueueOps | None = None,
                **config: Any) -> tuple[TestClient, Dashboard]:
    policy = parse_policy(TEST_POLICY)
    ops = ops or MemoryQueueOps()
    fleet = Fleet(store, policy, "default-q", lambda: ops, worker_ttl_s=10.0, refresh_s=0.0,
                  window_s=300.0, tasks=TASKS)
    config.setdefault("allowed_hosts", (TEST_HOST,))
    dashboard = Dashboard(DashboardConfig(**config), fleet, worker_ttl_s=10.0, version="test")
    return TestClient(create_app(dashboard)), dashboard


@pytest.fixture
def ops() -> MemoryQueueOps:
    return MemoryQueueOps()


@pytest.fixture
def client(store: RedisStore, ops: MemoryQueueOps) -> TestClient:
    seed(store, ops)
    client, dashboard = make_client(store, ops)
    dashboard.fleet.snapshot()  # back-fill the windows (first read counts nothing as new)
    return client


def test_every_page_renders_its_shell(client):
    for path, page in [("/", "overview"), ("/tenants", "tenants"), ("/queues", "queues"),
                       ("/workers", "workers"), ("/predictions", "predictions"),
                       ("/tasks", "tasks"), ("/tasks/id-1", "task"), ("/stage", "stage")]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert f'data-page="{page}"' in response.text
        assert "script-src 'self'" in response.headers["content-security-policy"]
    assert 'id="stage-form"' in client.get("/stage").text
    assert client.get("/static/dashboard.js").status_code == 200


def test_overview_counts_reasons_and_sla(client):
    data = client.get("/api/overview").json()
    assert data["stage"]["stage"] == "takeover"  # the policy's, never changed
    total = data["decisions"]["total"]
    assert (total["total"], total["routed"], total["fallback"]) == (10, 6, 4)
    reasons = {r["reason"]: r for r in total["reasons"]}
    assert reasons["error:KeyError"]["error"] and reasons["routed"]["share"] == 0.6
    sla = {row["tier"]: row for row in data["sla"]}
    assert sla["hi"]["n"] == 6 and sla["hi"]["hits"] == 1  # sla_s 1: only the 0.5 s wait
    assert sla["mid"]["hit_rate"] == 1.0 and sla["lo"]["hit_rate"] is None
    assert data["workers"] == {"alive": 1, "known": 1}
    assert data["orphaned_queues"] == ["aitp.globex.cpu.lo"] and data["queued"] == 2
    assert data["model"]["loaded"] is False and data["events"] == {"tenant_unknown": 2}


def test_a_wait_negative_beyond_a_second_is_clock_skew_not_an_sla_hit():
    """The dashboard counted runs with a wait of -15 s (a producer ahead) as SLA hits."""
    from celery_aitp.dashboard.explain import task_page
    from celery_aitp.dashboard.labels import Bounds
    from celery_aitp.dashboard.pages import sla_by_tier
    from celery_aitp.dashboard.totals import RunTotals

    policy = parse_policy(TEST_POLICY)
    runs = [{"tier": "hi", "tenant": "acme", "wait_s": w} for w in (-15.0, -0.5, 0.5, 3.0)]
    hi = {row["tier"]: row for row in sla_by_tier(policy, runs)}["hi"]
    assert (hi["n"], hi["hits"]) == (3, 2)  # -0.5 s: synced clocks, a hit
    assert hi["clock_skew"] == 1
    # what the tier's tasks waited, beside the hit rate (which loose SLAs keep at 100%)
    assert hi["wait_p95_s"] == pytest.approx(2.75)
    totals = RunTotals(Bounds(policy, TASKS), {"hi": 1.0})
    totals.add(runs)
    assert totals.wait[("acme", "hi")].n == 3  # not in the wait histogram either
    story = task_page("t", None, {"task_id": "t", "tier": "hi", "wait_s": -15.0}, policy)
    assert story["sla"]["met"] is None and story["sla"]["clock_skew"] is True


def test_queues_mark_orphaned_and_default(client):
    rows = {q["queue"]: q for q in client.get("/api/queues").json()["queues"]}
    assert rows["default-q"]["kind"] == "default" and rows["default-q"]["depth"] == 1
    orphan = rows["aitp.globex.cpu.lo"]
    assert orphan["orphaned"] and orphan["oldest_age_s"] == pytest.approx(42, abs=2)
    served = rows["aitp.acme.gpu.hi"]
    assert served["live"] and served["consumers"] == ["gpu1@host"] and not served["orphaned"]
    assert not rows["aitp.acme.cpu.hi"]["orphaned"]  # empty: nothing stranded
    assert len(rows) == 1 + 3 * 2 * 3  # default + tenants x accelerators x tiers


def test_tenants_shares_and_fairness(client, store):
    data = client.get("/api/tenants").json()
    rows = {t["tenant"]: t for t in data["tenants"]}
    assert rows["acme"]["runs"] == 6 and rows["globex"]["runs"] == 1
    assert rows["acme"]["share"] == pytest.approx(2.4 / 3.6)
    assert rows["acme"]["fair_share"] == pytest.approx(2 / 3)  # weight 2 vs 1, default idle
    assert rows["default"]["fair_share"] is None
    scheduler = read_usage(store, parse_policy(TEST_POLICY))
    assert scheduler.jain is not None and scheduler.jain < 0.99  # globex got less than asked
    assert data["fairness_index"] == pytest.approx(scheduler.jain, rel=1e-6)
    assert data["priority_entropy"] == pytest.approx(scheduler.entropy, rel=1e-6)
    assert 0 < data["priority_entropy"] < 1  # 6 hi, 1 mid, no lo
    assert rows["acme"]["wait"]["hi"]["n"] == 6


def test_workers_and_predictions(client):
    worker = client.get("/api/workers").json()["workers"][0]
    assert worker["worker"] == "gpu1@host" and worker["accelerator"] == "gpu" and worker["alive"]
    assert worker["express"] is False  # an express worker (--aitp-express) says so
    data = client.get("/api/predictions").json()
    assert len(data["points"]) == 6 and data["runs_without_prediction"] == 1
    by_task = {t["task"]: t for t in data["by_task"]}
    assert by_task[TASKS[0]]["mae_s"] == pytest.approx(0.1)


def test_task_explain_and_recent_list(client):
    recent = client.get("/api/tasks?limit=3").json()["tasks"]
    assert [t["task_id"] for t in recent] == ["g-1", "id-5", "id-4"]
    data = client.get("/api/tasks/id-2").json()
    assert data["found"] and data["decision"]["queue"] == "aitp.acme.gpu.hi"
    # the same breakdown as `celery aitp explain`: recorded numeric factors, policy order,
    # each with its weight and contribution
    assert [f["factor"] for f in data["factors"]] == ["tenant", "sla", "age"]
    weights = parse_policy(TEST_POLICY).priority.weights
    total = sum(getattr(weights, name) for name in FACTORS)
    tenant = data["factors"][0]
    assert tenant["weight"] == weights.tenant
    assert tenant["contribution"] == pytest.approx(weights.tenant * 0.7 / total)
    assert "window" in data["note"]  # no decision log given: explained from the window
    assert data["prediction"]["error_s"] == pytest.approx(0.1)
    assert data["sla"] == {"tier": "hi", "sla_s": 1.0, "met": False,  # waited 2.5 s
                           "clock_skew": False}
    older = client.get("/api/tasks/g-1").json()
    assert older["found"] and older["factors"] == [] and older["prediction"]["source"] is None
    assert client.get("/api/tasks/nope").status_code == 404
    assert client.get("/api/tasks?limit=x").status_code == 400


def _csrf(client: TestClient) -> str:
    client.get("/stage")
    return client.cookies["aitp_csrf"]


def test_stage_change_writes_the_store_with_an_audit_entry(client, store):
    token = _csrf(client)
    body = {"stage": "split", "split": {"percent": 25, "tenants": ["acme"]}}
    response = client.post("/api/stage", json=body, headers={
        "X-AITP-CSRF": token, "Origin": "http://testserver"})
    assert response.status_code == 200, response.text
    assert store.read_stage() == {"stage": "split", "split": {
        "percent": 25.0, "tenants": ["acme"], "tasks": [], "tiers": [], "max_uncertainty": None}}
    assert store.stage_history(1)[0]["who"].startswith("dashboard:anonymous@")
    assert client.get("/api/overview").json()["stage"]["stage"] == "split"


def test_bad_stage_documents_are_refused_with_the_field_named(client, store):
    token = _csrf(client)
    for body, message in [({"stage": "warp"}, "stage"),
                          ({"stage": "split", "split": {"tenants": ["nobody"]}}, "split.tenants"),
                          ({"stage": "split", "split": {"percent": 120}}, "split.percent"),
                          ({"stage": "split", "extra": 1}, "extra")]:
        response = client.post("/api/stage", json=body, headers={"X-AITP-CSRF": token})
        assert response.status_code == 400 and message in response.json()["error"], body
    assert store.read_stage() is None


def test_cross_site_posts_are_rejected(client, store):
    token = _csrf(client)
    body = {"stage": "takeover"}
    attempts = [
        {"X-AITP-CSRF": token, "Origin": "http://evil.example"},
        {"X-AITP-CSRF": token, "Origin": "null"},
        {"X-AITP-CSRF": token, "Referer": "http://evil.example/page"},
        {"X-AITP-CSRF": token, "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://testserver"},  # no token
        {"X-AITP-CSRF": "forged", "Origin": "http://testserver"},
    ]
    for headers in attempts:
        assert client.post("/api/stage", json=body, headers=headers).status_code == 403, headers
    form = client.post("/api/stage", content=b"stage=takeover", headers={
        "X-AITP-CSRF": token, "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 403
    assert store.read_stage() is None


def test_read_only_has_no_write_route_and_no_control(store, ops):
    client, _ = make_client(store, ops, read_only=True)
    client.get("/stage")
    token = client.cookies["aitp_csrf"]
    assert client.post("/api/stage", json={"stage": "takeover"},
                       headers={"X-AITP-CSRF": token}).status_code == 405
    page = client.get("/stage").text
    assert 'id="stage-form"' not in page and "Read-only mode" in page
    assert store.read_stage() is None


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_guards_everything_but_the_probes(store, ops):
    client, _ = make_client(store, ops, basic_auth=(("ann", "s3cret"), ("bob", "pw:2")))
    for path in ("/", "/api/overview", "/metrics", "/static/dashboard.js"):
        response = client.get(path)
        assert response.status_code == 401 and "Basic" in response.headers["www-authenticate"]
        assert client.get(path, headers=_basic("ann", "wrong")).status_code == 401
    assert client.get("/api/overview", headers=_basic("ann", "s3cret")).status_code == 200
    assert client.get("/api/overview", headers=_basic("bob", "pw:2")).status_code == 200
    assert client.get("/api/overview", headers={"Authorization": "Basic !!"}).status_code == 401
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").status_code == 200
    client.get("/stage", headers=_basic("bob", "pw:2"))
    token = client.cookies["aitp_csrf"]
    client.post("/api/stage", json={"stage": "takeover"},
                headers={**_basic("bob", "pw:2"), "X-AITP-CSRF": token})
    assert store.stage_history(1)[0]["who"].startswith("dashboard:bob@")


def test_url_prefix(store, ops):
    client, _ = make_client(store, ops, url_prefix="/ops/aitp")
    page = client.get("/ops/aitp/queues")
    assert page.status_code == 200 and 'data-prefix="/ops/aitp"' in page.text
    assert '/ops/aitp/static/dashboard.js' in page.text
    assert client.get("/ops/aitp/api/queues").status_code == 200
    assert client.get("/ops/aitp/healthz").status_code == 200
    assert client.get("/api/queues").status_code == 404


def test_readyz_reports_each_check_and_fails_without_the_store(store, ops):
    client, _ = make_client(store, ops)
    body = client.get("/readyz").json()
    assert body["status"] == "ready"
    assert body["checks"]["model"] == {"ok": True, "state": "cold_start"}
    store.client.hset(store.keys.model, "p50", "tree\n" * 50_000)  # a hash without a version
    assert client.get("/readyz").json()["checks"]["model"]["state"] == "invalid"
    assert client.get("/readyz").status_code == 503
    meta = {"version": "v7", "trained_at": time.time() - 60, "records": 1200}
    store.client.hset(store.keys.model, mapping={"version": "v7", "meta": json.dumps(meta)})
    assert client.get("/readyz").json()["checks"]["model"] == {
        "ok": True, "state": "loaded", "version": "v7"}
    model = client.get("/api/overview").json()["model"]
    assert model["age_s"] == pytest.approx(60, abs=5) and model["meta"]["records"] == 1200
    down = RedisStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()), Keys("down"))
    down.client.connection_pool.connection_kwargs["server"].connected = False
    dead, _ = make_client(down, ops)
    response = dead.get("/readyz")
    assert response.status_code == 503 and response.json()["checks"]["store"]["ok"] is False
    assert dead.get("/api/overview").json()["health"]["store_ok"] is False
    assert dead.get("/healthz").status_code == 200


def test_metrics_parse_and_hold_every_family(client, store):
    new_run = {"task": TASKS[0], "tenant": "acme", "tier": "hi", "wait_s": 3.0,
               "runtime_s": 0.2, "predicted_runtime_s": 0.3, "outcome": "SUCCESS"}
    store.append_records(store.keys.observations, [new_run], maxlen=1000)
    trained_at = time.time() - 60
    store.client.hset(store.keys.model, mapping={"version": "v7", "trained_at": trained_at})
    store.write_stage({"stage": "split", "split": {"percent": 25}}, who="test")
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (_, labels, _) in METRICS.items():
        base = family_name(name)
        assert base in families, name
        for sample in families[base].samples:
            assert set(sample.labels) - {"le"} == set(labels), (name, sample)
    decisions = {tuple(sorted(s.labels.items())): s.value
                 for s in families["aitp_decisions"].samples}
    assert sum(decisions.values()) == 10
    assert all("stage" not in dict(k) for k in decisions)  # the stage is aitp_stage's
    error = [k for k in decisions if ("reason", "error:KeyError") in k][0]
    assert ("tenant", "none") in error and ("outcome", "fallback") in error
    depth = {s.labels["queue"]: s for s in families["aitp_queue_depth"].samples}
    assert depth["aitp.globex.cpu.lo"].value == 1
    assert depth["aitp.globex.cpu.lo"].labels == {
        "queue": "aitp.globex.cpu.lo", "kind": "tier", "tenant": "globex",
        "accelerator": "cpu", "tier": "lo"}
    assert depth["default-q"].labels["tenant"] == "none" and depth["default-q"].value == 1
    orphaned = {s.labels["queue"]: s.value for s in families["aitp_queue_orphaned"].samples}
    assert orphaned["aitp.globex.cpu.lo"] == 1 and orphaned["aitp.acme.gpu.hi"] == 0
    # only the run appended after the first read is cumulative (back-filled ones are not)
    waits = [s for s in families["aitp_queue_wait_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["tenant"], s.labels["tier"], s.value) for s in waits] == [("acme", "hi", 1)]
    misses = {(s.labels["tenant"], s.labels["tier"]): s.value
              for s in families["aitp_sla_misses"].samples}
    assert misses == {("acme", "hi"): 1}
    info = families["aitp_model_info"].samples
    assert [(s.labels, s.value) for s in info] == [({"version": "v7"}, 1.0)]
    trained = families["aitp_model_trained_timestamp_seconds"].samples
    assert trained[0].value == pytest.approx(trained_at)  # a point in time, not an age
    stage = {s.labels["stage"]: s.value for s in families["aitp_stage"].samples}
    assert stage == {"coexistence": 0, "split": 1, "takeover": 0}
    assert families["aitp_split_ratio"].samples[0].value == 0.25  # a ratio, not a percent
    shares = {s.labels["tenant"]: s.value for s in families["aitp_tenant_share_ratio"].samples}
    assert shares["acme"] == pytest.approx(2.6 / 3.8)  # the new run counts in the window
    task_labels = {s.labels["task"] for s in families["aitp_prediction_error_seconds"].samples}
    assert task_labels <= set(TASKS) | {"other"}
    defaulted = families["aitp_tenant_defaulted"].samples
    assert [(s.labels, s.value) for s in defaulted] == [({"reason": "unknown"}, 2)]
    assert "aitp_events" not in families  # no catch-all counter


def test_each_fleet_counter_becomes_its_named_counter(store, ops):
    store.add_counts({"tenant_refused": 3, "tenant_unknown": 1, "rejected:model": 2,
                      "rejected:aitp_header:tier": 1, "records_dropped:decisions": 7,
                      "source_errors:usage": 1, "store_errors": 4, "evacuated": 5,
                      "aged": 6, "visibility_runtime": 1, "history_pairs_full": 2,
                      "a_counter_from_a_newer_worker": 9,
                      "decisions:split:acme:hi:gpu:routed": 2,
                      "decisions:takeover:acme:hi:gpu:routed": 3})
    client, _ = make_client(store, ops)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}

    def values(family: str) -> dict[tuple[str, ...], float]:
        labels = METRICS[family + "_total"][1]
        return {tuple(s.labels[name] for name in labels): s.value
                for s in families[family].samples if s.name.endswith("_total")}

    assert values("aitp_tenant_defaulted") == {("refused",): 3, ("unknown",): 1}
    assert values("aitp_rejected_inputs") == {("model",): 2, ("aitp_header:tier",): 1}
    assert values("aitp_records_dropped") == {("decisions",): 7}
    assert values("aitp_errors") == {("usage",): 1, ("store",): 4}
    assert values("aitp_evacuated_messages") == {(): 5}
    assert values("aitp_aging_promoted") == {(): 6}
    assert values("aitp_visibility_risks") == {("runtime",): 1}
    assert values("aitp_learning_dropped") == {("history_pairs_full",): 2}
    assert values("aitp_other_events") == {("a_counter_from_a_newer_worker",): 9}
    # decisions made in two stages are one series: a stage change does not split it
    assert values("aitp_decisions") == {("acme", "hi", "gpu", "routed", "routed"): 5}


def test_metrics_negotiate_openmetrics_gzip_and_name_filters(client):
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )

    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "content-encoding" not in plain.headers
    zipped = client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.text.count("\n# TYPE ") == plain.text.count("\n# TYPE ")  # decoded
    om = client.get("/metrics", headers={
        "Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(om.text)}  # the strict parser
    assert families["aitp_decisions"].type == "counter"
    assert families["aitp_model"].type == "info" and families["aitp_stage"].type == "gauge"
    only = client.get("/metrics?name[]=aitp_stage&name[]=aitp_queue_depth").text
    names = {f.name for f in text_string_to_metric_families(only)}
    assert names == {"aitp_stage", "aitp_queue_depth"}


def test_a_scrape_reads_the_store_off_the_event_loop(store, ops):
    client, dashboard = make_client(store, ops)
    fleet = dashboard.fleet
    fleet.refresh_s = 60.0  # one store read per scrape at most
    threads: list[str] = []
    build = fleet._build

    def spy() -> Any:
        threads.append(threading.current_thread().name)
        return build()

    fleet._build = spy  # type: ignore[method-assign]
    assert client.get("/metrics").status_code == 200
    assert threads and all(name.startswith("AnyIO worker thread") for name in threads), threads


def test_a_failing_broker_adapter_leaves_the_rest_of_the_pages_working(store):
    def broken() -> Any:
        raise RuntimeError("broker adapter exploded")

    policy = parse_policy(TEST_POLICY)
    fleet = Fleet(store, policy, "default-q", broken, worker_ttl_s=10.0, refresh_s=0.0)
    client = TestClient(create_app(Dashboard(DashboardConfig(allowed_hosts=(TEST_HOST,)), fleet,
                                             worker_ttl_s=10.0)))
    data = client.get("/api/queues").json()
    assert data["health"]["broker_ok"] is False and "exploded" in data["health"]["broker_error"]
    assert all(q["depth"] is None for q in data["queues"])
    assert client.get("/api/overview").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/readyz").json()["checks"]["broker"]["ok"] is False


def test_queues_show_which_tier_queues_spill(client, store):
    import json
    import time

    from celery_aitp.scheduling.spill import occupancy_key

    now = time.time()
    reports = {
        "gpu1@host": {"at": now, "slots": 2, "busy": 2, "accelerator": "gpu",
                      "default_queue": False, "queues": ["aitp.acme.gpu.hi"],
                      "depths": {"aitp.acme.gpu.hi": 5}},
        "std@host": {"at": now, "slots": 4, "busy": 1, "accelerator": "gpu",
                     "default_queue": True, "queues": [], "depths": {}},
    }
    for name, doc in reports.items():
        store.client.hset(occupancy_key(store), name, json.dumps(doc))
    data = client.get("/api/queues").json()
    rows = {q["queue"]: q for q in data["queues"]}
    assert rows["aitp.acme.gpu.hi"]["spilling"] == 2.5  # waiting per serving slot
    assert rows["aitp.acme.gpu.mid"]["spilling"] is None
    assert data["spill"] == {"backlog_per_slot": {"aitp.acme.gpu.hi": 2.5},
                             "spill_class": "gpu", "idle_slots": 3, "open_queues": []}


def hi_cpu_decisions(client: TestClient) -> dict[tuple[str, str], float]:
    """``aitp_decisions_total`` of tier hi on cpu, by (reason, outcome)."""
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    return {(s.labels["reason"], s.labels["outcome"]): s.value
            for s in families["aitp_decisions"].samples
            if s.name.endswith("_total") and s.labels["tier"] == "hi"
            and s.labels["accelerator"] == "cpu"}


def test_spilled_decisions_are_exported_with_their_reason(store, ops):
    store.add_counts({"decisions:takeover:acme:hi:cpu:spill": 4,
                      "decisions:takeover:acme:hi:cpu:routed": 6})
    client, _ = make_client(store, ops)
    spilled = hi_cpu_decisions(client)
    assert spilled[("spill", "fallback")] == 4 and spilled[("routed", "routed")] == 6


class _Gate:
    """Queue depths that wait for ``release`` while ``held`` (a slow broker)."""

    def __init__(self, ops: MemoryQueueOps) -> None:
        self.ops = ops
        self.held = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def depths(self, names: list[str]) -> dict[str, int]:
        if self.held:
            self.entered.set()
            assert self.release.wait(10)
        return self.ops.depths(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ops, name)


def test_a_stale_snapshot_answers_at_once_while_the_next_is_built_in_the_background(
        store, ops) -> None:
    now = [1000.0]
    gate = _Gate(ops)
    fleet = Fleet(store, parse_policy(TEST_POLICY), "default-q", lambda: gate, 10.0,
                  refresh_s=2.0, clock=lambda: now[0], stale_s=30.0)
    first = fleet.snapshot()
    assert fleet.snapshot() is first and fleet.background_builds == 0  # fresh
    store.write_stage({"stage": "takeover", "split": {}}, who="test")
    now[0] += 5.0  # older than refresh_s: answered from the old one, rebuilt aside
    gate.held = True
    assert fleet.snapshot() is first
    assert gate.entered.wait(10)  # the background build is reading the broker
    assert fleet.snapshot() is first and fleet.background_builds == 1  # one build at once
    gate.release.set()
    deadline = time.monotonic() + 10
    while fleet.snapshot() is first and time.monotonic() < deadline:
        time.sleep(0.01)
    second = fleet.snapshot()
    assert second is not first and second.stage == "takeover" and second.at == now[0]


def test_a_snapshot_past_stale_s_or_asked_fresh_is_built_in_the_request(store, ops) -> None:
    now = [1000.0]
    fleet = Fleet(store, parse_policy(TEST_POLICY), "default-q", lambda: ops, 10.0,
                  refresh_s=2.0, clock=lambda: now[0], stale_s=30.0)
    first = fleet.snapshot()
    now[0] += 31.0
    second = fleet.snapshot()
    assert second is not first and second.at == now[0] and fleet.background_builds == 0
    now[0] += 3.0
    third = fleet.snapshot(max_age_s=0)  # after a stage change: now, not in the background
    assert third is not second and fleet.background_builds == 0


def test_warm_builds_the_first_snapshot_before_any_request(store, ops) -> None:
    fleet = Fleet(store, parse_policy(TEST_POLICY), "default-q", lambda: ops, 10.0,
                  refresh_s=60.0, stale_s=120.0)
    fleet.warm()
    deadline = time.monotonic() + 10
    while fleet._snapshot is None and time.monotonic() < deadline:
        time.sleep(0.01)
    built = fleet._snapshot
    assert built is not None and fleet.snapshot() is built
    fleet.warm()  # there is one: nothing more
    assert fleet.background_builds == 1


def test_a_queue_someone_named_is_neither_routed_nor_a_fallback(store, ops):
    """Retries go back to the tier queue they came from (Celery names it): counted as
    fallbacks, they made a flaky workload look like a failing takeover."""
    store.add_counts({"decisions:takeover:acme:hi:cpu:explicit_queue": 3,
                      "decisions:takeover:acme:hi:cpu:explicit_queue_dead": 2,
                      "decisions:takeover:acme:hi:cpu:routed": 5})
    client, _ = make_client(store, ops)
    assert hi_cpu_decisions(client) == {("explicit_queue", "explicit"): 3,
                                        ("explicit_queue_dead", "fallback"): 2,
                                        ("routed", "routed"): 5}
    total = client.get("/api/overview").json()["decisions"]["total"]
    assert (total["routed"], total["explicit"], total["fallback"]) == (5, 3, 2)


def test_the_default_queue_counts_the_aitp_workers_that_read_it(store, ops):
    store.advertise("both@host", ["aitp.acme.cpu.hi"], {"default_queue": True}, ttl_s=60)
    store.advertise("tiers@host", ["aitp.acme.cpu.lo"], {"default_queue": False}, ttl_s=60)
    client, _ = make_client(store, ops)
    rows = {q["queue"]: q for q in client.get("/api/queues").json()["queues"]}
    assert rows["default-q"]["consumers"] == ["both@host"]
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    consumers = {s.labels["queue"]: s.value for s in families["aitp_queue_consumers"].samples}
    assert consumers["default-q"] == 1  # an alert on zero consumers fired while it was read


def _depth(metrics: str, queue: str) -> float | None:
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "aitp_queue_depth" and sample.labels["queue"] == queue:
                return sample.value
    return None


def _gauge(metrics: str, name: str) -> float | None:
    return next((s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                 if s.name == name), None)


def test_a_store_outage_still_reads_the_broker(ops, monkeypatch):
    """Every task falls back to the default queue while the store is down: its depth must
    show it, and the rest stay what the store said last (with when)."""
    server = fakeredis.FakeServer()
    store = RedisStore(fakeredis.FakeRedis(server=server), Keys("outage"))
    seed(store, ops)
    offset = [0.0]
    fleet = Fleet(store, parse_policy(TEST_POLICY), "default-q", lambda: ops,
                  worker_ttl_s=10.0, refresh_s=0.0, window_s=300.0, tasks=TASKS,
                  clock=lambda: time.time() + offset[0])
    client = TestClient(create_app(Dashboard(DashboardConfig(allowed_hosts=(TEST_HOST,)),
                                             fleet, worker_ttl_s=10.0)))
    before = client.get("/api/queues").json()
    assert before["health"]["store_ok"] and before["health"]["store_read_at"] is not None
    server.connected = False
    offset[0] = 60.0  # past the workers' TTL (their heartbeats cannot reach the store)
    ops.queues["default-q"].extend((time.time(), b"fallback") for _ in range(4))
    data = client.get("/api/queues").json()
    health = data["health"]
    assert (health["store_ok"], health["broker_ok"]) == (False, True)
    assert "unreachable" in health["store_error"]
    assert health["store_read_at"] == before["health"]["store_read_at"]  # stale since then
    rows = {q["queue"]: q for q in data["queues"]}
    assert rows["default-q"]["depth"] == 5 and data["total_depth"] == 6  # read now
    # the store's side is the last reading: the worker was alive then, not orphaned now
    assert rows["aitp.acme.gpu.hi"]["consumers"] == ["gpu1@host"]
    overview = client.get("/api/overview").json()
    assert overview["stage"]["stage"] == "takeover" and overview["workers"]["alive"] == 1
    assert client.get("/api/workers").json()["workers"][0]["alive"] is True
    metrics = client.get("/metrics").text
    assert _depth(metrics, "default-q") == 5.0
    assert (_gauge(metrics, "aitp_store_up"), _gauge(metrics, "aitp_broker_up")) == (0.0, 1.0)

    def broken(queues: Any) -> dict[str, int]:
        raise RuntimeError("broker gone too")

    monkeypatch.setattr(ops, "depths", broken)  # and a broker failing meanwhile shows
    metrics = client.get("/metrics").text
    assert _gauge(metrics, "aitp_broker_up") == 0.0 and _depth(metrics, "default-q") is None
    assert "broker gone too" in client.get("/api/queues").json()["health"]["broker_error"]


def test_a_dashboard_started_during_a_store_outage_shows_the_broker(ops):
    server = fakeredis.FakeServer()
    server.connected = False
    store = RedisStore(fakeredis.FakeRedis(server=server), Keys("outage"))
    ops.queues["default-q"].append((time.time(), b"fallback"))
    client, _ = make_client(store, ops)
    data = client.get("/api/queues").json()
    assert (data["health"]["store_ok"], data["health"]["broker_ok"]) == (False, True)
    assert data["health"]["store_read_at"] is None  # nothing read from the store yet
    assert {q["queue"]: q["depth"] for q in data["queues"]}["default-q"] == 1


@pytest.mark.parametrize("placeholder", ["body", "nav", "csrf", "title", "api", "prefix"])
def test_a_value_put_into_the_page_is_never_expanded_again(client, placeholder):
    """The task id comes from the URL: ``/tasks/{{body}}`` is a task id, not a template."""
    literal = "{{" + placeholder + "}}"
    html = client.get(f"/tasks/{literal}").text
    assert f"<title>Task {literal} · celery_aitp</title>" in html
    assert f'data-api="tasks/{literal}"' in html and f'data-task-id="{literal}"' in html
    assert html.count('id="decision-table"') == 1 and html.count("<nav>") == 1
    assert "{{" not in client.get("/tasks/id-1").text  # every placeholder has its value


@pytest.mark.parametrize("depth", [100_000, 2_000, 40])
def test_deeply_nested_json_is_refused_with_a_clear_message(client, store, depth):
    client.get("/stage")
    headers = {"X-AITP-CSRF": client.cookies["aitp_csrf"], "Origin": "http://testserver",
               "Content-Type": "application/json"}
    nested = "[" * depth + "]" * depth
    inside = '{"stage": "split", "split": {"percent": 5, "tenants": ' + nested + "}}"
    for body in (nested, inside):
        response = client.post("/api/stage", content=body, headers=headers)
        assert response.status_code == 400, (depth, response.status_code)
        assert "nested deeper than" in response.json()["error"]
    assert store.read_stage() is None
    fine = client.post("/api/stage", json={"stage": "split", "split": {"tenants": ["acme"]}},
                       headers=headers)
    assert fine.status_code == 200, fine.text  # the stage document's own depth is fine
    limit = MAX_JSON_DEPTH
    assert parse_json_body(b"[" * limit + b"]" * limit) is not None
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json_body(b"[" * (limit + 1) + b"]" * (limit + 1))


def test_a_dashboard_clock_off_the_stores_still_sees_live_workers(store, ops):
    """Heartbeats are the store server's time: a dashboard 2 minutes ahead judged every
    worker gone (and its queues unserved)."""
    seed(store, ops)
    fleet = Fleet(store, parse_policy(TEST_POLICY), "default-q", lambda: ops,
                  worker_ttl_s=10.0, refresh_s=0.0, window_s=300.0, tasks=TASKS,
                  clock=lambda: time.time() + 120.0)
    client = TestClient(create_app(Dashboard(DashboardConfig(allowed_hosts=(TEST_HOST,)),
                                             fleet, worker_ttl_s=10.0)))
    (worker,) = client.get("/api/workers").json()["workers"]
    assert worker["alive"] is True and worker["heartbeat_age_s"] < 5
    rows = {q["queue"]: q for q in client.get("/api/queues").json()["queues"]}
    assert rows["aitp.acme.gpu.hi"]["consumers"] == ["gpu1@host"]
