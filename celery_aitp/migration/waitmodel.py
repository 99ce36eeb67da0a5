"""The modelled wait difference: what tiers would do to waits, from what shadow observed.

In coexistence every task waits in Celery's default queue, first in, first out. The
question is how long each tier's tasks would wait if, with the same workers and the
same load, tier queues were served highest tier first. The model:

1. The standard path is a FIFO queue in front of a pooled server: the fleet's ``c``
   processes acting as one server ``c`` times as fast (service time ``S / c``), with
   Poisson arrivals (an M/G/1 queue). Its mean wait is Pollaczek-Khinchine's
   ``W = λ E[S²] / (2 c² (1 - ρ))`` with utilisation ``ρ = λ E[S] / c``.
2. ``λ`` (arrivals per second), ``E[S]`` and ``E[S²]`` (service time = observed
   runtime) come from the runs; ``c`` is not assumed but solved from the observed
   mean wait ``W`` (the positive root of ``2W c² - 2Wλ E[S] c - λ E[S²] = 0``), so the
   model reproduces today's wait exactly and ``ρ`` is the utilisation that explains it.
3. With tiers, the same server serves classes in strict, non-preemptive priority
   order: each tier (highest first), then the tasks that would not be routed (they stay
   on the default queue, which AITP workers read after their tier queues). Cobham's
   formula gives class ``k`` the mean wait ``W0 / ((1 - σ[k-1]) (1 - σ[k]))`` with
   ``W0 = λ E[S²] / (2 c²)`` and ``σ[k]`` the utilisation of classes 1..k; rewritten with
   step 2, ``W_k = W (1 - ρ) / ((1 - σ[k-1]) (1 - σ[k]))``.

The difference ``W_k - W`` is the estimate: negative for high tiers, positive for low
ones (by the conservation law the load-weighted mean wait is unchanged). It assumes
strict tier order; the default weighted order gives backlogged low tiers a share of the
reads, so under sustained overload it overstates their extra wait. It also ignores
that tier queues are split by tenant and accelerator (each pool has its own workers)
and the prefetch of each worker; it gives the direction and size to expect, which the
split stage then measures for real, arm against arm.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from celery_aitp.migration.analysis import Record, _num
from celery_aitp.publish.gate_stage import GATED_REASONS

#: The class of tasks that would stay on Celery's route (served after every tier).
STANDARD = "(standard)"


@dataclass
class ClassWait:
    """Observed and modelled mean wait of one class (a tier, or the standard path)."""

    name: str
    n: int
    rate_per_s: float
    mean_service_s: float
    observed_wait_s: float
    modelled_wait_s: float

    @property
    def difference_s(self) -> float:
        return self.modelled_wait_s - self.observed_wait_s


@dataclass
class WaitModel:
    """The model's inputs and its per-class result."""

    n: int
    window_s: float
    observed_wait_s: float  # mean over every standard-path run
    servers: float  # the effective pooled server count c solved from the observed wait
    utilisation: float  # ρ
    classes: list[ClassWait]


def effective_servers(wait_s: float, rate: float, es: float, es2: float) -> float:
    """The ``c`` for which the pooled M/G/1 FIFO queue has mean wait ``wait_s``."""
    if wait_s <= 0 or rate <= 0 or es2 <= 0:
        return math.inf
    b = wait_s * rate * es
    return (b + math.sqrt(b * b + 2 * wait_s * rate * es2)) / (2 * wait_s)


def _class_of(record: Record, tiers: Sequence[str]) -> str:
    tier = record.get("tier")
    return str(tier) if record.get("reason") in GATED_REASONS and tier in tiers else STANDARD


def model_waits(records: Iterable[Record], tiers: Sequence[str]) -> WaitModel | None:
    """The model over standard-path runs (``routed`` false); None with too little data."""
    runs: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for record in records:
        wait, service, started = (_num(record.get(k)) for k in ("wait_s", "runtime_s",
                                                                 "started_at"))
        if record.get("routed") or wait is None or service is None or started is None:
            continue
        runs[_class_of(record, tiers)].append((max(0.0, wait), max(0.0, service), started))
    every = [run for group in runs.values() for run in group]
    if len(every) < 2:
        return None
    starts = [s for _, _, s in every]
    window = max(starts) - min(starts)
    if window <= 0:
        return None
    n = len(every)
    rate = n / window
    wait = statistics.fmean(w for w, _, _ in every)
    es = statistics.fmean(s for _, s, _ in every)
    es2 = statistics.fmean(s * s for _, s, _ in every)
    c = effective_servers(wait, rate, es, es2)
    order = [t for t in tiers if t in runs] + ([STANDARD] if STANDARD in runs else [])
    classes, sigma = [], 0.0
    for name in order:
        group = runs[name]
        class_rate = len(group) / window
        class_es = statistics.fmean(s for _, s, _ in group)
        before = sigma
        sigma += class_rate * class_es / c if math.isfinite(c) else 0.0
        utilisation = rate * es / c if math.isfinite(c) else 0.0
        modelled = wait * (1 - utilisation) / ((1 - before) * (1 - sigma))
        classes.append(ClassWait(name, len(group), class_rate, class_es,
                                 statistics.fmean(w for w, _, _ in group), modelled))
    return WaitModel(n, window, wait, c, rate * es / c if math.isfinite(c) else 0.0, classes)
