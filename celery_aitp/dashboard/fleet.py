"""One consistent reading of the fleet, shared by every page, API call and scrape.

Reads the store (workers, live queues, stage, counters, model metadata, the ``obs`` and
``decisions`` streams) and the broker's queue depths through the
:class:`~celery_aitp.ports.QueueOps` port, at most once every ``refresh_s`` however many
browsers and scrapers ask. It only reads; the one write (the stage) is in
:mod:`stage_control`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from celery_aitp.core.view import stage_from_doc
from celery_aitp.dashboard.labels import Bounds
from celery_aitp.dashboard.streams import StreamTail
from celery_aitp.dashboard.totals import RunTotals
from celery_aitp.errors import StoreError
from celery_aitp.layout import Layout, PerTierLayout, physical_groups
from celery_aitp.numbers import finite_number
from celery_aitp.policy import Policy
from celery_aitp.queues import parse_tier_queue, policy_queues
from celery_aitp.redact import redact
from celery_aitp.scheduling.spill import read_capacity
from celery_aitp.scheduling.usage import read_usage
from celery_aitp.store import RedisStore

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 60.0
MAX_RECENT = 5000
MAX_MODEL_FIELD = 65536
#: Small fields of the model hash; the model texts (p50, p90, ...) are never read here.
MODEL_FIELDS = ("version", "meta", "trained_at")


@dataclass(frozen=True)
class Snapshot:
    """What the fleet looked like at ``at`` (epoch seconds)."""

    at: float
    store_ok: bool = False
    store_error: str | None = None
    #: When the store-derived fields (everything but the broker's) were read: ``at`` when
    #: the store answered, earlier while it is down (they are the last reading), None
    #: before any.
    store_read_at: float | None = None
    broker_ok: bool = False
    broker_error: str | None = None
    stage: str = "coexistence"
    split: dict[str, Any] = field(default_factory=dict)
    stage_history: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    live_queues: frozenset[str] = frozenset()
    counters: dict[str, int] = field(default_factory=dict)
    window_counters: dict[str, int] = field(default_factory=dict)
    decisions_per_s: float | None = None
    rate_history: list[tuple[float, float]] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    queues: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    fair_share: dict[str, Any] = field(default_factory=dict)
    #: The producers' spill view: saturated tier queues (backlog per slot), the
    #: standard workers' class and idle slots (scheduling/spill.py).
    spill: dict[str, Any] = field(default_factory=dict)

    @property
    def workers_read_at(self) -> float:
        """When the workers were read, and so when their liveness is judged: during a
        store outage no heartbeat arrives, and the last reading stands."""
        return self.at if self.store_read_at is None else self.store_read_at


def decisions_total(counts: Mapping[str, int]) -> int:
    return sum(n for k, n in counts.items() if k.startswith("decisions:"))


class CounterHistory:
    """Samples of the fleet counters, for rates and windowed shares."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, dict[str, int]]] = deque()

    def add(self, at: float, counts: dict[str, int]) -> None:
        self.samples.append((at, counts))
        while len(self.samples) > 2 and self.samples[1][0] < at - self.window_s:
            self.samples.popleft()

    def window_delta(self) -> dict[str, int]:
        """Counts added over the window (all counts if there is only one sample)."""
        if not self.samples:
            return {}
        (_, first), (_, last) = self.samples[0], self.samples[-1]
        if len(self.samples) == 1:
            return dict(last)
        delta = {k: n - first.get(k, 0) for k, n in last.items()}
        if any(v < 0 for v in delta.values()):  # the counters hash was reset
            return dict(last)
        return {k: v for k, v in delta.items() if v}

    def rate(self, span_s: float = RATE_WINDOW_S) -> float | None:
        """Decisions per second over the last ``span_s`` (None before two samples)."""
        if len(self.samples) < 2:
            return None
        t1, last = self.samples[-1]
        base = next(s for s in self.samples if s[0] >= t1 - span_s)
        if base is self.samples[-1]:
            base = self.samples[-2]
        t0, first = base
        if t1 <= t0:
            return None
        return max(0.0, (decisions_total(last) - decisions_total(first)) / (t1 - t0))

    def history(self) -> list[tuple[float, float]]:
        """(time, decisions per second) between consecutive samples."""
        out = []
        items = list(self.samples)
        for (t0, a), (t1, b) in zip(items, items[1:], strict=False):
            if t1 > t0:
                out.append((t1, max(0.0, (decisions_total(b) - decisions_total(a)) / (t1 - t0))))
        return out


