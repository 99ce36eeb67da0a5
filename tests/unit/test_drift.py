"""Drift: live per-task prediction error, the history fallback, the retrain request, and
the trainer as a beat task."""

from __future__ import annotations

import math
from typing import Any

from celery_aitp.cli.celery_command import aitp  # noqa: F401 - before its sub-commands
from celery_aitp.cli.trainer import Trainer
from celery_aitp.learn.schedule import TASK_NAME, add_trainer_task
from celery_aitp.predict.drift import (
    BOUND,
    MIN_RUNS,
    DriftSink,
    DriftStore,
    DriftView,
    run_error,
)
from celery_aitp.predict.history import HistoryStore
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker.observe import record_run
from tests.unit.conftest import make_live
from tests.unit.test_prediction_stages import publish, refreshed, synthetic_app  # noqa: F401

MISS = math.log(5.0)  # every run 5x off: beyond the bound


def test_run_error_is_the_log_ratio_and_ignores_bad_values():
    assert run_error(8.0, 2.0) == math.log(4.0) == run_error(2.0, 8.0)
    for bad in ((0.0, 1.0), (1.0, None), (math.nan, 1.0), (1.0, math.inf), ("1", 1.0)):
        assert run_error(*bad) is None


def test_a_task_crossing_the_bound_asks_once_for_a_retrain(store):
    drift = DriftStore(store)
    assert drift.add([("slow", MISS)] * (MIN_RUNS - 1)) == 0  # too few runs yet
    assert drift.take_due() is None
    assert drift.add([("slow", MISS), ("fine", 0.1)]) == 1
    assert drift.take_due() == "drift: slow" and drift.take_due() is None
    assert drift.add([("slow", MISS)] * 5) == 0  # still beyond: not asked again
    averages = drift.read()
    assert averages["slow"][1] == MIN_RUNS + 5 and averages["slow"][0] > BOUND
    assert DriftView(averages).drifting == frozenset({"slow"})


def test_the_average_recovers_when_predictions_are_good_again(store):
    drift = DriftStore(store)
    drift.add([("t", MISS)] * MIN_RUNS)
    assert DriftView(drift.read()).drifting == {"t"}
    drift.add([("t", 0.05)] * 40)
    assert DriftView(drift.read()).drifting == frozenset()


def test_workers_record_errors_only_for_model_predicted_successes(store):
    sink = DriftSink(Counters())
    ledger = type("Ledger", (), {"add": lambda self, record: None})()
    history: Any = type("History", (), {"add": lambda self, *a: None})()
    base = {"task": "t", "tenant": "acme", "outcome": "SUCCESS", "runtime_s": 10.0,
            "predicted_runtime_s": 2.0, "prediction_source": "model"}
    record_run(ledger, history, base, sink)
    record_run(ledger, history, {**base, "prediction_source": "history"}, sink)
    record_run(ledger, history, {**base, "outcome": "FAILURE"}, sink)
    record_run(ledger, history, {**base, "predicted_runtime_s": None}, sink)
    assert len(sink) == 1
    sink.flush(store)
    assert DriftStore(store).read()["t"] == (float(f"{math.log(5.0):.6g}"), 1)


def test_a_drifting_task_is_predicted_from_history_and_counted(
        synthetic_app, store, published, trained):  # noqa: F811
    make_live(store, "aitp.acme.cpu.lo")
    HistoryStore(store).add_runs([("acme", "media.resize", 7.0)] * 3)
    ModelStore(store).promote(trained.bundle)
    refreshed(synthetic_app)
    assert publish(synthetic_app, published, "media.resize", 640, 480)[
        "prediction_source"] == "model"
    DriftStore(store).add([("media.resize", MISS)] * MIN_RUNS)
    refreshed(synthetic_app)
    h = publish(synthetic_app, published, "media.resize", 640, 480)
    assert h["prediction_source"] == "history" and h["predicted_runtime_s"] == 7.0
    assert synthetic_app.aitp.counters.totals["prediction_drift"] >= 1
    assert publish(synthetic_app, published, "reports.build", 5)["prediction_source"] == "model"
    ModelStore(store).promote(trained.bundle)  # a new model starts with a clean slate
    refreshed(synthetic_app)
    assert publish(synthetic_app, published, "media.resize", 640, 480)[
        "prediction_source"] == "model"


def test_a_drift_request_makes_the_trainer_run_without_new_observations(
        app, store, synthetic_records, capsys):
    store.append_records(store.keys.observations, synthetic_records[:600], 10_000)
    trainer = Trainer(app.aitp, every_s=0.01, min_new=50, limit=None)
    trainer.run(rounds=1)
    capsys.readouterr()
    trainer.run(rounds=1)
    assert "no new observations" in capsys.readouterr().out
    DriftStore(store).add([("reports.build", MISS)] * MIN_RUNS)
    trainer.run(rounds=1)
    assert "retraining: drift: reports.build" in capsys.readouterr().out
    assert DriftStore(store).take_due() is None


def test_the_trainer_as_a_beat_task(app, store, synthetic_records):
    task = add_trainer_task(app, every_s=300, min_new=10)
    assert app.conf.beat_schedule[TASK_NAME]["schedule"] == 300.0
    assert app.tasks[TASK_NAME].name == task.name == TASK_NAME
    store.append_records(store.keys.observations, synthetic_records[:600], 10_000)
    task.run()
    assert ModelStore(store).version() is not None
    store.client.set(store.keys.any("lock", "trainer"), "someone else")
    version = ModelStore(store).version()
    store.append_records(store.keys.observations, synthetic_records[600:900], 10_000)
    task.run()  # the lock is held elsewhere: this round is skipped
    assert ModelStore(store).version() == version


def test_aitp_model_shows_the_live_error_per_task(app, store, trained):
    import json
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_aitp.cli.celery_command import aitp as group

    ModelStore(store).promote(trained.bundle)
    DriftStore(store).add([("slow", MISS)] * MIN_RUNS + [("fine", 0.1)] * MIN_RUNS)
    run = CliRunner().invoke(group, ["model"], obj=SimpleNamespace(app=app))
    assert run.exit_code == 0
    lines = run.output.splitlines()
    assert any("slow" in line and "history (drift)" in line for line in lines)
    assert any("fine" in line and "model" in line for line in lines)
    shown = json.loads(CliRunner().invoke(group, ["model", "--json"],
                                          obj=SimpleNamespace(app=app)).output)
    assert shown["drift"]["slow"]["runs"] == MIN_RUNS
