"""The publish path's cached view of shared state, refreshed in the background.

Publishing never waits on the store: it reads the last snapshot (live queues, stage,
model version). A daemon thread refreshes it every ``refresh_interval_s`` and, in the
same round, ships buffered counters and records. A snapshot older than
``max_staleness_s`` is reported as not fresh, which makes every routed task fall back.
After ``fork()`` (prefork pool children) the thread is restarted lazily in the child.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from celery_aitp.core.view import EMPTY_SOURCES, Source, View, stage_from_doc
from celery_aitp.errors import StoreError
from celery_aitp.policy import Policy
from celery_aitp.redact import redact
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.buffer import RecordBuffer
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)


Listener = Callable[[View], None]
#: Ships batched state in the refresher round (e.g. a worker's profile samples).
Flusher = Callable[[RedisStore], None]
#: Writes a batch of records to one stream instead of the plain capped append.
Writer = Callable[[list[dict[str, Any]]], Any]


def _forget_in_child(ref: weakref.ReferenceType[LiveView]) -> Callable[[], None]:
    """An at-fork hook that does not keep the LiveView alive."""

    def forget() -> None:
        view = ref()
        if view is not None:
            view._forget_thread()

    return forget


class LiveView:
    """Keeps a fresh-enough View and flushes telemetry, without blocking publishers."""

    def __init__(
        self,
        store: RedisStore,
        policy: Policy,
        counters: Counters,
        refresh_interval_s: float = 1.0,
        max_staleness_s: float = 5.0,
        record_limits: dict[str, int] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.counters = counters
        self.refresh_interval_s = refresh_interval_s
        self.max_staleness_s = max_staleness_s
        self.buffers: dict[str, RecordBuffer] = {}
        self._record_limits = record_limits or {}
        self._listeners: list[Listener] = []
        self._flushers: list[Flusher] = []
        self._writers: dict[str, Writer] = {}
        self._sources: list[Source] = []
        self._view = View(frozenset(), policy.stage, policy.split, fresh=False)
        self._stale: tuple[View, View] | None = None  # (snapshot, its stale twin)
        self._lock = threading.Lock()
        self._running = False  # reset in a forked child, which has no refresher thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._atexit = False
        os.register_at_fork(after_in_child=_forget_in_child(weakref.ref(self)))

    # --- reading ------------------------------------------------------------------

    def current(self) -> View:
        """The latest snapshot; starts the refresher on first use in each process."""
        if not self._running:
            self._start()
        view = self._view
        if view.fresh and time.monotonic() - view.fetched_at > self.max_staleness_s:
            stale = self._stale
            if stale is None or stale[0] is not view:  # one stale twin per snapshot, so
                stale = self._stale = (view, view.stale())  # the decision memo keeps it
            return stale[1]
        return view

    def has_source(self, name: str) -> bool:
        return any(s.name == name for s in self._sources)

    def add_source(self, source: Source) -> None:
        """Fetch ``source`` in every refresh round; its value appears in ``View.sources``."""
        if self.has_source(source.name):
            raise ValueError(f"aitp: a source named {source.name!r} is already registered")
        self._sources.append(source)
        values = dict(self._view.sources)
        values[source.name] = source.initial
        view = self._view
        self._view = View(view.live_queues, view.stage, view.split, view.fresh,
                          view.model_version, view.fetched_at, MappingProxyType(values))

    def put_source(self, source: Source) -> None:
        """Fetch ``source`` from now on, in place of the one with its name if any (a
        pipeline rebuilt for a new policy brings new sources); it keeps that one's
        last value until its first fetch."""
        for i, old in enumerate(self._sources):
            if old.name == source.name:
                self._sources[i] = source
                return
        self.add_source(source)

    def on_refresh(self, listener: Listener) -> None:
        """Call ``listener(view)`` after every successful refresh (e.g. model reload).

        Registering the same listener again does nothing.
        """
        if listener not in self._listeners:
            self._listeners.append(listener)

    def add_flusher(self, flusher: Flusher) -> None:
        """Call ``flusher(store)`` in every flush; it keeps its batch if it raises."""
        self._flushers.append(flusher)

    def set_writer(self, stream: str, writer: Writer) -> None:
        """Write ``stream``'s records with ``writer(records)`` (it raises StoreError)."""
        self._writers[stream] = writer

    def buffer(self, stream: str) -> RecordBuffer:
        """The record buffer feeding a store stream (created on first use)."""
        buf = self.buffers.get(stream)
        if buf is None:
            buf = self.buffers.setdefault(stream, RecordBuffer(stream, self.counters))
        return buf

    # --- refreshing ---------------------------------------------------------------

    def refresh(self) -> bool:
        """One round: fetch the snapshot, ship telemetry. True if the store answered."""
        try:
            live, stage_doc, version = self.store.snapshot()
        except StoreError as exc:
            self.counters.incr("store_errors")
            logger.debug("aitp: store refresh failed: %s", redact(exc))
            return False
        stage, split = stage_from_doc(stage_doc, self.policy, self.counters)
        sources = self._fetch_sources()
        self._view = View(live, stage, split, True, version, time.monotonic(), sources)
        for listener in self._listeners:
            try:
                listener(self._view)
            except Exception:  # a listener must never stop the refresher
                logger.exception("aitp: refresh listener failed")
        self.flush()
        return True

    def _fetch_sources(self) -> Mapping[str, Any]:
        """Fetch every source; one that fails keeps its previous value (and is counted)."""
        if not self._sources:
            return EMPTY_SOURCES
        previous = self._view.sources
        values: dict[str, Any] = {}
        for source in self._sources:
            old = previous.get(source.name, source.initial)
            try:
                values[source.name] = source.fetch(self.store, old)
            except Exception as exc:  # a broken source must not stop the refresher
                self.counters.incr(f"source_errors:{source.name}")
                logger.warning("aitp: source %s failed, keeping its last value: %s",
                               source.name, redact(repr(exc)))
                values[source.name] = old
        return MappingProxyType(values)

    def flush(self) -> None:
        """Ship pending counters and records; keep them for next time if the store fails."""
        counts = self.counters.drain()
        try:
            self.store.add_counts(counts)
        except StoreError:
            self.counters.restore(counts)
            return
        for flusher in self._flushers:
            try:
                flusher(self.store)
            except StoreError:
                return
            except Exception:  # a broken flusher must not stop the others or the refresher
                self.counters.incr("flush_errors")
                logger.exception("aitp: flusher failed")
        for stream, buf in list(self.buffers.items()):
            records = buf.take()
            if not records:
                continue
            writer = self._writers.get(stream)
            try:
                if writer is not None:
                    writer(records)
                else:
                    self.store.append_records(stream, records,
                                              self._record_limits.get(stream, 100_000))
            except StoreError:
                buf.put_back(records)
                return

    def _forget_thread(self) -> None:
        self._running = False
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._running = True
            self._stop = threading.Event()
            try:
                self.refresh()  # one synchronous round so the first publish sees real state
            except Exception:  # the thread below must start whatever the store holds
                logger.exception("aitp: first refresh round failed")
            self._thread = threading.Thread(target=self._run, name="aitp-live-view", daemon=True)
            self._thread.start()
            if not self._atexit:
                atexit.register(self.flush)  # ship the last counters and records at exit
                self._atexit = True

    def _run(self) -> None:
        stop = self._stop
        while not stop.wait(self.refresh_interval_s):
            try:
                self.refresh()
            except Exception:  # never let the refresher die
                logger.exception("aitp: refresher round failed")

    def close(self) -> None:
        """Stop the refresher and ship what is pending (best effort)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.flush()
        self._running = False
