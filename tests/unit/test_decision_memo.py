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
from celery_aitp.core.request import Decision, read_header
from celery_aitp.learn import synthetic
from celery_aitp.predict.history import HistoryStore
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.publish.hook import AUTO_ROUTE
from celery_aitp.publish.memo import DecisionMemo, Reused
from celery_aitp.publish.pipeline import Pipeline
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
    mw = celery_aitp.install(app, policy=policy or POLICY, refresh_interval_s=60, store=store)
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
    buffer = app.aitp.annotator.records
    return [without_time(item.record()) for item in buffer.take()]


def charges(app: Any) -> list[Any]:
    """What the priority stage added to fair-share usage and to the size histogram."""
    priority = app.aitp.pipeline.stages[4]
    found = []
    for pending in (priority.usage.pending, priority.sizes.pending):
        found.append(list(pending))
        pending.clear()
    return found


def assert_same(on: Any, off: Any, messages: list[Any], queue: str | None = None) -> int:
    """Publish ``messages`` through both apps (to ``queue``, if given); everything equal
    but the time. Returns how many decisions the memo app reused (did not make)."""
    made = 0
    pipeline = on.aitp.memo.pipeline
    finish = pipeline.finish

    def counting(*args: Any) -> Any:
        nonlocal made
        made += 1
        return finish(*args)

    pipeline.finish = counting  # type: ignore[method-assign]
    for i, message in enumerate(messages):
        a, b = publish(on, i, *message, queue=queue), publish(off, i, *message, queue=queue)
        header_a, header_b = read_header(a["headers"]["aitp"]), read_header(b["headers"]["aitp"])
        assert without_time(header_a) == without_time(header_b), message
        assert header_a["decided_at"] > 0
        assert (a.get("queue"), a.get("priority")) == (b.get("queue"), b.get("priority"))
    assert records(on) == records(off)
    assert on.aitp.counters.totals == off.aitp.counters.totals
    assert charges(on) == charges(off)
    pipeline.finish = finish  # type: ignore[method-assign]
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
    if with_model:
        ModelStore(store).promote(request.getfixturevalue("trained").bundle)
    store.write_stage({"stage": "split", "split": {"percent": 50, "tenants": ["acme",
                                                                             "initech"]}},
                      who="test")
    refresh(on, off)
    messages = workload(200)
    # at cold start every (task, tenant, note, arm); with a model, a repeat whose new id
    # falls in the same arm, and tasks with a prediction seen before
    assert assert_same(on, off, messages + messages[:50]) >= (20 if with_model else 100)
    reasons = {name.rsplit(":", 1)[1] for name in on.aitp.counters.totals
               if name.startswith("decisions:split:")}
    assert {"routed", "split_standard_arm"} <= reasons  # both arms, each reused right


def test_a_prediction_the_visibility_guard_looks_at_is_decided_each_time(store, trained
                                                                          ) -> None:
    """With the guard on (a Redis broker), a task whose prediction crosses its limit is
    flagged and sent to the default queue exactly as the pipeline does, each time."""
    policy = {**POLICY, "visibility_guard": {"action": "default_queue"}}
    apps = [make_app(store, name, memo, broker="redis://127.0.0.1:1/0", policy=policy,
                     broker_transport_options={"visibility_timeout": 5})
            for name, memo in (("guard-on", True), ("guard-off", False))]
    try:
        on, off = apps
        assert on.aitp.memo is not None
        make_live(store, *LIVE)
        ModelStore(store).promote(trained.bundle)
        refresh(on, off)
        assert_same(on, off, workload(300))
        flagged = on.aitp.counters.totals["visibility_runtime"]
        assert 0 < flagged < 300  # predictions on both sides of the guard's limit
    finally:
        for app in apps:
            app.aitp.close()


@pytest.mark.parametrize("case", ["retry", "labels"])
def test_tasks_the_memo_cannot_vouch_for_run_the_pipeline(pair, store, case,
                                                          monkeypatch) -> None:
    on, off = pair
    make_live(store, *LIVE)
    refresh(on, off)
    runs = []
    original = Pipeline.finish

    def counting(self: Pipeline, *args: Any, **kwargs: Any) -> None:
        runs.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "finish", counting)
    task, args, kwargs = "media.resize", (640, 480), {"quality": 80}
    headers = {"aitp_tenant": "acme"}
    extra: dict[str, Any] = {}
    if case == "retry":
        extra["retries"] = 1
    elif case == "labels":
        headers["aitp_labels"] = "vip"
    for i in range(3):
        publish(on, i, task, args, kwargs, headers, **extra)
    assert len(runs) == 3 and len(on.aitp.memo) == 0
    assert not any(isinstance(item, Reused) for item in on.aitp.annotator.records.take())


