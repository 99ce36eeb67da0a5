"""The ``features`` and ``predict`` stages of the publish pipeline.

Both only read what the refresher thread prepared (``view.sources``): the compiled model
(:mod:`~celery_aitp.predict.model_source`) and the per-(tenant, task) and per-call
history (:mod:`~celery_aitp.predict.history`). Neither does I/O or calls LightGBM.

Prediction sources, best first (``decision.prediction_source``):

``model``         the current LightGBM model (compiled, cached by feature key), unless
                  the task's live error drifted beyond the bound (``prediction_drift``)
``call_history``  cold start: the same call (this task with the same argument values)
                  ran at least twice: the mean of its last two runs, and the longer one
``size_history``  cold start: the runs of this task's calls whose largest argument is of
                  the same magnitude, when they are reliably shorter than its longest
``history``       cold start: mean of the last two runs of this (tenant, task)
``task_history``  cold start: the same over all tenants of this task
``hint``          the task's declared ``runtime_hint_s`` (p90 = p50)
``None``          nothing known yet: no prediction

A model's output is on a grid of 16 steps per doubling (:func:`~celery_aitp.predict.
compiled.on_grid`, rounded once per cache entry): the decision memo keys on the
prediction, so two tasks whose predictions differ only in the fourth digit would
otherwise each run the pipeline's tail.
"""

from __future__ import annotations

from collections.abc import Callable

from celery_aitp.core.request import MODEL_PREDICTION, Decision, Request, runtime_hint
from celery_aitp.core.view import View
from celery_aitp.predict.drift import DRIFT_SOURCE, EMPTY_DRIFT, DriftSource
from celery_aitp.predict.features import base_of
from celery_aitp.predict.history import (
    EMPTY_HISTORY,
    HISTORY_SOURCE,
    HistorySource,
    HistoryView,
)
from celery_aitp.predict.model_source import MODEL_SOURCE, ModelSource


class FeatureStage:
    """The model's inputs, when a model is in use: its cache key (``decision.feature_key``,
    built straight from the arguments), or the feature vector (``decision.features``) for
    a model whose forests cannot be walked over the key."""

    name = "features"

    def __init__(self, model: ModelSource | None = None,
                 history: HistorySource | None = None) -> None:
        self.sources = (model or ModelSource(), history or HistorySource())

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        sources = view.sources
        model = sources.get(MODEL_SOURCE)
        if model is None or decision.feature_key is not None:
            return  # cold start needs no features; or the caller computed the key
        tenant = decision.tenant
        task = request.task
        history = sources.get(HISTORY_SOURCE, EMPTY_HISTORY).of(tenant, task)
        # the key alone when the model can be walked over it, else the vector
        build = model.request_key or model.spec.vector
        found = build(task, tenant, request.args, request.kwargs, request.args_bytes,
                      request.kwargs_bytes, request.declared.get("runtime_hint_s"),
                      request.retries, request.published_at, history)
        if model.request_key is not None:
            decision.feature_key = found
        else:
            decision.features = found


class PredictStage:
    """Sets ``predicted_runtime_s``, ``predicted_p90_s`` and ``prediction_source``."""

    name = "predict"

    def __init__(self, model: ModelSource | None = None,
                 history: HistorySource | None = None, drift: DriftSource | None = None
                 ) -> None:
        self.sources = (model or ModelSource(), history or HistorySource(),
                        drift or DriftSource())

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        key = decision.feature_key
        model = view.sources.get(MODEL_SOURCE) if key is not None or decision.features else None
        if model is not None and request.task in view.sources.get(
                DRIFT_SOURCE, EMPTY_DRIFT).drifting:
            model = None  # its live error is beyond the bound: history until retrained
            decision.notes.append("prediction_drift")
        if model is not None:
            features = decision.features
            if key is not None and model.request_key is not None:
                p50, p90, _hit = model.compiled.predict_key(key)
            elif features and len(features) == len(model.spec.names):
                p50, p90, _hit = model.compiled.predict(features)
            else:
                model = None
        if model is not None:
            default = model.base_default_s
            if default is not None:  # the model corrects the history estimate
                history = view.sources.get(HISTORY_SOURCE, EMPTY_HISTORY)
                base = base_of(history.of(decision.tenant, request.task), default)
                p50 *= base
                p90 *= base
            decision.predicted_runtime_s = p50
            decision.predicted_p90_s = p90
            decision.prediction_source = MODEL_PREDICTION
            return
        found = cold_start(view.sources.get(HISTORY_SOURCE, EMPTY_HISTORY), request,
                           decision.tenant)
        if found is not None:
            decision.predicted_runtime_s, decision.predicted_p90_s, \
                decision.prediction_source = found


def cold_start(history: HistoryView, request: Request, tenant: str
               ) -> tuple[float, float, str] | None:
    """(p50, p90, source) without a model: the first source in the module's list that
    knows the task (None when none does)."""
    task = request.task
    found = history.of_call(task, request.args, request.kwargs)
    if found is not None:
        return (*found, "call_history")
    found = history.of_class(task, request.args, request.kwargs)
    if found is not None:
        return (*found, "size_history")
    found = history.estimates.get((tenant, task))
    if found is not None:
        return (*found, "history")
    found = history.task_estimates.get(task)
    if found is not None:
        return (*found, "task_history")
    hint = runtime_hint(request.declared)
    return None if hint is None else (hint, hint, "hint")


def prediction_stages(clock: Callable[[], float] | None = None
                      ) -> dict[str, FeatureStage | PredictStage]:
    """Both stages sharing one model source and one history source (``clock``: see
    :class:`HistorySource`)."""
    model, history = ModelSource(), HistorySource(clock=clock)
    return {"features": FeatureStage(model, history),
            "predict": PredictStage(model, history, DriftSource(clock=clock))}
