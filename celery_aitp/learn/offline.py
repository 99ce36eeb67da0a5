"""Offline prediction: ``celery-aitp predict --model MODEL --observations FILE.jsonl``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_aitp.extras import require
from celery_aitp.learn.dataset import Observation, Unreadable, attach_history, to_observation
from celery_aitp.learn.train import Matrix, bundle_boosters
from celery_aitp.predict.bundle import ModelBundle, base_default, spec_from_meta


def predict_records(bundle: ModelBundle, records: Iterable[Any]) -> list[dict[str, Any]]:
    """Offline predictions, one dict per record in input order (batch LightGBM predict).

    Records need no ``runtime_s``; those that have one feed the history features of the
    records published after they finished. Unusable records get an ``error`` field.
    """
    require("train", "offline prediction")

    boosters = bundle_boosters(bundle)  # checked before any record is read
    out: list[dict[str, Any]] = []
    usable: list[Observation] = []
    for index, record in enumerate(records):
        if isinstance(record, Unreadable):
            out.append({"error": record.reason})
            continue
        found = to_observation(index, record, need_runtime=False, successful_only=False)
        task_id = record.get("task_id") if isinstance(record, dict) else None
        out.append({"task_id": task_id, "error": found} if isinstance(found, str)
                   else {"task_id": task_id})
        if not isinstance(found, str):
            found.index = len(out) - 1
            usable.append(found)
    ordered = sorted(usable, key=lambda o: (o.published_at, o.index))
    attach_history(ordered)
    if ordered:
        matrix = Matrix(spec_from_meta(bundle.meta), ordered, base_default(bundle.meta))
        low, high = matrix.seconds(boosters)
        for obs, lo, hi in zip(ordered, low.tolist(), high.tolist(), strict=True):
            out[obs.index].update(predicted_runtime_s=lo, predicted_p90_s=hi)
    return out
