"""Recent runtimes per (tenant, task): the history features and the cold-start estimate.

Workers keep a small summary in the store, so producers never scan the observation
stream. Layout:

``<prefix>:history`` (hash)          field ``<tenant>|<task>`` -> ``<count>;<r1>,<r2>,...``
                                     (total runs seen; the newest runtimes first, at most
                                     :data:`HISTORY_DEPTH`; at most ``MAX_PAIRS`` fields);
                                     field ``<tenant>|`` (no task): the tenant's runs of
                                     any task, the same way
``<prefix>:history:classes`` (hash)  field ``<magnitude class>|<task>``: the same over every
                                     tenant's runs of the task whose largest argument is of
                                     that magnitude (:func:`~celery_aitp.predict.features.
                                     magnitude_class`; at most ``MAX_PAIRS`` fields)
``<prefix>:history:calls`` (hash)    field ``<call signature>|<task>``: the same (the last
                                     two runtimes) over every tenant's runs of the task
                                     with the same argument values (:func:`~celery_aitp.
                                     predict.features.call_signature`); when it holds
                                     ``MAX_CALLS`` fields it becomes ``...:calls:old`` and
                                     a new one starts (a call's entry moves over at its
                                     next run), so memory stays bounded while the calls
                                     still repeating keep their history
``<prefix>:history:version``         incremented on every update

Workers buffer finished runs and add them in one script call per refresh round.
Producers re-read the hash in the refresher thread when the version moved, at most every
:data:`FETCH_INTERVAL_S`; the publish path only looks values up.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import redis

from celery_aitp.errors import StoreError
from celery_aitp.predict.features import (
    HISTORY_DEPTH,
    History,
    argument_features,
    call_signature,
    history_features,
    magnitude_class,
)
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)

HISTORY_SOURCE = "aitp.history"
#: Distinct (tenant, task) pairs the summary holds; runs of further pairs are not kept.
MAX_PAIRS = 10_000
#: Calls one generation of ``history:calls`` holds (two generations are kept).
MAX_CALLS = 10_000
#: Runtimes kept per call: its estimate needs the last two.
CALL_DEPTH = 2
#: Producers re-read the summary at most this often (seconds).
FETCH_INTERVAL_S = 2.0
#: Runs a worker process buffers between two flushes before dropping the oldest.
SINK_CAPACITY = 10_000

#: Runs of one magnitude class of a task before its own bound is used (:class:`HistoryView`).
MIN_CLASS_RUNS = 5
#: A class's bound is used only when at most this share of the task's bound: a class that
#: does not separate short calls from long ones (an id, a flag) leaves the task's.
CLASS_BOUND_SHARE = 0.5

Pair = tuple[str, str]
Estimate = tuple[float, float]
#: (task, magnitude class).
SizeClass = tuple[str, int]
#: (task, call signature).
Call = tuple[str, str]


class Run(NamedTuple):
    """A finished run as the summary keeps it."""

    tenant: str
    task: str
    runtime_s: float
    #: :func:`~celery_aitp.predict.features.magnitude_class` of its arguments.
    magnitude: int | None = None
    #: :func:`~celery_aitp.predict.features.call_signature` of its arguments.
    call: str | None = None

_ADD_RUNS = """
-- KEYS: 1 pairs, 2 version, 3 magnitude classes, 4 calls, 5 the calls' older generation
-- ARGV: depth, max pairs, call depth, max calls, then (key number, field, runtime) per run
local depth = tonumber(ARGV[1])
local max_pairs = tonumber(ARGV[2])
local call_depth = tonumber(ARGV[3])
local max_calls = tonumber(ARGV[4])
local refused = 0
for i = 5, #ARGV, 3 do
  local which = tonumber(ARGV[i])
  local key, field, runtime = KEYS[which], ARGV[i + 1], ARGV[i + 2]
  local current = redis.call('HGET', key, field)
  local keep = depth
  if which == 4 then
    keep = call_depth
    if not current then
      current = redis.call('HGET', KEYS[5], field)
      if redis.call('HLEN', key) >= max_calls then
        redis.call('RENAME', key, KEYS[5])
      end
    end
  end
  if current then
    local count, rest = string.match(current, '^(%d+);(.*)$')
    local kept, n = {runtime}, 1
    for value in string.gmatch(rest or '', '[^,]+') do
      if n >= keep then break end
      n = n + 1
      kept[n] = value
    end
    redis.call('HSET', key, field, (tonumber(count or 0) + 1) .. ';' .. table.concat(kept, ','))
  elseif which == 4 or redis.call('HLEN', key) < max_pairs then
    redis.call('HSET', key, field, '1;' .. runtime)
  else
    refused = refused + 1
  end