def recorded_rate(tail: StreamTail, now: float, span_s: float = RATE_WINDOW_S) -> float | None:
    """Decisions per second from the decision records of the last ``span_s``.

    Used only before two counter samples exist (a fresh dashboard, a first scrape); the
    records may be sampled or capped, the counters are not, so counters win afterwards.
    """
    recent = [at for at, _ in tail.recent if at >= now - span_s]
    return len(recent) / span_s


def read_model(client: Any, key: str, now: float) -> dict[str, Any]:
    """Model metadata from the store's model hash; never the model text (it can be MBs)."""
    pipe = client.pipeline(transaction=False)
    pipe.hmget(key, list(MODEL_FIELDS))
    pipe.hlen(key)
    values, n_fields = pipe.execute()
    info: dict[str, Any] = {}
    for name, value in zip(MODEL_FIELDS, values, strict=True):
        if value is None or len(value) > MAX_MODEL_FIELD:
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        try:
            info[name] = json.loads(text) if name != "version" else text
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            info[name] = text
    meta: dict[str, Any] = info["meta"] if isinstance(info.get("meta"), dict) else {}
    version = info.get("version", meta.get("version"))
    trained_at = info.get("trained_at", meta.get("trained_at"))
    trained = finite_number(trained_at)
    return {
        "loaded": version is not None,
        "version": None if version is None else str(version),
        "trained_at": trained,
        "age_s": None if trained is None else max(0.0, now - trained),
        "meta": {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool, dict))},
        "fields": int(n_fields or 0),
    }


#: How old a snapshot a request may be answered with while a newer one is built in the
#: background (the dashboard's; ``Fleet``'s own default, 0, builds in the request).
STALE_S = 30.0


