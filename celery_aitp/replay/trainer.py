"""The runtime-model trainer of a deployment, beside the simulated workers.

A deployment that runs ``celery aitp trainer`` (or its beat task) retrains every few
minutes once enough new runs arrived, and promotes a model only when it beats the
last-two baseline and the model in use on the newest runs. Without it a replay predicts
weeks of a trace with the model it started with, while the users and their jobs change
(public logs: docs/performance.md, trace replay). :class:`SimTrainer` is that trainer on
the simulated clock: it trains on the observations the simulated workers shipped to the
replay's private store and promotes into the same store, which the pipeline's model
source reads at its next refresh.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_aitp.predict.model_store import ModelStore
from celery_aitp.store import RedisStore


@dataclass(frozen=True)
class TrainerSettings:
    """As ``celery aitp trainer``'s options (the same defaults)."""

    every_s: float = 600.0
    min_new: int = 100


class SimTrainer:
    """Trainer rounds on the simulated clock; a worker-side part of the replay's feed."""

    def __init__(self, settings: TrainerSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        self.promoted = 0
        self._new = 0
        self._next = -math.inf

    def add(self, record: Mapping[str, Any]) -> None:
        self._new += 1

    def flush(self, store: RedisStore) -> None:
        """One round when it is due: skipped with fewer than ``min_new`` new runs; the
        model trained on every recorded run is promoted by the trainers' one rule
        (:func:`~celery_aitp.learn.promotion.promotion_refusal`)."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.settings.every_s
        if self._new < self.settings.min_new:
            return
        self._new = 0
        from celery_aitp.learn.observations import store_records
        from celery_aitp.learn.promotion import promotion_refusal
        from celery_aitp.learn.train import train

        result = train(store_records(store))
        models = ModelStore(store)
        if (result.bundle is not None and promotion_refusal(models, result) is None
                and models.promote(result.bundle, unless_pinned=True) is None):
            self.promoted += 1
