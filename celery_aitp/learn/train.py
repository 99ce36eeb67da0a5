"""Train the runtime model: log runtime (p50) and its 0.9 quantile (p90), with LightGBM.

The model corrects the history estimate rather than predicting from scratch: its target
is ``log(runtime / base)``, where ``base`` is the mean of the (tenant, task)'s last two
runs (else the tenant's last two, else the training median; :func:`base_of`). With no
reason to deviate it predicts the last two, which on real job logs is hard to beat; the
trees learn when to trust it (the last two agree, many runs) and by how much to move.
Where the last two are a poor estimate (runtimes follow the arguments, not the recent
past), the model predicts log runtime directly: which of the two wins on the validation
part is measured with a quick model of each kind (:func:`prefer_residual`).
The p50 objective is L1 in log space: the conditional median, which also minimises the
absolute error in seconds. The number of trees is chosen on the validation part (early
stopping), so a workload with more structure gets more trees.

Validation is chronological: the newest ``valid_fraction`` of the records (by publish
time) is held out and both the model and three baselines predict it:

* global median: the median runtime of the training part;
* per-task mean: the mean runtime of the task in the training part;
* last two: the mean of the same (tenant, task)'s last two finished runs, as a producer
  would have known them at publish time (Tsafrir et al.'s baseline), falling back to
  the per-task mean and then the global median.

The model is promotable only if its log error (how many times off) beats the last-two baseline.
The promoted model is then refit on all records with the same settings. Never on the
publish path; never pickled.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from celery_aitp.extras import require
from celery_aitp.learn.dataset import MIN_RUNTIME_S, Dataset, Observation, build_dataset
from celery_aitp.predict.bundle import (
    FORMAT,
    ModelBundle,
    base_default,
    booster_from_text,
    spec_from_meta,
    verify_with_lightgbm,
)
from celery_aitp.predict.features import CATEGORICAL, SCHEMA, FeatureSpec, base_of

#: ``report(step, done, total)``: progress of a long step (for a progress bar).
Report = Callable[[str, int, int], None]


def _quiet(step: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class TrainConfig:
    """LightGBM settings, chosen on real job logs (``benchmarks/prediction_traces.py``):
    the p50 model's size follows what accuracy needs (early stopping picks 60 to 80
    trees of the residual model on the logs); the publish path caches its predictions
    instead of asking for a smaller model. The direct model (the generated workload)
    boosts at ``direct_learning_rate``: 0.3 reaches the accuracy of 0.1 (MAE 2.24 s
    against 2.29, within 2x 92.1% against 92.6%) in 137 trees instead of 268, and a
    prediction-cache miss walks every tree; at 0.4 and 0.5 the MAE grows (2.41, 2.46).
    On the logs 0.3 for the residual model loses accuracy (LANL 0.843x -> 0.851x the
    last-two MAE, SDSC 0.779x -> 0.859x), so it keeps ``learning_rate``.

    The p90 model is boosted from the p50 model's scores (LightGBM ``init_score``): it
    only learns how far above the median the 0.9 quantile lies, which takes few trees
    (10 of 15 leaves: with 7, the p90 covered 95.05% of HPC2N's newest runs, beyond the
    85-95% the issue asks for).
    """

    valid_fraction: float = 0.2
    #: Most p50 trees; early stopping on the validation part usually picks fewer.
    rounds: int = 300
    early_stopping_rounds: int = 10
    objective: str = "regression_l1"
    #: Correct the history estimate (``log(runtime / base)``) instead of predicting log
    #: runtime: None decides on the validation part (:func:`prefer_residual`), True
    #: always, False never.
    residual: bool | None = None
    #: The quick models that decide ``residual`` (None): trees and learning rate.
    probe_rounds: int = 40
    probe_learning_rate: float = 0.3
    #: The residual model's learning rate.
    learning_rate: float = 0.1
    #: The direct model's (see above).
    direct_learning_rate: float = 0.3
    num_leaves: int = 31
    max_depth: int = 9
    p90_rounds: int = 10
    p90_learning_rate: float = 0.4
    p90_num_leaves: int = 15
    min_data_in_leaf: int = 50
    max_bin: int = 255
    quantile: float = 0.9
    min_records: int = 100
    threads: int = 0  # 0: LightGBM's default (all cores)
    seed: int = 7

    def params(self, objective: str) -> dict[str, Any]:
        quantile = objective == "quantile"
        params: dict[str, Any] = {
            "objective": objective,
            "learning_rate": self.p90_learning_rate if quantile else self.learning_rate,
            "num_leaves": self.p90_num_leaves if quantile else self.num_leaves,
            "max_depth": self.max_depth, "min_data_in_leaf": self.min_data_in_leaf,
            "max_bin": self.max_bin, "min_data_per_group": 10, "cat_smooth": 5,
            "metric": "quantile" if quantile else "l1",
            "verbose": -1, "seed": self.seed, "deterministic": True, "force_row_wise": True,
        }
        if quantile:
            params["alpha"] = self.quantile
        if self.threads:
            params["num_threads"] = self.threads
        return params


@dataclass
class Scores:
    """Error of one predictor on the validation records.

    ``mae`` and ``median_ae`` are in seconds; ``log_error`` is the mean of
    ``|ln(predicted / true)|``, the factor a prediction is off by. Promotion compares
    ``log_error``: placement ranks tasks by their size, where 10 s taken for 20 s is as
    wrong as 10 h taken for 20 h, while an error in seconds is decided by the few
    longest runs.
    """

    name: str
    mae: float
    median_ae: float
    within_2x: float
    n: int
    log_error: float

    def as_dict(self) -> dict[str, Any]:
        return {"mae": self.mae, "median_ae": self.median_ae, "within_2x": self.within_2x,
                "log_error": self.log_error, "n": self.n}


@dataclass
class TrainResult:
    """The outcome of one training run (``bundle`` is None if there was too little data)."""

    dataset: Dataset
    bundle: ModelBundle | None
    scores: list[Scores] = field(default_factory=list)
    p90_coverage: float | None = None
    promotable: bool = False
    reason: str = ""
    seconds: float = 0.0

    def score(self, name: str) -> Scores:
        return next(s for s in self.scores if s.name == name)


def scores(name: str, truth: Sequence[float], predicted: Sequence[float]) -> Scores:
    errors = [abs(p - t) for p, t in zip(predicted, truth, strict=True)]
    within = sum(1 for p, t in zip(predicted, truth, strict=True)
                 if _ratio_ok(p, max(t, MIN_RUNTIME_S)))
    log_errors = [abs(math.log(max(p, MIN_RUNTIME_S) / max(t, MIN_RUNTIME_S)))
                  for p, t in zip(predicted, truth, strict=True)]
    n = len(truth)
    return Scores(name, sum(errors) / n, statistics.median(errors), within / n, n,
                  sum(log_errors) / n)


def _ratio_ok(predicted: float, truth: float) -> bool:
    return predicted > 0 and 0.5 <= predicted / truth <= 2.0


def baselines(train: Sequence[Observation], valid: Sequence[Observation]) -> list[Scores]:
    """Global median, per-task mean and per-(tenant, task) last-two mean on ``valid``."""
    runtimes = [o.runtime_s or 0.0 for o in train]
    median = statistics.median(runtimes)
    per_task: dict[str, list[float]] = {}
    for o in train:
        per_task.setdefault(o.task, []).append(o.runtime_s or 0.0)
    task_mean = {task: sum(v) / len(v) for task, v in per_task.items()}
    truth = [o.runtime_s or 0.0 for o in valid]
    by_task = [task_mean.get(o.task, median) for o in valid]
    last_two = [_last_two_or(o, task_mean.get(o.task, median)) for o in valid]
    return [
        scores("global median", truth, [median] * len(valid)),
        scores("per-task mean", truth, by_task),
        scores("last two", truth, last_two),
    ]


def _last_two_or(observation: Observation, fallback: float) -> float:
    """The mean of the (tenant, task)'s last two runs, or ``fallback`` while it has none.
    A history may hold only the tenant's other tasks (its pair fields are NaN): a NaN
    here made every error NaN, and no model ever beat the baseline."""
    value = observation.history[0] if observation.history else math.nan
    return value if value == value else fallback


class Matrix:
    """Feature rows, bases and log targets for a list of observations.

    ``base_default_s`` set: the target is ``log(runtime / base)`` (a residual model);
    None: ``log(runtime)`` and every base is 1.
    """

    def __init__(self, spec: FeatureSpec, observations: Sequence[Observation],
                 base_default_s: float | None = None) -> None:
        import numpy as np

        rows = [spec.row(o.task, o.tenant, o.arguments, o.hint_s, o.retries, o.published_at,
                         o.history) for o in observations]
        self.x = np.array(rows, dtype=np.float64).reshape(len(rows), len(spec.names))
        bases = ([base_of(o.history, base_default_s) for o in observations]
                 if base_default_s is not None else [1.0] * len(observations))
        self.base = np.maximum(np.array(bases, dtype=np.float64), MIN_RUNTIME_S)
        self.y = np.log(np.maximum(
            np.array([o.runtime_s or 0.0 for o in observations], dtype=np.float64),
            MIN_RUNTIME_S)) - np.log(self.base)

    def joined(self, other: Matrix) -> Matrix:
        """This matrix's rows followed by ``other``'s (the rows are not built again)."""
        import numpy as np

        out = Matrix.__new__(Matrix)
        out.x = np.concatenate([self.x, other.x])
        out.y = np.concatenate([self.y, other.y])
        out.base = np.concatenate([self.base, other.base])
        return out

    def direct(self) -> Matrix:
        """The same rows with the target ``log(runtime)`` and every base 1."""
        import numpy as np

        out = Matrix.__new__(Matrix)
        out.x = self.x
        out.y = self.y + np.log(self.base)
        out.base = np.ones_like(self.base)
        return out

    def seconds(self, boosters: tuple[Any, Any]) -> tuple[Any, Any]:
        """p50 and p90 seconds of every row (p90 never below p50)."""
        import numpy as np

        low, high = predict_log(boosters, self.x)
        p50 = np.exp(low) * self.base
        return p50, np.maximum(np.exp(high) * self.base, p50)


def _dataset(spec: FeatureSpec, data: Matrix, config: TrainConfig, init_score: Any = None,
             reference: Any = None) -> Any:
    import lightgbm

    categorical = [spec.names.index(c) for c in CATEGORICAL]
    return lightgbm.Dataset(data.x, data.y, feature_name=list(spec.names),
                            categorical_feature=categorical, init_score=init_score,
                            free_raw_data=True, reference=reference,
                            params={"max_bin": config.max_bin, "verbose": -1})


def _fit(spec: FeatureSpec, data: Matrix, config: TrainConfig, objective: str,
         rounds: int, report: Report, step: str, init_score: Any = None,
         valid: Matrix | None = None) -> Any:
    import lightgbm

    train_set = _dataset(spec, data, config, init_score)

    def progress(env: Any) -> None:
        report(step, env.iteration + 1, env.end_iteration)

    callbacks: list[Any] = [progress]
    valid_sets = []
    if valid is not None and len(valid.y):
        valid_sets = [_dataset(spec, valid, config, reference=train_set)]
        callbacks.append(lightgbm.early_stopping(config.early_stopping_rounds, verbose=False))
    return lightgbm.train(config.params(objective), train_set, num_boost_round=rounds,
                          valid_sets=valid_sets, callbacks=callbacks)


def _fit_pair(spec: FeatureSpec, data: Matrix, config: TrainConfig, report: Report,
              label: str, valid: Matrix | None = None, rounds: int | None = None,
              p90_shift: float = 0.0) -> tuple[Any, Any]:
    """The p50 model (its number of trees chosen on ``valid`` if given: it then predicts
    with its ``best_iteration``), and the p90 offset model boosted from its scores.

    ``p90_shift`` raises the p90 by that much log runtime: boosting from scores lowered
    by it, the trees learn the quantile plus the shift (init scores are not saved)."""
    p50 = _fit(spec, data, config, config.objective, rounds or config.rounds, report,
               f"{label} p50", valid=valid)
    base = p50.predict(data.x, raw_score=True)
    p90 = _fit(spec, data, config, "quantile", config.p90_rounds, report, f"{label} p90",
               init_score=base - p90_shift)
    return p50, p90


def prefer_residual(spec: FeatureSpec, train_x: Matrix, valid_x: Matrix,
                    truth: Sequence[float], config: TrainConfig) -> bool:
    """Whether to correct the history estimate rather than predict log runtime directly:
    a quick p50 model of each kind (``probe_rounds`` trees at ``probe_learning_rate``)
    is fitted on the training part and scored on the validation part; the direct model
    is chosen only if it wins both the MAE (seconds) and the share within 2x (a model
    that wins one by losing the other is no better).

    On real job logs the last two runs are the signal to correct; where runtimes follow
    the arguments rather than the recent past (the generated workload), a noisy history
    estimate is a poor starting point and the direct model wins."""
    import numpy as np

    probe = replace(config, learning_rate=config.probe_learning_rate)
    found = []
    for data, valid in ((train_x, valid_x), (train_x.direct(), valid_x.direct())):
        booster = _fit(spec, data, probe, probe.objective, probe.probe_rounds, _quiet,
                       "probe", valid=valid)
        p50 = np.exp(booster.predict(valid.x, raw_score=True)) * valid.base
        found.append(scores("probe", truth, p50.tolist()))
    residual, direct = found
    return not (direct.mae < residual.mae and direct.within_2x > residual.within_2x)


def bundle_boosters(bundle: ModelBundle, role: str = "") -> tuple[Any, Any]:
    """A bundle's p50 and p90 LightGBM models, loaded from their text (never pickle), for
    scoring offline; ``ModelError`` (``role`` and the file in its text) if a text is not
    one LightGBM can load safely or its features are not the metadata's."""
    names = list(spec_from_meta(bundle.meta).names)
    return (booster_from_text(bundle.p50_text, role + bundle.label("p50"), names),
            booster_from_text(bundle.p90_text, role + bundle.label("p90"), names))


