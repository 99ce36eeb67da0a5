"""Observation records -> validated, chronological training rows.

A record is one JSON object (the store's observation stream, or a line of a JSON-lines
file; docs/prediction.md has the schema). Required: ``task`` and ``tenant`` (strings),
``published_at`` (epoch seconds) and, for training, ``runtime_s`` (seconds, >= 0).
``args`` (list) and ``kwargs`` (object) may be absent. A record that breaks any of this
is skipped and counted by reason, never fatal.

History features are rebuilt here in time order, exactly as a producer would have seen
them: a run counts in the history of a later task only if it had finished when that
task was published.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from celery_aitp.jsonl import Skipped, json_lines
from celery_aitp.predict.features import (
    HISTORY_DEPTH,
    KWARG_PREFIX,
    History,
    argument_features,
    history_features,
)

#: Runtimes below this are clipped before taking the log (the model learns log runtime).
MIN_RUNTIME_S = 1e-4
#: Celery's default ``argsrepr_maxsize``/``kwargsrepr_maxsize``.
REPR_MAXSIZE = 1024


def _finite(value: Any) -> bool:
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and -1e300 < value < 1e300  # a huge int has no float


class Observation:
    """One usable record, reduced to what features and metrics need."""

    __slots__ = ("index", "task", "tenant", "published_at", "runtime_s", "finished_at",
                 "arguments", "hint_s", "retries", "history")

    def __init__(self, index: int, task: str, tenant: str, published_at: float,
                 runtime_s: float | None, finished_at: float | None,
                 arguments: Mapping[str, Any], hint_s: Any, retries: Any) -> None:
        self.index = index
        self.task = task
        self.tenant = tenant
        self.published_at = published_at
        self.runtime_s = runtime_s
        self.finished_at = finished_at
        self.arguments = arguments
        self.hint_s = hint_s
        self.retries = retries
        self.history: History | None = None


def _repr_length(value: Any) -> int:
    """Length of Celery's ``saferepr`` of args/kwargs, for records that lack it."""
    from celery.utils.saferepr import saferepr

    try:
        return len(saferepr(value, REPR_MAXSIZE, maxlevels=3))
    except Exception:
        return 0


def _runtime_problem(value: Any) -> str | None:
    if value is None:
        return "missing runtime_s"
    if type(value) is not int and type(value) is not float:
        return "runtime_s not a number"
    if value != value:
        return "runtime_s is NaN"
    if not _finite(value):
        return "runtime_s is infinite"
    if value < 0:
        return "negative runtime_s"
    return None


def _basic_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    task, tenant = record.get("task"), record.get("tenant")
    if task is None:
        return "missing task"
    if type(task) is not str or not task:
        return "task not a string"
    if tenant is None:
        return "missing tenant"
    if type(tenant) is not str:
        return "tenant not a string"
    published = record.get("published_at")
    if published is None:
        return "missing published_at"
    if not _finite(published):
        return "published_at not a number"
    if record.get("args") is not None and not isinstance(record["args"], list):
        return "args not a list"
    if record.get("kwargs") is not None and not isinstance(record["kwargs"], dict):
        return "kwargs not an object"
    return None


def _finished_at(record: Mapping[str, Any], runtime: float | None) -> float | None:
    if runtime is None:
        return None
    started: Any = record.get("started_at")
    if _finite(started):
        return float(started) + runtime
    wait: Any = record.get("wait_s")
    base = float(record["published_at"]) + (float(wait) if _finite(wait) and wait > 0 else 0.0)
    return base + runtime


def _arguments(record: Mapping[str, Any]) -> Mapping[str, Any]:
    recorded = record.get("features")
    if isinstance(recorded, dict):
        return recorded
    args = record.get("args") or []
    kwargs = record.get("kwargs") or {}
    args_bytes = record.get("args_bytes")
    kwargs_bytes = record.get("kwargs_bytes")
    if not _finite(args_bytes):
        args_bytes = _repr_length(tuple(args))
    if not _finite(kwargs_bytes):
        kwargs_bytes = _repr_length(kwargs)
    return argument_features(tuple(args), kwargs, args_bytes, kwargs_bytes)