end
redis.call('INCR', KEYS[2])
return refused
"""


def pair_field(tenant: str, task: str) -> str:
    """Hash field of a pair; tenant names never contain '|' (policy names). An empty
    task (no Celery task has an empty name) is the tenant's field."""
    return f"{tenant}|{task}"


#: The task part of a tenant's own history field.
ANY_TASK = ""


def class_field(task: str, magnitude: int) -> str:
    """Hash field of a task's magnitude class (``<class>|<task>``: the class never holds
    a '|', so the first one splits)."""
    return f"{magnitude}|{task}"


def call_field(task: str, signature: str) -> str:
    """Hash field of a call (``<signature>|<task>``: a signature is hex digits)."""
    return f"{signature}|{task}"


def parse_entry(raw: Any) -> tuple[int, list[float]] | None:
    """(count, newest-first runtimes) of one hash value; None if malformed."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    count_text, sep, rest = text.partition(";")
    if not sep:
        return None
    try:
        count = int(count_text)
        runtimes = [float(v) for v in rest.split(",") if v]
    except ValueError:
        return None
    runtimes = [r for r in runtimes if 0 <= r < math.inf][:HISTORY_DEPTH]  # no NaN/inf
    return (count, runtimes) if runtimes else None


def quantile(values: Iterable[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty sample."""
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))
    return ordered[rank]


def estimate(runtimes: list[float]) -> Estimate:
    """Cold-start (p50, p90): mean of the last two runs, and the longest recent run.

    The upper bound is the longest of the recent runs, not their 90th percentile: a history
    cannot tell one call of a task from another, so its bound must hold for any of them.
    For a task whose calls take 30 ms or 1 s, a percentile of the last 20 runs swings
    between the two with the luck of the window, which put random calls ahead of others
    (worse than FIFO in the placement benchmark); the longest run keeps them all in one
    size class, in arrival order, until a model tells them apart.

    :class:`HistoryView` replaces this upper bound by the task's *held* bound: the
    longest recent run of the task over *every* tenant (the history knows no more about
    one tenant's call than about another's: a bound per tenant put equal calls of two
    tenants in different size classes), held and let down only slowly
    (:data:`BOUND_HALF_LIFE_S`). The longest of the last runs of a heavy-tailed task swings
    with the luck of the window (0.3 s for a while, then 3 s), and calls of the same task
    then took a high tier at one moment and a low one the next, the later ones ahead of
    the earlier: cold start worse than FIFO.
    """
    last2 = runtimes[:2]
    p50 = sum(last2) / len(last2)
    return p50, max(runtimes)


#: Half-life (seconds) of a task's held cold-start upper bound once its runs got shorter.
BOUND_HALF_LIFE_S = 600.0


def held_bound(longest: float, previous: tuple[float, float] | None, now: float) -> float:
    """A task's cold-start upper bound at ``now``: its longest recent run, or the bound
    it had (``previous``: value, when) decayed with :data:`BOUND_HALF_LIFE_S` if higher."""
    if previous is None:
        return longest
    value, at = previous
    return max(longest, value * 0.5 ** (max(0.0, now - at) / BOUND_HALF_LIFE_S))


