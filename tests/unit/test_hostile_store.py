"""Hostile store entries: whatever the shared Redis holds, producers keep deciding.

Every key a producer, worker or dashboard reads back (live view: consumers and stage;
counters; workers; the model pointer; the history summary; profiles; usage; the decision
log; the policy and stage histories) is filled with garbage of the wrong type, NaN/inf,
bytes that are not UTF-8 or deeply nested JSON. Properties: the refresher never raises,
a decision is still made (a policy tier, within the tenant's cap, never an ``error:``
fallback), readers return what they can use, and a refused stage document or model is
counted (``rejected:stage``, ``rejected:model``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st

import celery_aitp
from celery_aitp.core.request import read_header
from celery_aitp.errors import ModelError
from celery_aitp.predict.history import HistoryStore
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.profiles.store import ProfileStore
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.scheduling.usage import read_usage, usage_key
from celery_aitp.store import Keys, RedisStore
from celery_aitp.store.decision_log import DecisionLog
from tests.unit.hostile import HOSTILE, deep_json_text, json_texts, json_values, odd_bytes, utf8

POLICY: dict[str, Any] = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi"}, "globex": {"max_tier": "mid"},
                "default": {"max_tier": "lo"}},
    "stage": "takeover",
}
RANK = {"hi": 0, "mid": 1, "lo": 2}

garbage = st.one_of(json_texts.map(utf8), odd_bytes, json_values.map(
    lambda v: utf8(json.dumps(v))), st.sampled_from(
    [b"nan", b"inf", b"-inf", b"1e999", b"-1", b"9" * 5000, b"1;nan,inf,-1", b"5;1,2,x",
     b'{"stage": "takeover", "split": {"percent": "NaN"}}', b'{"stage": ["takeover"]}',
     b'{"heartbeat": "soon"}', utf8(deep_json_text(20_000))]))
fields = st.one_of(st.sampled_from(["doc", "version", "meta", "p50", "p90", "_ref", "_hl",
                                    "acme|t.x", "t.x", "o:acme", "p:acme", "w1@h"]),
                   odd_bytes)


@st.composite
def store_contents(draw: Any) -> list[tuple[str, str, Any, Any]]:
    """(kind, key name, field, value) writes into the deployment's keys."""
    keys = ["consumers", "workers", "stage", "stage_history", "counters", "model",
            "history", "history_version", "profiles", "profile", "usage", "decisions",
            "decisions_index", "observations", "model_history"]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=6, unique=True))
    return [(name, draw(fields), draw(garbage)) for name in chosen]


def _key(store: RedisStore, name: str) -> str:
    k = store.keys
    return {"consumers": k.consumers, "workers": k.workers, "stage": k.stage,
            "stage_history": k.stage_history, "counters": k.counters, "model": k.model,
            "history": k.any("history"), "history_version": k.any("history", "version"),
            "profiles": k.any("profiles"), "profile": k.any("profile", "t.x"),
            "usage": usage_key(store), "decisions": k.decisions,
            "decisions_index": k.any("decisions", "index"), "observations": k.observations,
            "model_history": k.any("model", "history")}[name]


def _write(store: RedisStore, contents: list[tuple[str, Any, Any]]) -> None:
    client = store.client
    for name, field, value in contents:
        key = _key(store, name)
        client.delete(key)
        if name == "consumers":
            client.zadd(key, {value: 1e12})  # a member that is not "<queue>|<worker>"
        elif name in ("stage_history", "model_history"):
            client.lpush(key, value)
        elif name == "decisions":  # every layout: one record, a packed batch, an old one
            for layout in ("r", "p", "b"):
                client.xadd(key, {layout: value, "n": value})
        elif name == "observations":
            client.xadd(key, {"r": value})
        elif name == "history_version":
            client.set(key, value)
        else:
            client.hset(key, field, value)
            if name == "model":
                client.hset(key, "version", b"v-garbage")


