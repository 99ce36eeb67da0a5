"""Live prediction error per task, and the fallback when a task's model predictions drift.

Workers see the truth: for each successful run the model predicted, they add the error
``|log(runtime / predicted p50)|`` (0.69 is a factor of 2) to a moving average per task
in the store. When a task's average, over at least :data:`MIN_RUNS` runs, exceeds the
bound, producers stop using the model for that task and predict from its history (the
cold-start estimate), counting ``prediction_drift`` per decision; the worker that saw
the crossing asks the trainer for a round (``<prefix>:trainer:due``), which still takes
the trainer lock. A promoted, pinned or rolled-back model starts with a clean slate.

``<prefix>:drift`` (hash)        task -> ``<average>;<runs>``
``<prefix>:drift:version``       incremented on every update (producers re-read on change)
``<prefix>:trainer:due``         why a retrain was asked for (the trainer clears it)
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from celery_aitp.errors import StoreError
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.counters import Counters

DRIFT_SOURCE = "aitp.drift"
#: Average ``|log(runtime / predicted)|`` beyond which a task's model predictions are
#: replaced by its history: log(3), a typical miss of 3x (the model's is about 1.5x).
BOUND = math.log(3.0)
#: Runs of a task before its average counts.
MIN_RUNS = 20
#: Weight of each new run in the moving average (about the last 40 runs count).
ALPHA = 0.05
FETCH_INTERVAL_S = 2.0
SINK_CAPACITY = 10_000

_ADD_ERRORS = """
local bound, min_runs, alpha = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local crossed = {}
for i = 4, #ARGV, 2 do
  local task, err = ARGV[i], tonumber(ARGV[i + 1])
  local current = redis.call('HGET', KEYS[1], task)
  local avg, n = err, 0
  if current then
    local a, c = string.match(current, '^([^;]+);(%d+)$')
    if a then avg, n = tonumber(a) + alpha * (err - tonumber(a)), tonumber(c) end
  end
  local was = current and n >= min_runs and tonumber(string.match(current, '^([^;]+)')) > bound
  n = n + 1
  redis.call('HSET', KEYS[1], task, string.format('%.6g', avg) .. ';' .. n)
  if n >= min_runs and avg > bound and not was then
    table.insert(crossed, task)
  end
end
redis.call('INCR', KEYS[2])
if #crossed > 0 then
  redis.call('SET', KEYS[3], 'drift: ' .. table.concat(crossed, ', '))
end
return #crossed
"""


def run_error(runtime_s: Any, predicted_s: Any) -> float | None:
    """``|log(runtime / predicted)|`` of one run, or None when either is unusable."""
    numbers = (int, float)
    if not isinstance(runtime_s, numbers) or not isinstance(predicted_s, numbers):
        return None
    if not (0 < runtime_s < math.inf and 0 < predicted_s < math.inf):
        return None
    return abs(math.log(runtime_s / predicted_s))


class DriftStore:
    """The per-task error averages in the store (one round trip per operation)."""

    def __init__(self, store: RedisStore) -> None:
        self.client = store.client
        self.key = store.keys.any("drift")
        self.version_key = store.keys.any("drift", "version")
        self.due_key = store.keys.any("trainer", "due")
        self._script = self.client.register_script(_ADD_ERRORS)

    def add(self, errors: Iterable[tuple[str, float]]) -> int:
        """Add run errors; returns how many tasks crossed the bound (retrain asked for)."""
        args: list[Any] = [BOUND, MIN_RUNS, ALPHA]
        for task, error in errors:
            args.extend((task, f"{error:.6g}"))
        if len(args) == 3:
            return 0
        try:
            return int(self._script(keys=[self.key, self.version_key, self.due_key],
                                    args=args))
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc

    def read(self) -> dict[str, tuple[float, int]]:
        try:
            raw = self.client.hgetall(self.key)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        out = {}
        for field, value in raw.items():
            text = value.decode() if isinstance(value, bytes) else str(value)
            average, _, runs = text.partition(";")
            try:
                out[field.decode() if isinstance(field, bytes) else str(field)] = (
                    float(average), int(runs))
            except ValueError:
                continue
        return out

    def version(self) -> int | None:
        try:
            raw = self.client.get(self.version_key)
            return int(raw) if raw else None
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        except ValueError:
            return None

    def reset(self, pipe: Any = None) -> None:
        """A new model: forget the errors of the previous one (in ``pipe`` if given)."""
        target = pipe if pipe is not None else self.client
        target.delete(self.key)
        target.incr(self.version_key)

    def take_due(self) -> str | None:
        """Why a retrain was asked for (and clear it), or None."""
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.get(self.due_key)
            pipe.delete(self.due_key)
            raw = pipe.execute()[0]
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return (raw.decode() if isinstance(raw, bytes) else str(raw)) if raw else None


def drifting(averages: Mapping[str, tuple[float, int]]) -> frozenset[str]:
    return frozenset(task for task, (average, runs) in averages.items()
                     if runs >= MIN_RUNS and average > BOUND)


class DriftView:
    """What the publish path reads: the tasks whose model predictions are not trusted."""

    __slots__ = ("averages", "drifting", "version", "fetched_at")

    def __init__(self, averages: Mapping[str, tuple[float, int]] | None = None,
                 version: int | None = None, fetched_at: float = 0.0) -> None:
        self.averages = dict(averages or {})
        self.drifting = drifting(self.averages)
        self.version = version
        self.fetched_at = fetched_at


EMPTY_DRIFT = DriftView()


class DriftSource:
    """``view.sources['aitp.drift']``: a :class:`DriftView`, re-read when it changed."""

    name = DRIFT_SOURCE
    initial = EMPTY_DRIFT

    def __init__(self, interval_s: float = FETCH_INTERVAL_S,
                 clock: Callable[[], float] | None = None) -> None:
        self.interval_s = interval_s
        self.clock = clock or time.monotonic

    def fetch(self, store: RedisStore, previous: Any) -> DriftView:
        now = self.clock()
        if previous is not EMPTY_DRIFT and now - previous.fetched_at < self.interval_s:
            return previous
        drift = DriftStore(store)
        version = drift.version()
        if version is None:
            return EMPTY_DRIFT
        if version == previous.version:
            previous.fetched_at = now
            return previous
        return DriftView(drift.read(), version, now)


class DriftSink:
    """Worker side: run errors waiting to be added (bounded, never blocks a task)."""

    name = "aitp.drift"

    def __init__(self, counters: Counters, capacity: int = SINK_CAPACITY) -> None:
        self.counters = counters
        self._errors: deque[tuple[str, float]] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, task: str, runtime_s: Any, predicted_s: Any) -> None:
        error = run_error(runtime_s, predicted_s)
        if error is None:
            return
        with self._lock:
            if len(self._errors) == self._errors.maxlen:
                self.counters.incr("drift_dropped")
            self._errors.append((task, error))

    def flush(self, store: RedisStore) -> None:
        with self._lock:
            errors = list(self._errors)
            self._errors.clear()
        if not errors:
            return
        crossed = DriftStore(store).add(errors)  # StoreError: these errors are dropped
        if crossed:
            self.counters.incr("prediction_drift_tasks", crossed)

    def __len__(self) -> int:
        return len(self._errors)