def _class_estimates(classes: Mapping[SizeClass, tuple[int, list[float]]],
                     task_bounds: Mapping[str, float],
                     held: Mapping[SizeClass, tuple[float, float]], now: float
                     ) -> tuple[dict[SizeClass, tuple[float, float]], dict[SizeClass, Estimate]]:
    """Each class's held bound, and the estimates of the classes worth using: at least
    :data:`MIN_CLASS_RUNS` runs, and a bound at most :data:`CLASS_BOUND_SHARE` of the
    task's (the calls of the class are reliably shorter than the task's longest)."""
    bounds: dict[SizeClass, tuple[float, float]] = {}
    estimates: dict[SizeClass, Estimate] = {}
    for size_class, (_, runtimes) in classes.items():
        bound = held_bound(max(runtimes), held.get(size_class), now)
        bounds[size_class] = (bound, now)
        task_bound = task_bounds.get(size_class[0])
        if (len(runtimes) >= MIN_CLASS_RUNS  # recent runs kept (never more than seen)
                and task_bound is not None and bound <= CLASS_BOUND_SHARE * task_bound):
            estimates[size_class] = (estimate(runtimes)[0], bound)
    return bounds, estimates


def _pooled(runtimes: list[float]) -> Estimate:
    """A task's estimate over all tenants: mean and p90 of each tenant's last two runs."""
    p50 = sum(runtimes) / len(runtimes)
    return p50, max(p50, quantile(runtimes, 0.9))


class HistoryView:
    """What the publish path reads: features and estimates per pair, estimates per task."""

    __slots__ = ("features", "tenant_features", "estimates", "task_estimates", "version",
                 "fetched_at", "bounds", "class_estimates", "class_bounds", "classed",
                 "call_estimates", "called")

    def __init__(self, features: Mapping[Pair, History] | None = None,
                 estimates: Mapping[Pair, Estimate] | None = None,
                 task_estimates: Mapping[str, Estimate] | None = None,
                 version: int | None = None, fetched_at: float = 0.0,
                 tenant_features: Mapping[str, History] | None = None,
                 bounds: Mapping[str, tuple[float, float]] | None = None,
                 class_estimates: Mapping[SizeClass, Estimate] | None = None,
                 class_bounds: Mapping[SizeClass, tuple[float, float]] | None = None,
                 call_estimates: Mapping[Call, Estimate] | None = None) -> None:
        self.features = dict(features or {})
        #: Per (task, call signature) of a call that ran at least twice, the estimate of
        #: its last two runs (:meth:`of_call`).
        self.call_estimates = dict(call_estimates or {})
        #: The tasks that have such a call: the publish path signs only their calls (a
        #: task whose calls never repeat, one id per call, pays nothing).
        self.called = frozenset(task for task, _ in self.call_estimates)
        #: Per task, the cold-start upper bound and when it was computed (held_bound).
        self.bounds = dict(bounds or {})
        #: Per (task, magnitude class) that tells its calls apart from the task's longest:
        #: mean of the last two runs and the class's held bound (:meth:`of_class`).
        self.class_estimates = dict(class_estimates or {})
        #: Per (task, magnitude class), its held bound, whether used or not.
        self.class_bounds = dict(class_bounds or {})
        #: The tasks that have a class estimate (the publish path sizes only their calls).
        self.classed = frozenset(task for task, _ in self.class_estimates)
        #: History features of a tenant's first run of a task (its other tasks' runs).
        self.tenant_features = dict(tenant_features or {})
        self.estimates = dict(estimates or {})
        self.task_estimates = dict(task_estimates or {})
        self.version = version
        self.fetched_at = fetched_at

    @classmethod
    def from_entries(cls, entries: Mapping[Pair, tuple[int, list[float]]],
                     version: int | None = None,
                     fetched_at: float | None = None,
                     previous: HistoryView | None = None,
                     classes: Mapping[SizeClass, tuple[int, list[float]]] | None = None,
                     calls: Mapping[Call, tuple[int, list[float]]] | None = None
                     ) -> HistoryView:
        """``previous``: the view before, whose bounds (of tasks and of magnitude classes)
        are held (a bound is let down slowly); ``classes``: the magnitude classes'
        entries; ``calls``: the calls' entries."""
        held = previous.bounds if previous is not None else {}
        now = time.monotonic() if fetched_at is None else fetched_at
        features, estimates = {}, {}
        per_task: dict[str, list[float]] = {}
        longest: dict[str, float] = {}  # per task, over every tenant's recent runs
        tenants = {pair[0]: runtimes for pair, (_, runtimes) in entries.items()
                   if pair[1] == ANY_TASK}
        for pair, (_, runtimes) in entries.items():
            if pair[1] != ANY_TASK:
                longest[pair[1]] = max(longest.get(pair[1], 0.0), max(runtimes))
        longest = {task: held_bound(value, held.get(task), now)
                   for task, value in longest.items()}
        for pair, (count, runtimes) in entries.items():
            if pair[1] == ANY_TASK:
                continue
            features[pair] = history_features(runtimes, count, tenants.get(pair[0], ()))
            estimates[pair] = (estimate(runtimes)[0], longest[pair[1]])
            per_task.setdefault(pair[1], []).extend(runtimes[:2])
        task_estimates = {task: (_pooled(rs)[0], longest[task])
                          for task, rs in per_task.items()}
        tenant_features = {tenant: history_features((), 0, runtimes)
                           for tenant, runtimes in tenants.items()}
        class_bounds, class_estimates = _class_estimates(
            classes or {}, longest, previous.class_bounds if previous else {}, now)
        return cls(features, estimates, task_estimates, version, now, tenant_features,
                   {task: (value, now) for task, value in longest.items()},
                   class_estimates, class_bounds,
                   {call: estimate(runtimes) for call, (_, runtimes) in (calls or {}).items()
                    if len(runtimes) >= 2})

    def of_class(self, task: str, args: Any, kwargs: Any) -> Estimate | None:
        """The cold-start estimate of a call from the runs of its task's calls of the same
        magnitude (None: the class has too few runs, or does not tell its calls apart)."""
        if task not in self.classed:
            return None
        magnitude = magnitude_class(args, kwargs)
        return None if magnitude is None else self.class_estimates.get((task, magnitude))

    def of_call(self, task: str, args: Any, kwargs: Any) -> Estimate | None:
        """The cold-start estimate of a call that ran at least twice, from its own last two
        runs (:func:`estimate`; None otherwise).

        The task's held bound exists because its history cannot tell one call from
        another; the runs of the same call can, so a call's own runs bound it."""
        if task not in self.called:
            return None
        return self.call_estimates.get((task, call_signature(argument_features(args,
                                                                                kwargs))))

    def of(self, tenant: str, task: str) -> History | None:
        """The history tuple of a task about to be published (None: nothing known)."""
        found = self.features.get((tenant, task))
        return found if found is not None else self.tenant_features.get(tenant)