def bundle_seconds(bundle: ModelBundle, observations: Sequence[Observation]
                   ) -> tuple[Any, Any]:
    """p50 and p90 seconds a bundle's LightGBM models give ``observations`` (scoring a
    model offline, as the benchmarks do; producers run its compiled form instead)."""
    meta = bundle.meta
    return Matrix(spec_from_meta(meta), observations, base_default(meta)).seconds(
        bundle_boosters(bundle))


def predict_log(boosters: tuple[Any, Any], x: Any) -> tuple[Any, Any]:
    """Log-runtime p50 and p90 of a matrix (the p90 model predicts an offset)."""
    low = boosters[0].predict(x, raw_score=True)
    return low, low + boosters[1].predict(x, raw_score=True)


#: The p90 calibration moves it at most this much log runtime (a factor of e^1.5).
MAX_P90_SHIFT = 1.5


def p90_shift(truth: Sequence[float], upper: Sequence[float], quantile: float) -> float:
    """Log-runtime shift that makes the p90 cover ``quantile`` of the validation runs.

    The validation part is the newest: on real job logs a quantile model fitted on older
    runs covers fewer of the newer ones (split conformal calibration, one constant).
    """
    if not truth:
        return 0.0
    misses = sorted(math.log(max(t, MIN_RUNTIME_S)) - math.log(max(u, MIN_RUNTIME_S))
                    for t, u in zip(truth, upper, strict=True))
    rank = min(len(misses) - 1, max(0, math.ceil(quantile * len(misses)) - 1))
    return max(-MAX_P90_SHIFT, min(MAX_P90_SHIFT, misses[rank]))