def to_observation(index: int, record: Any, need_runtime: bool = True,
                   successful_only: bool = True) -> Observation | str:
    """An Observation, or the reason the record cannot be used."""
    problem = _basic_problem(record)
    if problem:
        return problem
    runtime = record.get("runtime_s")
    problem = _runtime_problem(runtime)
    if problem and (need_runtime or runtime is not None):
        return problem
    outcome = record.get("outcome")
    if successful_only and outcome is not None and outcome != "SUCCESS":
        return "outcome not SUCCESS"
    runtime_s = None if problem else float(runtime)
    return Observation(
        index, record["task"], record["tenant"], float(record["published_at"]), runtime_s,
        _finished_at(record, runtime_s), _arguments(record), record.get("runtime_hint_s"),
        record.get("retries", 0),
    )


class Dataset:
    """Usable observations in publication order, with their history features."""

    def __init__(self, observations: list[Observation], skipped: Counter[str],
                 total: int) -> None:
        self.observations = observations
        self.skipped = skipped
        self.total = total

    def __len__(self) -> int:
        return len(self.observations)

    def summary(self) -> str:
        """``used N of M records; skipped K (reason: n, ...)``."""
        n_skipped = sum(self.skipped.values())
        line = f"used {len(self.observations)} of {self.total} records"
        if n_skipped:
            reasons = ", ".join(f"{why}: {n}" for why, n in self.skipped.most_common())
            line += f"; skipped {n_skipped} ({reasons})"
        return line

    def kwarg_names(self, limit: int = 8, min_share: float = 0.01) -> list[str]:
        """The keyword arguments worth a feature: the most often present with a value."""
        seen: Counter[str] = Counter()
        for obs in self.observations:
            for key, value in obs.arguments.items():
                if key.startswith(KWARG_PREFIX) and value is not None and value == value:
                    seen[key[len(KWARG_PREFIX):]] += 1
        floor = max(1, int(min_share * len(self.observations)))
        return sorted(name for name, n in seen.most_common(limit) if n >= floor)

    def vocabulary(self, field: str, limit: int = 1000) -> list[str]:
        counts = Counter(getattr(obs, field) for obs in self.observations)
        return sorted(name for name, _ in counts.most_common(limit))


def build_dataset(records: Iterable[Any], need_runtime: bool = True,
                  successful_only: bool = True) -> Dataset:
    """Validate records and attach history features in publication order."""
    observations: list[Observation] = []
    skipped: Counter[str] = Counter()
    total = 0
    for index, record in enumerate(records):
        total += 1
        if isinstance(record, Unreadable):
            skipped[record.reason] += 1
            continue
        found = to_observation(index, record, need_runtime, successful_only)
        if isinstance(found, str):
            skipped[found] += 1
        else:
            observations.append(found)
    observations.sort(key=lambda o: (o.published_at, o.index))
    attach_history(observations)
    return Dataset(observations, skipped, total)


def attach_history(observations: list[Observation]) -> None:
    """Set each observation's history from runs that had finished when it was published:
    its (tenant, task)'s and its tenant's (any task), as the store's summary keeps them."""
    events: list[tuple[float, int, int]] = []  # (time, 0=finish/1=publish, position)
    for pos, obs in enumerate(observations):
        events.append((obs.published_at, 1, pos))
        if obs.finished_at is not None:
            events.append((obs.finished_at, 0, pos))
    events.sort()
    recent: dict[tuple[str, str], deque[float]] = {}
    by_tenant: dict[str, deque[float]] = {}
    counts: Counter[tuple[str, str]] = Counter()
    for _, kind, pos in events:
        obs = observations[pos]
        pair = (obs.tenant, obs.task)
        if kind == 0:
            runtime = obs.runtime_s or 0.0
            runs = recent.get(pair)
            if runs is None:
                runs = recent[pair] = deque(maxlen=HISTORY_DEPTH)
            runs.appendleft(runtime)
            tenant_runs = by_tenant.get(obs.tenant)
            if tenant_runs is None:
                tenant_runs = by_tenant[obs.tenant] = deque(maxlen=2)
            tenant_runs.appendleft(runtime)
            counts[pair] += 1
        else:
            runs = recent.get(pair)
            tenant_runs = by_tenant.get(obs.tenant)
            obs.history = (history_features(runs or (), counts[pair], tenant_runs or ())
                           if runs or tenant_runs else None)


class Unreadable:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def read_jsonl(path: str | Path) -> Iterator[Any]:
    """Records of a JSON-lines file (``.gz`` too) in order; unreadable lines, and the cut
    end of a damaged ``.gz``, come out as skip markers."""
    for value in json_lines(path):
        yield Unreadable(value.reason) if isinstance(value, Skipped) else value