class Fleet:
    """Caches one Snapshot for ``refresh_s``; thread-safe (Starlette runs sync handlers in
    a thread pool).

    With ``stale_s`` above ``refresh_s``, a request that finds the snapshot older than
    ``refresh_s`` (but younger than ``stale_s``) is answered from it at once while one
    background thread builds the next: with thousands of tenants a build reads the
    usage of every tenant and the streams' new records, and no page or scrape waits for
    it. Only the first snapshot (see :meth:`warm`), one past ``stale_s`` and an explicit
    ``max_age_s`` (after a stage change) are built in the request.
    """

    def __init__(self, store: RedisStore, policy: Policy, default_queue: str,
                 queue_ops: Callable[[], Any], worker_ttl_s: float, refresh_s: float = 2.0,
                 window_s: float = 300.0, tasks: tuple[str, ...] = (),
                 clock: Callable[[], float] = time.time, layout: Layout | None = None,
                 stale_s: float = 0.0, follow: Callable[[], Policy] | None = None) -> None:
        self.store = store
        #: The policy to show now (the fleet's applied one), asked on every build.
        self._follow = follow
        self._tasks = tasks
        self.layout = layout or PerTierLayout()  # where tier queues wait on the broker
        self.policy = policy
        self.default_queue = default_queue
        self.worker_ttl_s = worker_ttl_s
        self.refresh_s = refresh_s
        self.stale_s = stale_s
        self.window_s = window_s
        self.clock = clock
        self.bounds = Bounds(policy, tasks)
        self.totals = RunTotals(self.bounds, {t.name: t.sla_s for t in policy.tiers})
        self.history = CounterHistory(max(window_s, RATE_WINDOW_S))
        keys = store.keys
        self.obs = StreamTail(store.client, keys.observations, window_s, MAX_RECENT)
        self.decisions = StreamTail(store.client, keys.decisions, window_s, MAX_RECENT)
        self._queue_ops_factory = queue_ops
        self._queue_ops: Any = None
        self._lock = threading.Lock()  # held by whoever builds a snapshot
        self._snapshot: Snapshot | None = None
        #: Background builds started (a stale snapshot answered meanwhile).
        self.background_builds = 0
        self.known_queues = [default_queue] + policy_queues(policy)
        self._known_set = frozenset(self.known_queues)

    def follow_policy(self) -> None:
        """Show the policy ``follow`` gives (the one applied to the fleet) if it changed:
        its tenants, tiers' SLAs and queues. Label values seen so far keep their series."""
        if self._follow is None:
            return
        try:
            policy = self._follow()
        except Exception as exc:  # never a reason not to show the rest
            logger.warning("aitp dashboard: could not read the applied policy: %s",
                           redact(repr(exc)))
            return
        if policy is self.policy:
            return
        bounds = Bounds(policy, self._tasks)
        bounds.carry_over(self.bounds)
        self.bounds = bounds
        self.totals.follow(bounds, {t.name: t.sla_s for t in policy.tiers})
        self.known_queues = [self.default_queue] + policy_queues(policy)
        self._known_set = frozenset(self.known_queues)
        self.policy = policy

    def snapshot(self, max_age_s: float | None = None) -> Snapshot:
        """The cached snapshot if younger than ``max_age_s`` (default ``refresh_s``)."""
        limit = self.refresh_s if max_age_s is None else max_age_s
        current = self._snapshot
        if current is not None:
            age = self.clock() - current.at
            if age < limit:
                return current
            if max_age_s is None and age < self.stale_s:
                self.refresh_in_background()
                return current
        with self._lock:
            current = self._snapshot
            if current is None or self.clock() - current.at >= limit:
                current = self._build()
                self._snapshot = current
            return current

    def refresh_in_background(self) -> bool:
        """Build the next snapshot in a daemon thread unless one is being built; whether
        this call started one."""
        if not self._lock.acquire(blocking=False):
            return False  # a build is running: its snapshot comes soon enough
        self.background_builds += 1
        try:
            threading.Thread(target=self._build_locked, name="aitp-dashboard-snapshot",
                             daemon=True).start()
        except BaseException:
            self._lock.release()
            raise
        return True

    def warm(self) -> None:
        """Start building the first snapshot (a server calls it as it starts), so that
        the first page or scrape finds it built, or waits only for the rest of it."""
        if self._snapshot is None:
            self.refresh_in_background()

    def _build_locked(self) -> None:
        try:
            self._snapshot = self._build()
        except Exception as exc:  # pragma: no cover - _build reports store errors itself
            logger.warning("aitp dashboard: snapshot failed: %s", redact(repr(exc)))
        finally:
            self._lock.release()

    def _build(self) -> Snapshot:
        self.follow_policy()
        now = self.clock()
        try:
            base = self._read_store(now)
        except StoreError as exc:
            # the store's side stays its last reading (store_read_at says when), but the
            # broker is read all the same: while the store is down every task falls back
            # to the default queue, and its depth is what an operator needs to see
            previous = self._snapshot or Snapshot(at=now)
            base = replace(previous, at=now, store_ok=False, store_error=redact(exc),
                           decisions_per_s=None)
        return self._with_queues(base, now)

    def _read_store(self, now: float) -> Snapshot:
        store = self.store
        stage, split = stage_from_doc(store.read_stage(), self.policy)
        counts = store.counts()
        self.history.add(now, counts)
        self.totals.add(self.obs.poll(now))
        self.decisions.poll(now)
        try:
            model = read_model(store.client, store.keys.model, now)
        except Exception as exc:  # a malformed model hash must not hide the rest
            model = {"loaded": False, "error": redact(f"{type(exc).__name__}: {exc}")}
        try:  # the scheduler's own fair-share view: the same Jain and entropy it acts on
            fair_share = read_usage(store, self.policy, now).as_dict()
        except Exception as exc:  # malformed usage entries must not hide the rest
            fair_share = {"error": redact(f"{type(exc).__name__}: {exc}")}
        try:
            spill = read_capacity(store, self.policy.spill).as_dict() \
                if self.policy.spill.enabled else {}
        except Exception as exc:  # malformed reports must not hide the rest
            spill = {"error": redact(f"{type(exc).__name__}: {exc}")}
        return Snapshot(
            at=now, store_ok=True, store_read_at=now, stage=stage.value,
            split=split.model_dump(mode="json"),
            stage_history=store.stage_history(20), workers=self._workers(store, now),
            live_queues=store.live_queues(), counters=counts,
            window_counters=self.history.window_delta(),
            decisions_per_s=self.history.rate() if len(self.history.samples) > 1
            else recorded_rate(self.decisions, now),
            rate_history=self.history.history(), model=model,
            observations=self.obs.records(), decisions=self.decisions.records(),
            fair_share=fair_share, spill=spill,
        )

    @staticmethod
    def _workers(store: RedisStore, now: float) -> list[dict[str, Any]]:
        """The worker documents, heartbeats moved from the store server's clock (which
        writes them) to this dashboard's (``now``, which judges their age)."""
        server_now, docs = store.workers_at()
        offset = now - server_now
        return [{**doc, "heartbeat": doc["heartbeat"] + offset} for doc in docs]

    def queue_ops(self) -> Any:
        if self._queue_ops is None:
            self._queue_ops = self._queue_ops_factory()
        return self._queue_ops

    def _with_queues(self, snap: Snapshot, now: float) -> Snapshot:
        known = self._known_set
        names = self.known_queues + sorted(q for q in snap.live_queues if q not in known)
        # one row per broker queue: on RabbitMQ all tiers of a tenant and accelerator
        # wait in one queue, and only its depth is known
        groups = physical_groups(self.layout, names)
        alive: dict[str, list[str]] = {}  # queue -> live workers serving it, built once
        for worker in snap.workers:  # alive as last read (an outage orphans no queue)
            if snap.workers_read_at - float(worker.get("heartbeat") or 0) <= self.worker_ttl_s:
                queues = list(worker.get("queues") or ())
                if worker.get("default_queue") is True:  # advertised as a flag, not a queue
                    queues.append(self.default_queue)
                for queue in queues:
                    alive.setdefault(queue, []).append(str(worker.get("worker")))
        try:
            ops = self.queue_ops()
            depths = ops.depths(list(groups))
            ages = ops.oldest_ages([q for q in groups if depths.get(q)], now)
        except Exception as exc:  # any adapter failure: show the rest, report the broker
            self._queue_ops = None  # try a fresh adapter next round
            rows = [self._queue_row(q, held, None, None, alive, snap.live_queues)
                    for q, held in groups.items()]
            return replace(snap, queues=rows, broker_ok=False,
                           broker_error=redact(f"{type(exc).__name__}: {exc}"))
        rows = [self._queue_row(q, held, depths.get(q), ages.get(q), alive, snap.live_queues)
                for q, held in groups.items()]
        backlog = snap.spill.get("backlog_per_slot") or {}
        for row, held in zip(rows, groups.values(), strict=True):
            spilling = [backlog[q] for q in held if q in backlog]
            row["spilling"] = max(spilling) if spilling else None  # waiting per slot
        return replace(snap, queues=rows, broker_ok=True)

    def _queue_row(self, name: str, held: list[str], depth: int | None, age: float | None,
                   alive: Mapping[str, list[str]], live: frozenset[str]) -> dict[str, Any]:
        """A broker queue ``name`` holding the (logical) queues ``held``; ``alive``: queue
        -> the live workers serving it."""
        parts = parse_tier_queue(held[0])
        is_default = name == self.default_queue
        consumers = sorted({w for q in held for w in alive.get(q, ())})
        served = any(q in live for q in held)
        return {
            "queue": name,
            "kind": "default" if is_default else ("tier" if parts else "other"),
            "tenant": parts[0] if parts else None,
            "accelerator": parts[1] if parts else None,
            "tier": parts[2] if parts and held == [name] else None,  # None: every tier
            "depth": depth,
            "oldest_age_s": age,
            "consumers": consumers,
            "live": served if parts else None,  # the default queue's consumers are unknown
            "orphaned": bool(parts) and not served and bool(depth),
        }

    def close(self) -> None:
        if self._queue_ops is not None:
            self._queue_ops.close()