def make_spec(dataset: Dataset) -> FeatureSpec:
    return FeatureSpec(dataset.kwarg_names(), dataset.vocabulary("task"),
                       dataset.vocabulary("tenant"))


def train(records: Iterable[Any], config: TrainConfig | None = None,
          report: Report = _quiet, promote_only_if_better: bool = True) -> TrainResult:
    """Validate records, train, compare with the baselines, and build the model bundle."""
    require("train", "training a runtime model")
    config = config or TrainConfig()
    started = time.perf_counter()
    dataset = build_dataset(records)
    result = TrainResult(dataset, None)
    n = len(dataset)
    if n < config.min_records:
        result.reason = f"too few usable records ({n}; at least {config.min_records} needed)"
        result.seconds = time.perf_counter() - started
        return result
    cut = max(1, min(n - 1, int(n * (1 - config.valid_fraction))))
    train_part, valid_part = dataset.observations[:cut], dataset.observations[cut:]
    spec = make_spec(dataset)
    baseline_scores = baselines(train_part, valid_part)
    default_s: float | None = max(statistics.median(o.runtime_s or 0.0 for o in train_part),
                                  MIN_RUNTIME_S)
    report("features", 0, 2)
    train_x = Matrix(spec, train_part, default_s)
    valid_x = Matrix(spec, valid_part, default_s)
    report("features", 2, 2)
    truth = [o.runtime_s or 0.0 for o in valid_part]
    residual = config.residual
    if residual is None:
        residual = prefer_residual(spec, train_x, valid_x, truth, config)
    if not residual:
        train_x, valid_x, default_s = train_x.direct(), valid_x.direct(), None
        config = replace(config, learning_rate=config.direct_learning_rate)
    chosen = _fit_pair(spec, train_x, config, report, "validation", valid=valid_x)
    low, high = valid_x.seconds(chosen)
    predicted, upper = low.tolist(), high.tolist()
    result.scores = [scores("model", truth, predicted), *baseline_scores]
    result.p90_coverage = sum(1 for u, t in zip(upper, truth, strict=True) if t <= u) / len(truth)
    model_error, last_two_error = (result.score("model").log_error,
                                   result.score("last two").log_error)
    result.promotable = model_error < last_two_error
    result.reason = (
        f"model log error {model_error:.3g} vs last-two {last_two_error:.3g}: "
        + ("promotable" if result.promotable else "does not beat the last-two baseline")
    )
    rounds = chosen[0].best_iteration or chosen[0].num_trees()
    shift = p90_shift(truth, upper, config.quantile)
    final = _fit_pair(spec, train_x.joined(valid_x), config, report, "final", rounds=rounds,
                      p90_shift=shift)
    split = (len(train_part), len(valid_part))
    result.bundle = _bundle(spec, dataset, final, config, result, split, valid_x,
                            default_s, rounds, shift)
    verify_with_lightgbm(result.bundle, final)
    result.seconds = time.perf_counter() - started
    return result