EMPTY_HISTORY = HistoryView()


class HistoryStore:
    """The summary's store operations (one round trip each)."""

    def __init__(self, store: RedisStore, max_pairs: int = MAX_PAIRS,
                 max_calls: int = MAX_CALLS) -> None:
        self.client = store.client
        self.key = store.keys.any("history")
        self.version_key = store.keys.any("history", "version")
        self.classes_key = store.keys.any("history", "classes")
        self.calls_key = store.keys.any("history", "calls")
        self.old_calls_key = store.keys.any("history", "calls", "old")
        self.max_pairs = max_pairs
        self.max_calls = max_calls
        self._script = self.client.register_script(_ADD_RUNS)

    def add_runs(self, runs: Iterable[tuple[str, str, float] | Run]) -> int:
        """Add finished runs (``(tenant, task, runtime)``, or a :class:`Run` with its
        magnitude class and call signature); returns how many were refused because the
        summary is full."""
        args: list[Any] = [HISTORY_DEPTH, self.max_pairs, CALL_DEPTH, self.max_calls]
        for run in runs:
            tenant, task, runtime = run[0], run[1], run[2]
            text = f"{runtime:.6g}"
            # (which of KEYS, field, runtime)
            args.extend((1, pair_field(tenant, task), text,
                         1, pair_field(tenant, ANY_TASK), text))
            magnitude = run[3] if len(run) > 3 else None
            if magnitude is not None:
                args.extend((3, class_field(task, magnitude), text))
            call = run[4] if len(run) > 4 else None
            if call is not None:
                args.extend((4, call_field(task, call), text))
        if len(args) == 4:
            return 0
        keys = [self.key, self.version_key, self.classes_key, self.calls_key,
                self.old_calls_key]
        try:
            return int(self._script(keys=keys, args=args))
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc

    def version(self) -> int | None:
        try:
            raw = self.client.get(self.version_key)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        try:
            return int(raw) if raw else None
        except ValueError:  # not written by INCR: as if there were no summary
            return None

    def read(self) -> dict[Pair, tuple[int, list[float]]]:
        """The pairs' entries, by (tenant, task)."""
        return {(tenant, task): entry for tenant, task, entry in self._entries(self.key)}

    def read_classes(self) -> dict[SizeClass, tuple[int, list[float]]]:
        """The magnitude classes' entries, by (task, class)."""
        return {(task, int(magnitude)): entry
                for magnitude, task, entry in self._entries(self.classes_key)
                if magnitude.isdigit()}

    def read_calls(self) -> dict[Call, tuple[int, list[float]]]:
        """The calls' entries, by (task, signature): the older generation's, then the
        current one's over them."""
        return {(task, signature): entry
                for key in (self.old_calls_key, self.calls_key)
                for signature, task, entry in self._entries(key)}

    def _entries(self, key: str) -> list[tuple[str, str, tuple[int, list[float]]]]:
        """(before the first '|', after it, parsed value) of each field of hash ``key``
        that has both (fields it cannot read are ignored: anyone who can write the store
        can write them)."""
        try:
            raw = self.client.hgetall(key)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        entries = []
        for field, value in raw.items():
            name = field.decode("utf-8", "replace") if isinstance(field, bytes) else str(field)
            head, sep, rest = name.partition("|")
            parsed = parse_entry(value)
            if sep and parsed is not None:
                entries.append((head, rest, parsed))
        return entries


