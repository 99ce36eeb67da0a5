"""The pipeline's background state (``View.sources``) during a replay.

Stages read model, history and usage from sources that, in production, the live view
fetches from the shared store every ``refresh_interval_s``. In a replay the same
sources fetch, on the simulated clock, from a private store that receives the simulated
runs as the workers would record them. Nothing is fetched, and no store is started,
when the pipeline declares no sources.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from celery_aitp.core.view import Source, View
from celery_aitp.store import RedisStore

logger = logging.getLogger(__name__)

StoreFactory = Callable[[], RedisStore]


class WorkerSide(Protocol):
    """What a worker does with each finished run besides the observation record (e.g. the
    run ledger: profiles and observed usage); flushed to the store every refresh."""

    def add(self, record: Mapping[str, Any]) -> None: ...

    def flush(self, store: RedisStore) -> None: ...


Listener = Callable[[View], None]


class SourceFeed:
    """Values of the pipeline's sources, refreshed as simulated time passes."""

    def __init__(self, sources: Sequence[Source], store_factory: StoreFactory | None = None,
                 interval_s: float = 1.0, observation_maxlen: int = 200_000,
                 worker_side: Sequence[WorkerSide] = (),
                 listeners: Sequence[Listener] = ()) -> None:
        self.sources = list(sources)
        self.worker_side = list(worker_side)
        self.listeners = list(listeners)
        self.values: Mapping[str, Any] = MappingProxyType({s.name: s.initial for s in sources})
        self.interval_s = interval_s
        self.observation_maxlen = observation_maxlen
        self.errors = 0
        self._next = -math.inf
        self._pending: list[dict[str, Any]] = []
        self._factory = store_factory
        self._store: RedisStore | None = None

    @property
    def active(self) -> bool:
        return bool(self.sources) and self._factory is not None

    def due(self, now: float) -> bool:
        return self.active and now >= self._next

    def observe(self, record: dict[str, Any]) -> None:
        """A simulated run, as a worker would record it (shipped at the next refresh)."""
        if self.active:
            self._pending.append(record)
            for part in self.worker_side:
                part.add(record)

    def store(self) -> RedisStore:
        if self._store is None:
            assert self._factory is not None
            self._store = self._factory()
        return self._store

    def refresh(self, now: float) -> None:
        """Ship pending runs, then fetch every source (a failing one keeps its value)."""
        self._next = now + self.interval_s
        store = self.store()
        if self._pending:
            store.append_records(store.keys.observations, self._pending,
                                 self.observation_maxlen)
            self._pending = []
        for part in self.worker_side:
            part.flush(store)
        values = dict(self.values)
        for source in self.sources:
            try:
                values[source.name] = source.fetch(store, values[source.name])
            except Exception as exc:  # as the live view: keep the last value, count it
                self.errors += 1
                logger.warning("aitp replay: source %s failed: %r", source.name, exc)
        self.values = MappingProxyType(values)

    def notify(self, view: View) -> None:
        """What the workers' live-view listeners do after a refresh (e.g. follow usage)."""
        for listener in self.listeners:
            listener(view)