@pytest.mark.parametrize("guard", [False, True])
def test_a_task_with_an_eta_is_decided_each_time_only_under_the_guard(store, guard) -> None:
    """Only the visibility guard (Redis brokers) reads the ETA."""
    extra = {"broker": "redis://127.0.0.1:1/0",
             "broker_transport_options": {"visibility_timeout": 5}} if guard else {}
    app = make_app(store, f"eta-{guard}", True, **extra)
    try:
        make_live(store, *LIVE)
        refresh(app)
        for i in range(3):
            publish(app, i, "media.resize", (640, 480), {}, {"aitp_tenant": "acme"},
                    eta="2030-01-01T00:00:00")
        assert len(app.aitp.memo) == (0 if guard else 1)
    finally:
        app.aitp.close()


@pytest.mark.parametrize("split", [{"percent": 50, "tiers": ["lo"]},
                                   {"percent": 50, "max_uncertainty": 1.5}])
@pytest.mark.parametrize("queue", [None, "mine"])
def test_a_split_whose_selectors_read_the_decision_is_kept_too(pair, store, trained, split,
                                                             queue) -> None:
    """The selectors read the tier and the prediction, which the rest of the key fixes;
    the task id only decides whether it falls in the percentage, which joins the key."""
    on, off = pair
    make_live(store, *LIVE)
    ModelStore(store).promote(trained.bundle)
    store.write_stage({"stage": "split", "split": split}, who="test")
    refresh(on, off)
    messages = workload(200)
    assert assert_same(on, off, messages + messages[:50], queue=queue) >= 20


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


class _Flagging:
    """A visibility stage that flags every task but still states a memo key."""

    name = "visibility"

    def __call__(self, request: Any, decision: Decision, view: Any) -> None:
        decision.notes.append("visibility_runtime")

    def memo_key(self, request: Any, decision: Decision, view: Any) -> tuple[()]:
        return ()


def _request(task_id: str, at: float) -> Any:
    from celery_aitp.core.request import Request

    return Request("media.resize", task_id, (640, 480), {}, {"aitp_tenant": "acme"},
                   published_at=at)


def test_a_decision_the_visibility_guard_flagged_is_not_kept(app) -> None:
    memo = DecisionMemo.for_pipeline(app.aitp.pipeline.replace("visibility", _Flagging()))
    assert memo is not None
    view = app.aitp.live.current()
    first = memo.decide(_request("a", 1.0), view, 1.0)
    assert isinstance(first, Decision) and len(memo) == 0
    plain = DecisionMemo.for_pipeline(app.aitp.pipeline)
    assert plain is not None
    assert isinstance(plain.decide(_request("a", 1.0), view, 1.0), Reused)
    assert len(plain) == 1


def test_a_reused_record_is_the_decisions_own(app) -> None:
    memo = DecisionMemo.for_pipeline(app.aitp.pipeline)
    assert memo is not None
    view = app.aitp.live.current()
    decision = app.aitp.pipeline.decide(_request("first", 1700000000.25), view,
                                        1700000000.25)
    first = memo.decide(_request("first", 1700000000.25), view, 1700000000.25)
    assert isinstance(first, Reused)
    assert json.loads(first.record_json()) == decision.record()
    again = memo.decide(_request("second", 1700000001.5), view, 1700000001.5)
    assert isinstance(again, Reused) and again.template is first.template
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
    if with_model:
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
    # new arguments: with a model, a new prediction (demoted)
    assert_same(on, off, [("mail.send", (1,), {}, {"aitp_tenant": t}) for t in ("acme", "initech")])


def test_tasks_with_the_same_prediction_share_one_decision(pair, store, trained) -> None:
    """Two tasks whose arguments differ but lead to the same leaves of every tree get one
    decision (the key holds the prediction, not the arguments), and it is the one the
    pipeline makes for each."""
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
    reused = assert_same(on, off, messages)
    assert reused > 0  # the second of a pair was not decided again
    assert len(on.aitp.memo) == len(messages) - reused  # one template per prediction


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
