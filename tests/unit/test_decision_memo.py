"""The decision memo (publish/memo.py): a reused decision is the one the pipeline makes.

Two apps share one store and one view state; one keeps decisions, the other decides
every task through the pipeline. Both publish the same messages; headers (but the
time), records (but the time), counters, fair-share charges and routes must be equal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.learn import synthetic
from celery_aitp.predict.history import HistoryStore
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.publish.memo import DecisionMemo, Reused
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.publish.request import Decision, read_header
from celery_aitp.queues import all_tier_queues
from tests.unit.conftest import make_live

TASKS = ("media.resize", "reports.build", "ml.fit", "etl.batch", "mail.send", "geo.route")
TENANTS = ("acme", "globex", "initech")
POLICY = {
    "tenants": {"acme": {"weight": 3}, "globex": {"max_tier": "mid"},
                "initech": {"trusted_header": False}, "default": {}},
    "stage": "takeover",
    "labels": {"vip": 1.0},
}
#: Queues served: every tier queue but globex's, so some tasks fall back.
LIVE = [q for q in all_tier_queues(TENANTS, ("cpu", "gpu"), ("hi", "mid", "lo"))
        if ".globex." not in q]


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def make_app(store: Any, name: str, memo: bool, broker: str = "memory://",
             policy: dict[str, Any] | None = None, **conf: Any) -> Any:
    app = Celery(name, broker=broker)
    app.conf.task_default_queue = "default-q"
    app.conf.update(conf)
    mw = celery_aitp.install(app, policy=policy or POLICY, refresh_interval_s=60)
    mw.store = store
    for task in TASKS:
        app.task(name=task, shared=False)(_noop)
    app.task(name="hinted", shared=False, aitp={"runtime_hint_s": 4.0, "labels": ["vip"]})(
        _noop)
    if not memo:
        mw.__dict__["memo"] = None
    for source in mw.pipeline.sources():
        if hasattr(source, "interval_s"):
            source.interval_s = 0.0
    return app


@pytest.fixture
def pair(store: Any) -> Iterator[tuple[Any, Any]]:
    """(keeps decisions, decides every time), on the same store."""
    apps = make_app(store, "memo-on", True), make_app(store, "memo-off", False)
    yield apps
    for app in apps:
        app.aitp.close()


def refresh(*apps: Any) -> None:
    for app in apps:
        app.aitp.live.current()
        app.aitp.live.refresh()


def workload(n: int, seed: int = 7) -> list[tuple[str, tuple[Any, ...], dict[str, Any],
                                                  dict[str, Any]]]:
    """Messages of the synthetic workload, with good, refused, unknown and bad tenants."""
    claims: list[Any] = [*TENANTS, "initech", "nobody", 42, None]
    out = []
    for i, record in enumerate(synthetic.records(n, seed=seed, compact_lists=False)):
        claim = claims[i % len(claims)]
        headers = {} if claim is None else {"aitp_tenant": claim}
        task = record["task"] if i % 11 else "hinted"
        out.append((task, tuple(record["args"]), dict(record["kwargs"]), headers))
    return out


def publish(app: Any, i: int, task: str, args: tuple[Any, ...], kwargs: dict[str, Any],
            headers: dict[str, Any], queue: str | None = None, **extra: Any
            ) -> dict[str, Any]:
    """``queue``: a queue the caller (or ``task_routes``) chose; None: nobody routed."""
    message = app.amqp.as_task_v2(f"id-{i}", task, args=args, kwargs=kwargs, **extra)
    options: dict[str, Any] = {"headers": dict(headers)}
    if queue is None:
        options[AUTO_ROUTE] = True
    else:
        options["queue"] = queue
    return app.aitp.on_publish(task, message, options)


def without_time(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("decided_at", "origin_at")}


def records(app: Any) -> list[dict[str, Any]]:
    buffer = app.aitp._decision_records
    return [without_time(item.record()) for item in buffer.take()]


def charges(app: Any) -> list[Any]:
    usage = app.aitp.pipeline.stages[4].usage
    found = list(usage.pending)
    usage.pending.clear()
    return found


def assert_same(on: Any, off: Any, messages: list[Any], queue: str | None = None) -> int:
    """Publish ``messages`` through both apps (to ``queue``, if given); everything equal
    but the time. Returns how many decisions the memo app reused (did not make)."""
    made = 0
    pipeline = on.aitp.memo.pipeline
    decide = pipeline.decide

    def counting(*args: Any) -> Any:
        nonlocal made
        made += 1
        return decide(*args)

    pipeline.decide = counting
    for i, message in enumerate(messages):
        a, b = publish(on, i, *message, queue=queue), publish(off, i, *message, queue=queue)
        header_a, header_b = read_header(a["headers"]["aitp"]), read_header(b["headers"]["aitp"])
        assert without_time(header_a) == without_time(header_b), message
        assert header_a["decided_at"] > 0
        assert (a.get("queue"), a.get("priority")) == (b.get("queue"), b.get("priority"))
    assert records(on) == records(off)
    assert on.aitp.counters.totals == off.aitp.counters.totals
    assert charges(on) == charges(off)
    return len(messages) - made


def test_reused_decisions_equal_the_pipelines_with_a_model(pair, store, trained) -> None:
    on, off = pair
    make_live(store, *LIVE)
    ModelStore(store).promote(trained.bundle)
    HistoryStore(store).add_runs([("acme", "media.resize", 0.5), ("globex", "ml.fit", 30.0)])
    refresh(on, off)
    assert on.aitp.live.current().sources[MODEL_SOURCE] is not None
    messages = workload(300)
    reused = assert_same(on, off, messages + messages[:100])
    assert reused >= 100  # every repeated message, and more from shared keys


def test_reused_decisions_equal_the_pipelines_at_cold_start(pair, store) -> None:
    on, off = pair
    make_live(store, *LIVE)
    HistoryStore(store).add_runs([("acme", "media.resize", 0.5), ("globex", "ml.fit", 30.0),
                                  ("initech", "mail.send", 2.0)])
    refresh(on, off)
    reused = assert_same(on, off, workload(200))
    assert reused >= 150  # at most one pipeline run per (task, tenant, note)


def test_in_coexistence_and_with_no_live_worker_too(pair, store) -> None:
    on, off = pair
    make_live(store, stage="coexistence")  # no worker at all
    refresh(on, off)
    assert assert_same(on, off, workload(100)) > 0
    make_live(store, *LIVE, stage="coexistence")
    refresh(on, off)
    assert assert_same(on, off, workload(100)) > 0


@pytest.mark.parametrize("with_model", [False, True])
def test_in_the_split_stage_the_arm_is_part_of_the_key(pair, store, with_model,
                                                      request) -> None:
    on, off = pair
    make_live(store, *LIVE)
    if with_model:  # the outcome key holds the arm too
        ModelStore(store).promote(request.getfixturevalue("trained").bundle)
    store.write_stage({"stage": "split", "split": {"percent": 50, "tenants": ["acme",
                                                                             "initech"]}},
                      who="test")
    refresh(on, off)
    messages = workload(200)
    # every repeat, plus shared keys (at cold start) or shared predictions (with a model)
    assert assert_same(on, off, messages + messages[:50]) >= (55 if with_model else 100)
    reasons = {name.rsplit(":", 1)[1] for name in on.aitp.counters.totals
               if name.startswith("decisions:split:")}
    assert {"routed", "split_standard_arm"} <= reasons  # both arms, each reused right


def test_a_new_prediction_in_a_kept_band_equals_the_pipelines(pair, store, trained,
                                                             monkeypatch) -> None:
    """Most new predictions get a decision derived from one made in their score band;
    each must equal what the pipeline makes (the equality above), and some must be
    derived, or this would test nothing."""
    on, off = pair
    make_live(store, *LIVE)
    ModelStore(store).promote(trained.bundle)
    refresh(on, off)
    derived = []
    original = DecisionMemo._derive

    def counting(self: DecisionMemo, *args: Any) -> Any:
        found = original(self, *args)
        derived.append(found is not None)
        return found

    monkeypatch.setattr(DecisionMemo, "_derive", counting)
    assert_same(on, off, workload(400, seed=3))
    assert sum(derived) >= 100 and not all(derived)


def test_a_prediction_the_visibility_guard_looks_at_is_never_derived(store, trained) -> None:
    """With the guard on (a Redis broker), a task whose prediction crosses its limit is
    flagged and sent to the default queue exactly as the pipeline does, whatever was
    kept for its band."""
    policy = {**POLICY, "visibility_guard": {"action": "default_queue"}}
    apps = [make_app(store, name, memo, broker="redis://127.0.0.1:1/0", policy=policy,
                     broker_transport_options={"visibility_timeout": 5})
            for name, memo in (("guard-on", True), ("guard-off", False))]
    try:
        on, off = apps
        assert on.aitp.memo.visibility is not None
        make_live(store, *LIVE)
        ModelStore(store).promote(trained.bundle)
        refresh(on, off)
        assert_same(on, off, workload(300))
        flagged = on.aitp.counters.totals["visibility_runtime"]
        assert 0 < flagged < 300  # predictions on both sides of the guard's limit
    finally:
        for app in apps:
            app.aitp.close()


@pytest.mark.parametrize("case", ["retry", "eta", "labels", "split by tier",
                                  "explicit queue, split by tier"])
def test_tasks_the_memo_cannot_vouch_for_run_the_pipeline(pair, store, case,
                                                          monkeypatch) -> None:
    on, off = pair
    make_live(store, *LIVE)
    if "split by tier" in case:  # the arm would hang on the decision's tier
        store.write_stage({"stage": "split", "split": {"percent": 50, "tiers": ["lo"]}},
                          who="test")
    refresh(on, off)
    runs = []
    original = Pipeline.decide

    def counting(self: Pipeline, *args: Any, **kwargs: Any) -> Decision:
        runs.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "decide", counting)
    task, args, kwargs = "media.resize", (640, 480), {"quality": 80}
    headers = {"aitp_tenant": "acme"}
    extra: dict[str, Any] = {}
    if case == "retry":
        extra["retries"] = 1
    elif case == "eta":
        extra["eta"] = "2030-01-01T00:00:00"
    elif case == "labels":
        headers["aitp_labels"] = "vip"
    for i in range(3):
        if case.startswith("explicit queue"):
            message = on.amqp.as_task_v2(f"id-{i}", task, args=args, kwargs=kwargs)
            options = on.aitp.on_publish(task, message, {"queue": "mine", "headers": headers})
            assert options["queue"] == "mine"
        else:
            publish(on, i, task, args, kwargs, headers, **extra)
    assert len(runs) == 3 and len(on.aitp.memo) == 0
    assert not any(isinstance(item, Reused) for item in on.aitp._decision_records.take())


def test_the_memo_outlives_a_refresh_only_while_the_state_is_the_same(pair, store) -> None:
    on, _ = pair
    make_live(store, *LIVE)
    refresh(on)
    memo = on.aitp.memo
    publish(on, 0, "media.resize", (640, 480), {}, {"aitp_tenant": "acme"})
    assert len(memo) == 1
    refresh(on)  # a new view, nothing changed: the kept decision stays
    options = publish(on, 1, "media.resize", (640, 480), {}, {"aitp_tenant": "acme"})
    assert len(memo) == 1 and options["queue"].name == "aitp.acme.cpu.lo"
    store.withdraw("w1@test")  # the worker left: decisions made on it must go
    refresh(on)
    options = publish(on, 2, "media.resize", (640, 480), {}, {"aitp_tenant": "acme"})
    assert "queue" not in options or options["queue"] != "aitp.acme.cpu.lo"
    assert read_header(options["headers"]["aitp"])["reason"] == "no_live_worker"


def test_a_stage_that_is_not_a_default_one_turns_the_memo_off(app) -> None:
    class Everything:
        name = "gate"

        def __call__(self, request: Any, decision: Any, view: Any) -> None:
            decision.routed = True

    assert app.aitp.memo is not None
    app.aitp.use_stage("gate", Everything())
    assert app.aitp.memo is None


def test_a_decision_the_visibility_guard_flagged_is_not_kept(app) -> None:
    memo = DecisionMemo.for_pipeline(app.aitp.pipeline)
    assert memo is not None
    view = app.aitp.live.current()
    memo.find(view, ("k",), "id", 1.0)  # adopt the view
    flagged = Decision("takeover", 1.0, "t", "id")
    flagged.notes.append("visibility_runtime")
    assert memo.keep(view, ("k",), flagged) is None and len(memo) == 0
    plain = Decision("takeover", 1.0, "t", "id")
    kept = memo.keep(view, ("k",), plain)
    assert isinstance(kept, Reused) and len(memo) == 1


def test_a_reused_record_is_the_decisions_own(app) -> None:
    decision = Decision("takeover", 1700000000.25, "t", "first")
    decision.tenant, decision.tier, decision.score = "acme", "hi", 0.5
    decision.origin_at = decision.decided_at
    memo = DecisionMemo.for_pipeline(app.aitp.pipeline)
    assert memo is not None
    view = app.aitp.live.current()
    memo.find(view, ("k",), "x", 0.0)
    first = memo.keep(view, ("k",), decision)
    assert first is not None and json.loads(first.record_json()) == decision.record()
    again = memo.find(view, ("k",), "second", 1700000001.5)
    assert again is not None
    expected = dict(decision.record(), task_id="second", decided_at=1700000001.5,
                    origin_at=1700000001.5)
    assert json.loads(again.record_json()) == expected == again.record()
    assert json.loads(again.header()) == dict(json.loads(decision.header()),
                                              decided_at=1700000001.5)


def test_at_cold_start_new_history_is_used_at_once(pair, store) -> None:
    on, _ = pair
    make_live(store, *LIVE)
    history = HistoryStore(store)
    history.add_runs([("acme", "media.resize", 1.0)])
    refresh(on)
    args = ("media.resize", (640, 480), {}, {"aitp_tenant": "acme"})
    assert read_header(publish(on, 0, *args)["headers"]["aitp"])["predicted_runtime_s"] == 1.0
    history.add_runs([("acme", "media.resize", 3.0)])
    refresh(on)
    assert read_header(publish(on, 1, *args)["headers"]["aitp"])["predicted_runtime_s"] == 2.0


@pytest.mark.parametrize("with_model", [False, True])
def test_a_tenant_over_its_share_is_demoted_at_once_and_the_others_keep_theirs(
        pair, store, with_model, request) -> None:
    on, off = pair
    make_live(store, *LIVE)
    if with_model:  # the outcome key holds the demotion too
        ModelStore(store).promote(request.getfixturevalue("trained").bundle)
    refresh(on, off)
    messages = [("mail.send", (), {}, {"aitp_tenant": t}) for t in ("acme", "initech")]
    messages += [("mail.send", (), {}, {})]  # the default tenant
    assert_same(on, off, messages)
    kept = len(on.aitp.memo)
    assert kept == 3
    usage = on.aitp.pipeline.stages[4].usage
    usage.pending.extend([("acme", "hi", 10_000.0)] * 5 + [("default", "lo", 1_000.0),
                                                          ("initech", "lo", 1_000.0)])
    refresh(on, off)
    assert "acme" in on.aitp.live.current().sources["usage"].demoted
    assert assert_same(on, off, messages) == 2  # initech and default reused; acme decided
    assert len(on.aitp.memo) == kept + 1
    # new arguments: new cache keys, so with a model the outcome key decides (demoted)
    assert_same(on, off, [("mail.send", (1,), {}, {"aitp_tenant": t}) for t in ("acme", "initech")])


def test_a_new_cache_key_with_a_known_prediction_reuses_that_decision(pair, store,
                                                                        trained) -> None:
    """The outcome key: two tasks whose arguments differ but lead to the same leaves of
    every tree get one decision, and it is the one the pipeline makes for each."""
    on, off = pair
    make_live(store, *LIVE)
    ModelStore(store).promote(trained.bundle)
    refresh(on, off)
    model = on.aitp.live.current().sources[MODEL_SOURCE]
    compiled = model.compiled
    by_outcome: dict[tuple[float, float], list[Any]] = {}
    for message in workload(400):
        task, args, kwargs, headers = message
        if headers.get("aitp_tenant") != "acme":
            continue
        key = model.request_key(task, "acme", args, kwargs, None, None, None, 0, 1.7e9, None)
        p50, p90, _ = compiled.predict_key(key)
        by_outcome.setdefault((task, p50, p90), []).append((key, message))
    pairs = [found for found in by_outcome.values() if len({k for k, _ in found}) > 1]
    assert pairs, "the workload has no two cache keys with one prediction"
    messages = [m for found in pairs for _, m in found[:2]]
    runs = []
    original = Pipeline.decide

    def counting(self: Pipeline, *args: Any, **kwargs: Any) -> Decision:
        runs.append(1)
        return original(self, *args, **kwargs)

    on.aitp.pipeline.decide = counting.__get__(on.aitp.pipeline)
    assert_same(on, off, messages)
    assert len(runs) < len(messages)  # the second of a pair was not decided again
    assert len(on.aitp.memo) == len(messages)  # ... but it is kept under its own key


@pytest.mark.parametrize("with_model", [False, True])
@pytest.mark.parametrize("stage", ["takeover", "split", "coexistence"])
def test_a_task_someone_routed_keeps_its_queue_and_reuses_its_decision(
        pair, store, stage, with_model, request) -> None:
    """``queue=`` (or ``task_routes``): another queue, a live tier queue, and a tier
    queue no live worker serves (globex's), in each stage and mixed with tasks nobody
    routed: the explicit-queue fallback's decisions are kept by (tier queue, live), and
    equal the pipeline's."""
    on, off = pair
    make_live(store, *LIVE, stage=stage)
    if stage == "split":  # both arms: the standard one sends a tier queue to the default
        store.write_stage({"stage": "split", "split": {"percent": 50}}, who="test")
    if with_model:
        ModelStore(store).promote(request.getfixturevalue("trained").bundle)
    refresh(on, off)
    messages = workload(100)
    queues = [None, "mine", "aitp.acme.cpu.hi", "aitp.globex.cpu.hi"]
    for turn, queue in enumerate(queues + queues[::-1]):
        before = on.aitp.counters.totals
        reused = assert_same(on, off, messages, queue=queue)
        assert turn < len(queues) or reused == len(messages)  # the second round: all kept
        reasons = {name.rsplit(":", 1)[1] for name in on.aitp.counters.totals - before
                   if name.startswith("decisions:")}
        # a live tier queue goes to the default queue where the stage would not route
        # the task (gated); tasks of a tenant no worker serves were not gated: they stay
        expected = {"explicit_queue"} if queue == "mine" else \
            {"explicit_queue_dead"} if queue and "globex" in queue else \
            {"explicit_queue"} if queue and stage == "takeover" else \
            {"explicit_queue", "explicit_queue_standard"} if queue else None
        assert expected is None or reasons == expected, queue


def test_a_decision_for_another_task_copies_every_field_but_its_id_and_times() -> None:
    """Every slot, so a field added to Decision later is copied too (or this fails)."""
    first = Decision("takeover", 1.0, "media.resize", "a")
    for name in Decision.__slots__:
        setattr(first, name, object())
    first.notes = ["tenant_unknown"]
    other = first.for_task("b", 2.0)
    for name in Decision.__slots__:
        if name == "task_id":
            assert other.task_id == "b"
        elif name in ("decided_at", "origin_at"):
            assert getattr(other, name) == 2.0
        elif name == "notes":
            assert other.notes == first.notes and other.notes is not first.notes
        else:
            assert getattr(other, name) is getattr(first, name), name
