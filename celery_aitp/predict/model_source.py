"""The current runtime model, fetched and compiled in the refresher thread.

Each refresh reads only the model version (one HGET). When it changed, the model is
read, compiled and verified, then swapped in for the next publish: producers and workers
pick up a promotion within about one ``refresh_interval_s``, without a restart. A model
that cannot be used is refused with one error line naming the version and the reason;
the previous model (or the cold-start estimate) stays in use.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from celery_aitp.errors import ModelError, StoreError
from celery_aitp.predict.bundle import LoadedModel, load_bundle
from celery_aitp.predict.model_store import ModelStore
from celery_aitp.store import RedisStore

logger = logging.getLogger(__name__)

MODEL_SOURCE = "aitp.model"


class ModelSource:
    """``view.sources['aitp.model']``: a :class:`LoadedModel`, or None before the first."""

    name = MODEL_SOURCE
    initial: LoadedModel | None = None

    def __init__(self) -> None:
        self.refused: dict[str, str] = {}  # version -> reason (kept small: last few)
        self.refusals = 0  # models this process refused (fleet-wide: rejected:model)

    def fetch(self, store: RedisStore, previous: Any) -> LoadedModel | None:
        models = ModelStore(store)
        version = models.version()
        if version is None:
            if previous is not None:
                logger.warning("aitp: runtime model %s withdrawn from the store; "
                               "using cold-start estimates", previous.version)
            return None
        if previous is not None and previous.version == version:
            return previous
        if version in self.refused:
            return previous
        started = time.perf_counter()
        try:
            bundle = models.read()
            if bundle is None:
                return previous
            loaded = load_bundle(bundle)
        except ModelError as exc:
            self._refuse(store, version, str(exc), previous)
            return previous
        except (RecursionError, MemoryError, SyntaxError, OverflowError, ValueError,
                TypeError) as exc:  # what compiling a pathological model can still raise
            self._refuse(store, version, f"cannot compile: {type(exc).__name__}", previous)
            return previous
        logger.info("aitp: runtime model %s in use (%d features, compiled in %.0f ms)",
                    loaded.version, len(loaded.spec.names),
                    (time.perf_counter() - started) * 1000)
        return loaded

    def _refuse(self, store: RedisStore, version: str, reason: str, previous: Any) -> None:
        """Remember, count (once per version, fleet-wide) and log a refused model."""
        if len(self.refused) >= 16:
            self.refused.clear()
        self.refused[version] = reason
        self.refusals += 1
        kept = f"model {previous.version}" if previous is not None else "cold-start estimates"
        logger.error("aitp: refusing runtime model %s: %s; keeping %s", version, reason, kept)
        with contextlib.suppress(StoreError):  # the error line above still says it
            store.add_counts({"rejected:model": 1})
