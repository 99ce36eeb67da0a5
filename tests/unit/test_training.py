"""Training: bad records counted, chronological history, baselines, the promotion rule."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from celery_aitp.errors import ModelError
from celery_aitp.learn import train as train_module
from celery_aitp.learn.dataset import build_dataset, read_jsonl
from celery_aitp.learn.offline import predict_records
from celery_aitp.learn.train import Scores, TrainConfig, baselines, bundle_seconds, scores, train
from celery_aitp.predict.bundle import ModelBundle, load_bundle

GOOD = {"task": "t", "tenant": "a", "args": [1], "kwargs": {}, "published_at": 100.0,
        "runtime_s": 1.0}


def test_bad_records_are_skipped_counted_and_summarised():
    bad = [
        "not a dict",
        {k: v for k, v in GOOD.items() if k != "task"},
        {**GOOD, "task": 7},
        {k: v for k, v in GOOD.items() if k != "tenant"},
        {**GOOD, "published_at": "noon"},
        {k: v for k, v in GOOD.items() if k != "runtime_s"},
        {**GOOD, "runtime_s": -1},
        {**GOOD, "runtime_s": math.nan},
        {**GOOD, "runtime_s": math.inf},
        {**GOOD, "runtime_s": "1s"},
        {**GOOD, "args": "1, 2"},
        {**GOOD, "kwargs": [1]},
        {**GOOD, "outcome": "FAILURE"},
    ]
    dataset = build_dataset([GOOD, *bad, {**GOOD, "published_at": 101.0}])
    assert len(dataset) == 2 and dataset.total == 15
    assert sum(dataset.skipped.values()) == 13
    for reason in ("missing task", "task not a string", "missing tenant", "negative runtime_s",
                   "runtime_s is NaN", "runtime_s is infinite", "runtime_s not a number",
                   "args not a list", "kwargs not an object", "outcome not SUCCESS"):
        assert dataset.skipped[reason] == 1, reason
    assert dataset.summary().startswith("used 2 of 15 records; skipped 13 (")


def test_unreadable_lines_of_a_file_are_counted():
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.jsonl"
        path.write_text(json.dumps(GOOD) + "\n{broken\n\n" + json.dumps(GOOD) + "\n")
        dataset = build_dataset(read_jsonl(path))
    assert len(dataset) == 2 and dataset.skipped["not JSON"] == 1


def test_history_holds_only_runs_finished_before_publication():
    runs = [
        {**GOOD, "published_at": 0.0, "runtime_s": 10.0},   # finishes at 10
        {**GOOD, "published_at": 1.0, "runtime_s": 2.0},    # finishes at 3
        {**GOOD, "published_at": 5.0, "runtime_s": 1.0},    # sees only the second run
        {**GOOD, "published_at": 20.0, "runtime_s": 1.0},   # sees all three
        {**GOOD, "tenant": "b", "published_at": 21.0, "runtime_s": 1.0},  # another pair
        {**GOOD, "task": "other", "published_at": 22.0, "runtime_s": 1.0},  # same tenant
    ]
    observations = build_dataset(runs).observations
    assert observations[0].history is None and observations[1].history is None
    assert observations[2].history is not None and observations[2].history[:3] == (2.0, 2.0, 1)
    assert observations[3].history is not None
    assert observations[3].history[:3] == ((1.0 + 10.0) / 2, 13.0 / 3, 3)
    assert observations[4].history is None
    # a tenant's new task: no pair history, but the tenant's last two (runs 4 and 1 of "a")
    first_of_task = observations[5].history
    assert first_of_task is not None and math.isnan(first_of_task[0])
    assert first_of_task[-2:] == (5.5, 5.5)


def test_baselines_on_a_hand_made_example():
    train_part = build_dataset([
        {**GOOD, "task": "x", "published_at": 0.0, "runtime_s": 1.0},
        {**GOOD, "task": "x", "published_at": 10.0, "runtime_s": 3.0},
        {**GOOD, "task": "y", "published_at": 20.0, "runtime_s": 10.0},
    ]).observations
    valid = build_dataset([
        {**GOOD, "task": "x", "published_at": 0.0, "runtime_s": 1.0},
        {**GOOD, "task": "x", "published_at": 10.0, "runtime_s": 3.0},
        {**GOOD, "task": "x", "published_at": 30.0, "runtime_s": 4.0},
    ]).observations[2:]
    median, per_task, last_two = baselines(train_part, valid)
    assert median.mae == pytest.approx(1.0)       # predicts 3.0 for a 4.0 s run
    assert per_task.mae == pytest.approx(2.0)     # mean of x = 2.0
    assert last_two.mae == pytest.approx(2.0)     # mean of 1.0 and 3.0
    assert scores("s", [1.0, 4.0], [1.9, 1.0]).within_2x == 0.5


def test_a_tenants_new_task_falls_back_to_the_task_mean_in_the_last_two_baseline():
    # the pair (a, y) has no run yet, the tenant has: its history's pair fields are NaN
    records = [
        {**GOOD, "task": "x", "published_at": 0.0, "runtime_s": 1.0},
        {**GOOD, "task": "y", "published_at": 5.0, "runtime_s": 4.0},
        {**GOOD, "task": "x", "published_at": 10.0, "runtime_s": 3.0},
        {**GOOD, "task": "y", "published_at": 30.0, "runtime_s": 6.0},
    ]
    observations = build_dataset(records).observations
    new_pair = observations[1]
    assert new_pair.history is not None and math.isnan(new_pair.history[0])
    _, per_task, last_two = baselines(observations[:1] + observations[1:2], [new_pair])
    assert not math.isnan(last_two.mae) and not math.isnan(last_two.log_error)
    assert last_two.mae == pytest.approx(per_task.mae) == pytest.approx(0.0)  # y's mean: 4


def test_a_model_that_beats_last_two_is_promotable(trained):
    assert trained.promotable and trained.bundle is not None
    model, last_two = trained.score("model"), trained.score("last two")
    assert model.mae < last_two.mae
    assert trained.bundle.meta["metrics"]["last two"]["mae"] == pytest.approx(last_two.mae)
    assert trained.bundle.meta["promotable"] is True
    assert load_bundle(trained.bundle).version == trained.bundle.version


def _last_two_scoring(monkeypatch, mae: float, log_error: float) -> None:
    """Make the last-two baseline score ``mae`` seconds and ``log_error``."""
    found_baselines = train_module.baselines

    def scored(train_part, valid):
        found = found_baselines(train_part, valid)
        return [*found[:2], Scores("last two", mae, mae, 1.0, found[2].n, log_error)]

    monkeypatch.setattr(train_module, "baselines", scored)


def test_a_model_that_does_not_beat_last_two_is_not_promotable(synthetic_records, monkeypatch):
    _last_two_scoring(monkeypatch, mae=0.0, log_error=0.0)
    result = train(synthetic_records[:600], TrainConfig(rounds=10, p90_rounds=3))
    assert result.bundle is not None and not result.promotable
    assert "does not beat the last-two baseline" in result.reason


def test_promotion_compares_how_many_times_off_not_how_many_seconds(
        synthetic_records, monkeypatch):
    config = TrainConfig(rounds=10, p90_rounds=3)
    # far off in seconds, never off by a factor: the model does not beat it
    _last_two_scoring(monkeypatch, mae=1e9, log_error=0.0)
    assert not train(synthetic_records[:600], config).promotable
    # exact in seconds on average, off by a large factor: the model beats it
    _last_two_scoring(monkeypatch, mae=0.0, log_error=50.0)
    result = train(synthetic_records[:600], config)
    assert result.promotable and "log error" in result.reason


def test_log_error_is_the_mean_factor_off():
    s = scores("s", [1.0, 4.0], [2.0, 1.0])
    assert s.log_error == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert scores("s", [3.0], [3.0]).log_error == 0.0


def _history_led_records(n: int = 1500) -> list[dict]:
    """Each (tenant, task)'s runtime drifts by a factor of up to 8 over time and does not
    depend on the arguments: the last two runs are the only signal."""
    import random

    rng = random.Random(3)
    level = {(tenant, task): 1.0 for tenant in "ab" for task in ("x", "y", "z")}
    out = []
    for i in range(n):
        pair = rng.choice(sorted(level))
        level[pair] = min(64.0, max(0.1, level[pair] * rng.choice([0.5, 1.0, 1.0, 2.0])))
        out.append({**GOOD, "tenant": pair[0], "task": pair[1], "args": [rng.randint(1, 9)],
                    "published_at": 100.0 * i,
                    "runtime_s": level[pair] * rng.uniform(0.9, 1.1)})
    return out


def test_the_model_corrects_the_history_estimate_only_where_that_wins():
    config = TrainConfig(rounds=30, p90_rounds=3, probe_rounds=15)
    led = train(_history_led_records(), config)
    assert led.bundle is not None and led.bundle.meta["target"] == "log(runtime_s / base)"
    assert "base" in led.bundle.meta


def test_runtimes_set_by_the_arguments_get_a_direct_model(synthetic_records):
    config = TrainConfig(rounds=30, p90_rounds=3, probe_rounds=15)
    by_arguments = train(synthetic_records, config)
    assert by_arguments.bundle is not None
    assert by_arguments.bundle.meta["target"] == "log(runtime_s)"
    assert "base" not in by_arguments.bundle.meta
    # asked for, the residual model is still trained
    forced = train(synthetic_records, replace(config, residual=True))
    assert forced.bundle is not None and forced.bundle.meta["target"] == "log(runtime_s / base)"


def test_the_direct_model_takes_larger_steps_than_the_residual_model(synthetic_records):
    # each kind boosts at its own learning rate: the model text LightGBM wrote says which
    config = TrainConfig(rounds=30, p90_rounds=3, probe_rounds=15, learning_rate=0.07,
                         direct_learning_rate=0.35)
    direct = train(synthetic_records, config).bundle
    residual = train(_history_led_records(), config).bundle
    assert direct is not None and direct.meta["target"] == "log(runtime_s)"
    assert residual is not None and residual.meta["target"] == "log(runtime_s / base)"
    assert "[learning_rate: 0.35]" in direct.p50_text
    assert direct.meta["params"]["p50"]["learning_rate"] == 0.35
    assert "[learning_rate: 0.07]" in residual.p50_text
    assert residual.meta["params"]["p50"]["learning_rate"] == 0.07
    # the p90 offset model keeps its own rate either way
    assert f"[learning_rate: {config.p90_learning_rate}]" in direct.p90_text


def test_the_final_rows_are_the_training_rows_then_the_validation_rows(synthetic_records):
    from celery_aitp.learn.train import Matrix, make_spec

    dataset = build_dataset(synthetic_records[:300])
    spec = make_spec(dataset)
    head, tail = dataset.observations[:200], dataset.observations[200:]
    joined = Matrix(spec, head, 2.0).joined(Matrix(spec, tail, 2.0))
    whole = Matrix(spec, dataset.observations, 2.0)
    assert joined.x.shape == whole.x.shape
    assert ((joined.x == whole.x) | ((joined.x != joined.x) & (whole.x != whole.x))).all()
    assert (joined.y == whole.y).all() and (joined.base == whole.base).all()
    direct = whole.direct()
    assert (direct.base == 1.0).all()
    assert direct.y == pytest.approx(Matrix(spec, dataset.observations).y)


def test_too_little_data_gives_no_model():
    result = train([GOOD] * 5)
    assert result.bundle is None and "too few usable records" in result.reason


def test_offline_predictions_keep_input_order_and_mark_bad_records(trained, synthetic_records):
    records = [*synthetic_records[-20:], {"task": "broken"}, "junk",
               {**synthetic_records[0], "runtime_s": None}]
    out = predict_records(trained.bundle, records)
    assert len(out) == len(records)
    assert out[0]["task_id"] == records[0]["task_id"]
    assert all(o["predicted_p90_s"] >= o["predicted_runtime_s"] > 0 for o in out[:20])
    assert out[20]["error"] == "missing tenant" and out[21]["error"] == "not a JSON object"
    assert out[22]["predicted_runtime_s"] > 0  # runtime_s is not needed to predict


def test_bundle_seconds_are_the_offline_predictions(trained, synthetic_records):
    # the benchmarks score a bundle on observations with bundle_seconds; the same
    # records through the offline predictor must give the same seconds
    records = synthetic_records[-50:]
    p50, p90 = bundle_seconds(trained.bundle, build_dataset(records).observations)
    offline = predict_records(trained.bundle, records)
    assert p50.tolist() == pytest.approx([o["predicted_runtime_s"] for o in offline])
    assert p90.tolist() == pytest.approx([o["predicted_p90_s"] for o in offline])
    assert all(hi >= lo > 0 for lo, hi in zip(p50, p90, strict=True))


def test_a_bundle_whose_models_do_not_fit_its_metadata_is_refused_offline(trained,
                                                                        synthetic_records):
    meta = trained.bundle.meta
    # metadata consistent in itself (one more keyword feature), models trained without it
    widened = ModelBundle({**meta, "kwarg_names": [*meta["kwarg_names"], "extra"],
                           "feature_names": [*meta["feature_names"], "kw.extra"]},
                          trained.bundle.p50_text, trained.bundle.p90_text)
    observations = build_dataset(synthetic_records[-5:]).observations
    refused = r"p50 model \(p50.txt\): its feature names differ from the metadata's"
    with pytest.raises(ModelError, match=refused):
        bundle_seconds(widened, observations)
    with pytest.raises(ModelError, match=refused):
        predict_records(widened, synthetic_records[-5:])