def current_model_error(result: TrainResult, current: ModelBundle) -> float:
    """Log error (``Scores.log_error``) of the model in use on the new model's validation
    records: the same window, so promotion compares like with like. ModelError if it
    cannot predict them (e.g. another feature schema)."""
    if result.bundle is None:
        raise ValueError("no new model to compare with")
    valid = result.dataset.observations[-int(result.bundle.meta["records"]["valid"]):]
    spec = spec_from_meta(current.meta)
    boosters = bundle_boosters(current, "current ")
    low, _ = Matrix(spec, valid, base_default(current.meta)).seconds(boosters)
    truth = [o.runtime_s or 0.0 for o in valid]
    return scores("current model", truth, low.tolist()).log_error


def _bundle(spec: FeatureSpec, dataset: Dataset, boosters: tuple[Any, Any],
            config: TrainConfig, result: TrainResult, split: tuple[int, int],
            sample: Matrix, default_s: float | None, rounds: int,
            shift: float) -> ModelBundle:
    p50_text = boosters[0].model_to_string()
    p90_text = boosters[1].model_to_string()
    digest = hashlib.sha256((p50_text + p90_text).encode()).hexdigest()[:10]
    now = time.time()
    check_rows = sample.x[:32]
    raw50, raw90 = predict_log(boosters, check_rows)
    obs = dataset.observations
    meta = {
        "format": FORMAT,
        "schema": SCHEMA,
        "version": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + "-" + digest,
        "trained_at": now,
        "window": {"from": obs[0].published_at, "to": obs[-1].published_at},
        "records": {"used": len(obs), "total": dataset.total, "train": split[0],
                    "valid": split[1], "skipped": dict(dataset.skipped)},
        "feature_names": list(spec.names),
        "kwarg_names": list(spec.kwarg_names),
        "tasks": sorted(spec.tasks, key=spec.tasks.__getitem__),
        "tenants": sorted(spec.tenants, key=spec.tenants.__getitem__),
        "target": "log(runtime_s / base)" if default_s is not None else "log(runtime_s)",
        "quantile": config.quantile,
        "p90": "offset",  # p90 score = p50 score + p90 model score
        "p90_shift": shift,
        "params": {"p50": config.params(config.objective), "p90": config.params("quantile"),
                   "rounds": rounds, "p90_rounds": config.p90_rounds},
        "metrics": {s.name: s.as_dict() for s in result.scores} | {
            "p90_coverage": result.p90_coverage},
        "promotable": result.promotable,
        "check": {
            "rows": [[_json_number(v) for v in row] for row in check_rows.tolist()],
            "raw50": raw50.tolist(),
            "raw90": raw90.tolist(),
        },
    }
    if default_s is not None:
        meta["base"] = {"kind": "history last two", "default_s": default_s}
    return ModelBundle(meta, p50_text, p90_text)


def _json_number(value: float) -> float | None:
    return None if value != value else value
