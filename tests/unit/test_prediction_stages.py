"""Predictions on the publish path: the model when there is one, cold-start estimates before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.core.request import Decision, Request, read_header
from celery_aitp.core.view import View
from celery_aitp.learn.train import TrainConfig, train
from celery_aitp.predict.bundle import ModelBundle
from celery_aitp.predict.compiled import GRID_STEPS, on_grid
from celery_aitp.predict.features import argument_features, call_signature
from celery_aitp.predict.history import HISTORY_SOURCE, HistoryStore, Run
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.model_store import ModelStore
from tests.unit.conftest import make_live


def noop(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture
def synthetic_app(store) -> Any:
    """An app whose tasks and tenants are those of the synthetic workload."""
    app = Celery("predict-unit", broker="memory://")
    app.conf.task_default_queue = "default-q"
    policy = {"tenants": {"acme": {}, "globex": {}, "initech": {}, "default": {}},
              "stage": "takeover"}
    mw = celery_aitp.install(app, policy=policy, store=store)
    for name in ("media.resize", "reports.build", "mail.send"):
        app.task(name=name, shared=False)(noop)
    app.task(name="hinted", shared=False, aitp={"runtime_hint_s": 4.0})(noop)
    for source in mw.pipeline.sources():
        if hasattr(source, "interval_s"):
            source.interval_s = 0.0
    yield app
    mw.close()


def publish(app: Any, published: list[dict[str, Any]], name: str, *args: Any,
            **kwargs: Any) -> dict[str, Any]:
    app.tasks[name].apply_async(args, kwargs, headers={"aitp_tenant": "acme"})
    return read_header(published[-1]["headers"]["aitp"])


def refreshed(app: Any) -> View:
    app.aitp.live.current()
    app.aitp.live.refresh()
    return app.aitp.live.current()


def test_without_history_or_model_there_is_no_prediction(synthetic_app, published):
    refreshed(synthetic_app)
    h = publish(synthetic_app, published, "media.resize", 640, 480)
    assert h["predicted_runtime_s"] is None and "prediction_source" not in h
    h = publish(synthetic_app, published, "hinted")
    assert (h["predicted_runtime_s"], h["predicted_p90_s"], h["prediction_source"]) == \
        (4.0, 4.0, "hint")


def test_cold_start_uses_the_pair_then_the_task_history(synthetic_app, store, published):
    HistoryStore(store).add_runs([("acme", "media.resize", 1.0), ("acme", "media.resize", 3.0),
                                  ("globex", "reports.build", 8.0)])
    refreshed(synthetic_app)
    h = publish(synthetic_app, published, "media.resize", 640, 480)
    assert (h["predicted_runtime_s"], h["prediction_source"]) == (2.0, "history")
    assert h["predicted_p90_s"] == 3.0
    h = publish(synthetic_app, published, "reports.build", rows=10)
    assert (h["predicted_runtime_s"], h["prediction_source"]) == (8.0, "task_history")


def test_cold_start_tells_short_calls_of_a_task_from_long_ones(synthetic_app, store,
                                                               published):
    runs = [Run("acme", "media.resize", 0.04, 6)] * 5 + [Run("acme", "media.resize", 1.5, 11)]
    HistoryStore(store).add_runs(runs)
    refreshed(synthetic_app)
    h = publish(synthetic_app, published, "media.resize", 40)  # of magnitude 6
    assert (h["predicted_runtime_s"], h["predicted_p90_s"], h["prediction_source"]) == \
        (0.04, 0.04, "size_history")
    h = publish(synthetic_app, published, "media.resize", 1500)  # of magnitude 11
    assert (h["predicted_p90_s"], h["prediction_source"]) == (1.5, "history")
    h = publish(synthetic_app, published, "media.resize")  # no argument to size
    assert h["prediction_source"] == "history"


def test_cold_start_sizes_a_call_that_ran_twice_by_its_own_runs(synthetic_app, store,
                                                                 published):
    def call(*args: Any) -> str:
        return call_signature(argument_features(args, {}))

    runs = [Run("globex", "media.resize", 0.04, None, call(40)),
            Run("acme", "media.resize", 0.06, None, call(40)),
            Run("acme", "media.resize", 1.5, None, call(41))]
    HistoryStore(store).add_runs(runs)
    refreshed(synthetic_app)
    h = publish(synthetic_app, published, "media.resize", 40)  # ran twice, either tenant
    assert (h["predicted_runtime_s"], h["predicted_p90_s"], h["prediction_source"]) == \
        (pytest.approx(0.05), pytest.approx(0.06), "call_history")
    h = publish(synthetic_app, published, "media.resize", 41)  # once: not yet its own
    assert (h["predicted_p90_s"], h["prediction_source"]) == (1.5, "history")


def test_the_model_predicts_once_promoted(synthetic_app, store, published, trained):
    make_live(store, "aitp.acme.cpu.lo")
    HistoryStore(store).add_runs([("acme", "media.resize", 0.2)])
    refreshed(synthetic_app)
    assert publish(synthetic_app, published, "media.resize", 640, 480)["prediction_source"] == \
        "history"
    ModelStore(store).promote(trained.bundle)
    view = refreshed(synthetic_app)
    model = view.sources[MODEL_SOURCE]
    assert model.version == trained.bundle.version
    h = publish(synthetic_app, published, "media.resize", 640, 480, quality=85)
    assert h["prediction_source"] == "model"
    request = Request("media.resize", "id", (640, 480), {"quality": 85}, published_at=h[
        "decided_at"], args_bytes=len("(640, 480)"), kwargs_bytes=len("{'quality': 85}"))
    decision = Decision("takeover", h["decided_at"])
    decision.tenant = "acme"
    synthetic_app.aitp.pipeline.stages[1](request, decision, view)  # the features stage
    vector = model.spec.vector("media.resize", "acme", (640, 480), {"quality": 85},
                               len("(640, 480)"), len("{'quality': 85}"), None, 0,
                               h["decided_at"], view.sources[HISTORY_SOURCE].features.get(
                                   ("acme", "media.resize")))
    assert decision.feature_key == model.compiled.key(vector)  # the key, without the vector
    # the model corrects the history estimate: its output times the last two (0.2 s)
    assert model.base_default_s is not None
    low, high = model.compiled.evaluate(vector)
    assert (h["predicted_runtime_s"], h["predicted_p90_s"]) == (on_grid(low) * 0.2,
                                                                on_grid(high) * 0.2)
    assert h["predicted_p90_s"] >= h["predicted_runtime_s"] > 0


def test_a_direct_model_predicts_without_the_history_estimate(
        synthetic_app, store, published, synthetic_records):
    direct = train(synthetic_records, TrainConfig(rounds=20, p90_rounds=5, residual=False))
    assert direct.bundle is not None and direct.bundle.meta["target"] == "log(runtime_s)"
    make_live(store, "aitp.acme.cpu.lo")
    HistoryStore(store).add_runs([("acme", "media.resize", 0.2)])
    ModelStore(store).promote(direct.bundle)
    view = refreshed(synthetic_app)
    model = view.sources[MODEL_SOURCE]
    assert model.version == direct.bundle.version and model.base_default_s is None
    h = publish(synthetic_app, published, "media.resize", 640, 480, quality=85)
    vector = model.spec.vector("media.resize", "acme", (640, 480), {"quality": 85},
                               len("(640, 480)"), len("{'quality': 85}"), None, 0,
                               h["decided_at"], view.sources[HISTORY_SOURCE].features.get(
                                   ("acme", "media.resize")))
    # the forests' output as it is: not multiplied by the last two (0.2 s)
    low, high = model.compiled.evaluate(vector)
    assert (h["predicted_runtime_s"], h["predicted_p90_s"]) == (on_grid(low), on_grid(high))


def test_a_model_without_a_request_key_predicts_from_the_feature_vector(
        synthetic_app, store, published, trained):
    make_live(store, "aitp.acme.cpu.lo")
    ModelStore(store).promote(trained.bundle)
    view = refreshed(synthetic_app)
    model = view.sources[MODEL_SOURCE]
    model.request_key = None  # as for a model whose forests cannot be walked over the key
    h = publish(synthetic_app, published, "media.resize", 640, 480, quality=85)
    assert h["prediction_source"] == "model"
    request = Request("media.resize", "id", (640, 480), {"quality": 85},
                      published_at=h["decided_at"], args_bytes=len("(640, 480)"),
                      kwargs_bytes=len("{'quality': 85}"))
    decision = Decision("takeover", h["decided_at"])
    decision.tenant = "acme"
    synthetic_app.aitp.pipeline.stages[1](request, decision, view)  # the features stage
    assert decision.feature_key is None and len(decision.features) == len(model.spec.names)
    low, high = model.compiled.evaluate(decision.features)
    base = model.base_default_s  # no history for this pair or tenant: the training median
    assert (h["predicted_runtime_s"], h["predicted_p90_s"]) == (on_grid(low) * base,
                                                                on_grid(high) * base)


def test_a_refused_model_leaves_cold_start_in_place(synthetic_app, store, published, trained):
    HistoryStore(store).add_runs([("acme", "mail.send", 0.05)])
    broken = ModelBundle({**trained.bundle.meta, "version": "bad"}, "tree\ngarbage",
                         trained.bundle.p90_text)
    ModelStore(store).promote(broken)
    assert refreshed(synthetic_app).sources[MODEL_SOURCE] is None
    h = publish(synthetic_app, published, "mail.send", 42)
    assert h["prediction_source"] == "history" and h["predicted_runtime_s"] == 0.05


def test_decision_records_carry_the_prediction(synthetic_app, store, published, trained):
    ModelStore(store).promote(trained.bundle)
    refreshed(synthetic_app)
    publish(synthetic_app, published, "reports.build", rows=5000, charts=True)
    synthetic_app.aitp.live.flush()
    record = store.read_records(store.keys.decisions)[-1]
    assert record["prediction_source"] == "model" and record["task"] == "reports.build"
    assert record["predicted_runtime_s"] == read_header(published[-1]["headers"]["aitp"])[
        "predicted_runtime_s"]
    assert json.loads(json.dumps(record)) == record


def test_model_predictions_are_rounded_to_a_grid_within_its_half_step() -> None:
    """Predictions that differ in the fourth digit become one (the memo keys on them),
    and none moves by more than half a step of the grid."""
    half_step = 2.0 ** (0.5 / GRID_STEPS)
    values = [0.0123 * 1.0007 ** i for i in range(3000)]
    rounded = [on_grid(v) for v in values]
    assert all(1 / half_step - 1e-12 <= r / v <= half_step + 1e-12
               for r, v in zip(rounded, values, strict=True))
    assert len(set(rounded)) < len(values) / 30  # 3,000 values, 2.1 doublings: ~35 steps
    assert on_grid(on_grid(0.7)) == on_grid(0.7)
    assert on_grid(1.0) == 1.0 and on_grid(0.5) == 0.5 and on_grid(0.0) == 0.0
    assert on_grid(float("inf")) == float("inf")
