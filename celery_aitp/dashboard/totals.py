"""Cumulative histograms and counters built from the runs this process has seen.

Fed with each new observation record exactly once (see :mod:`streams`), so the values
only grow and Prometheus can take ``rate()`` and ``histogram_quantile()`` of them.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_aitp.dashboard.labels import Bounds
from celery_aitp.dashboard.stats import number, relative_error
from celery_aitp.numbers import skewed_wait

#: Queue wait buckets (seconds): from "instant" to half an hour.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                600.0, 1800.0)
#: Run time buckets (seconds): from 5 ms to an hour.
RUN_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
               900.0, 3600.0)
#: Relative prediction error buckets: |predicted - actual| / actual.
ERROR_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class Histogram:
    """Counts per upper bound plus sum and count; cumulative on export."""

    __slots__ = ("bounds", "counts", "total", "n")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: ('0.1', count <= 0.1), ..., ('+Inf', count)."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class RunTotals:
    """Wait and run time histograms, SLA misses and prediction errors, per label set."""

    def __init__(self, bounds: Bounds, sla_by_tier: Mapping[str, float]) -> None:
        self.bounds = bounds
        self.sla = dict(sla_by_tier)
        self.wait: dict[tuple[str, str], Histogram] = {}
        self.run: dict[tuple[str, str], Histogram] = {}
        self.prediction_error: dict[tuple[str], Histogram] = {}
        self.sla_misses: Counter[tuple[str, str]] = Counter()
        self.runs: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def follow(self, bounds: Bounds, sla_by_tier: Mapping[str, float]) -> None:
        """Label and judge the runs added from now on by another policy's bounds and
        SLAs (the totals so far are kept)."""
        with self._lock:
            self.bounds = bounds
            self.sla = dict(sla_by_tier)

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for record in records:
                self._add(record)

    def _add(self, r: Mapping[str, Any]) -> None:
        b = self.bounds
        key = (b.tenant(r.get("tenant")), b.tier(r.get("tier")))
        self.runs[key + (str(r.get("outcome") or "unknown")[:32],)] += 1
        wait = number(r.get("wait_s"))
        if wait is not None and not skewed_wait(wait):  # skewed: clock skew, no wait
            self.wait.setdefault(key, Histogram(WAIT_BUCKETS)).observe(max(0.0, wait))
            sla = self.sla.get(str(r.get("tier")))
            if sla is not None and wait > sla:
                self.sla_misses[key] += 1
        runtime = number(r.get("runtime_s"))
        if runtime is not None:
            self.run.setdefault(key, Histogram(RUN_BUCKETS)).observe(max(0.0, runtime))
        error = relative_error(r)
        if error is not None:
            task_key = (b.task(r.get("task")),)
            self.prediction_error.setdefault(task_key, Histogram(ERROR_BUCKETS)).observe(error)

    def copy_state(self) -> dict[str, Any]:
        """A consistent copy for one export."""
        with self._lock:
            return {
                "wait": {k: (h.cumulative(), h.total) for k, h in self.wait.items()},
                "run": {k: (h.cumulative(), h.total) for k, h in self.run.items()},
                "prediction_error": {k: (h.cumulative(), h.total)
                                     for k, h in self.prediction_error.items()},
                "sla_misses": dict(self.sla_misses),
                "runs": dict(self.runs),
            }