class HistorySource:
    """``view.sources['aitp.history']``: a :class:`HistoryView`, re-read when it changed."""

    name = HISTORY_SOURCE
    initial = EMPTY_HISTORY

    def __init__(self, interval_s: float = FETCH_INTERVAL_S,
                 clock: Callable[[], float] | None = None) -> None:
        self.interval_s = interval_s
        self.clock = clock or time.monotonic  # simulated time in a replay

    def fetch(self, store: RedisStore, previous: Any) -> HistoryView:
        now = self.clock()
        recent = now - previous.fetched_at < self.interval_s
        if previous is not EMPTY_HISTORY and recent:
            return previous
        history = HistoryStore(store)
        version = history.version()
        if version is None:
            return EMPTY_HISTORY
        if version == previous.version:
            previous.fetched_at = now
            return previous
        return HistoryView.from_entries(history.read(), version, now,
                                        classes=history.read_classes(), previous=previous,
                                        calls=history.read_calls())


class HistorySink:
    """Worker side: finished runs waiting to be added to the summary (bounded, never blocks).

    ``flush(store)`` runs in the refresher thread with the other telemetry; runs that
    cannot be written are kept for the next round up to the capacity, the oldest dropped
    beyond it (counted as ``history_dropped``).
    """

    name = "aitp.history"

    def __init__(self, counters: Counters, capacity: int = SINK_CAPACITY) -> None:
        self.counters = counters
        self._runs: deque[Run] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, tenant: str, task: str, runtime_s: float,
            magnitude: int | None = None, call: str | None = None) -> None:
        with self._lock:
            if len(self._runs) == self._runs.maxlen:
                self.counters.incr("history_dropped")
            self._runs.append(Run(tenant, task, runtime_s, magnitude, call))

    def flush(self, store: RedisStore) -> None:
        with self._lock:
            runs = list(self._runs)
            self._runs.clear()
        if not runs:
            return
        try:
            refused = HistoryStore(store).add_runs(runs)
        except StoreError:
            with self._lock:
                room = (self._runs.maxlen or 0) - len(self._runs)
                keep = runs[-room:] if room > 0 else []
                self._runs.extendleft(reversed(keep))
                if len(runs) > len(keep):
                    self.counters.incr("history_dropped", len(runs) - len(keep))
            raise
        if refused:
            self.counters.incr("history_pairs_full", refused)

    def __len__(self) -> int:
        return len(self._runs)