@pytest.fixture(scope="module")
def deployment() -> Iterator[Celery]:
    app = Celery("hostile-store", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = "default-q"
    mw = celery_aitp.install(app, policy=POLICY,
                             store=RedisStore(fakeredis.FakeRedis(), Keys("hostile-store")))
    mw.live.current()

    @app.task(name="t.x")
    def task(*args: Any) -> None: ...

    yield app
    mw.close()


@HOSTILE
@given(contents=store_contents(), tenant=st.sampled_from(["acme", "globex", "default"]))
def test_garbage_in_the_store_never_stops_decisions(deployment, contents, tenant):
    mw = deployment.aitp
    store = mw.store
    store.client.flushdb()
    _write(store, contents)
    mw.live.refresh()  # the refresher round: snapshot, every source, every flush
    for source in mw.pipeline.sources():  # sources that wait for an interval: now
        source.fetch(store, source.initial)
    message = SimpleNamespace(headers={"id": "t1", "retries": 1}, body=((1,), {}, {}))
    out = mw.on_publish("t.x", message, {"headers": {"aitp_tenant": tenant}, AUTO_ROUTE: True})
    header = read_header(out["headers"]["aitp"])
    json.dumps(header, allow_nan=False)
    assert not header["reason"].startswith("error:"), header
    assert header["tenant"] == tenant and RANK[header["tier"]] >= RANK[
        POLICY["tenants"][tenant]["max_tier"]]
    predicted = header["predicted_runtime_s"]
    assert predicted is None or (math.isfinite(predicted) and predicted >= 0)
    # the readers behind the CLI and the dashboard
    store.workers()
    store.counts()
    store.stage_history()
    usage = read_usage(store, mw.policy).as_dict()
    json.dumps(usage)
    DecisionLog(store, 100).find("t1")
    HistoryStore(store).read()
    ProfileStore(store, mw.policy.profiles).read_index()
    ModelStore(store).history()
    try:
        ModelStore(store).read()
    except ModelError as exc:
        assert str(exc)


def test_a_malformed_stage_document_is_counted_and_the_policy_stage_kept(deployment):
    mw = deployment.aitp
    for doc in (b"[1, 2]", b'{"stage": "warp"}', b'"takeover"', b"\xff",
                utf8(deep_json_text(50_000))):
        mw.store.client.flushdb()
        mw.store.client.hset(mw.store.keys.stage, "doc", doc)
        before = mw.counters.totals["rejected:stage"]
        assert mw.live.refresh()
        assert mw.live.current().stage.value == "takeover"  # the policy's
        parsed = doc not in (b"\xff",) and not doc.startswith(b"[[")
        if parsed:
            assert mw.counters.totals["rejected:stage"] == before + 1, doc


def test_a_garbage_model_is_refused_once_and_counted(deployment):
    mw = deployment.aitp
    store = mw.store
    store.client.flushdb()
    store.client.hset(store.keys.model, mapping={
        "version": "v-bad", "meta": deep_json_text(50_000), "p50": "tree", "p90": "x"})
    source = next(s for s in mw.pipeline.sources() if s.name == "aitp.model")
    refused = source.refusals
    assert source.fetch(store, None) is None
    assert source.fetch(store, None) is None  # the same version is not read again
    assert source.refusals == refused + 1
    assert store.counts().get("rejected:model", 0) >= 1


API = ("/api/overview", "/api/tenants", "/api/queues", "/api/workers", "/api/predictions",
       "/api/tasks", "/api/tasks/t1", "/api/stage", "/healthz", "/readyz")


@pytest.fixture(scope="module")
def dashboard() -> Iterator[tuple[Any, RedisStore]]:
    from starlette.testclient import TestClient

    from celery_aitp.dashboard.api import Dashboard
    from celery_aitp.dashboard.app import create_app
    from celery_aitp.dashboard.config import DashboardConfig
    from celery_aitp.dashboard.fleet import Fleet
    from celery_aitp.policy import parse_policy
    from celery_aitp.stubs import MemoryQueueOps

    store = RedisStore(fakeredis.FakeRedis(), Keys("hostile-dash"))
    ops = MemoryQueueOps()
    fleet = Fleet(store, parse_policy(POLICY), "default-q", lambda: ops, worker_ttl_s=10.0,
                  refresh_s=0.0, window_s=300.0, tasks=("t.x",))
    config = DashboardConfig(allowed_hosts=("testserver",))  # the test client's Host
    app = create_app(Dashboard(config, fleet, worker_ttl_s=10.0, version="test"))
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client, store


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} in a JSON response (browsers refuse it)")


@settings(HOSTILE, max_examples=20)  # eleven requests per example: a smaller fixed budget
@given(contents=store_contents())
def test_the_dashboard_serves_whatever_the_store_holds(dashboard, contents):
    client, store = dashboard
    store.client.flushdb()
    _write(store, contents)
    for path in API:
        response = client.get(path)
        assert response.status_code in (200, 404, 503), (path, response.status_code)
        if path.startswith("/api/") and response.status_code == 200:
            json.loads(response.text, parse_constant=_no_constants)  # no NaN/Infinity
    assert client.get("/metrics").status_code == 200


@HOSTILE
@given(shared=json_values, rows=json_values,
       row_list=st.lists(st.lists(json_values, max_size=5), max_size=5))
def test_a_packed_batch_of_any_shape_reads_as_the_records_it_can_make(shared, rows,
                                                                      row_list) -> None:
    from celery_aitp.store.packed import entry_records

    for batch in ({"s": shared, "r": rows}, {"s": [shared, {"a": 1}], "r": row_list},
                  [shared, rows], shared):
        found = entry_records({b"p": json.dumps(batch)})
        assert isinstance(found, list) and all(isinstance(r, dict) for r in found)
    found = entry_records({b"p": json.dumps({"s": [{"a": 1}], "r": [[0, "t", 5.0], [1]]})})
    assert found == [{"a": 1, "task_id": "t", "decided_at": 5.0, "origin_at": 5.0}]
