"""The scheduling benchmark's workload: three tenants, four task kinds, Poisson arrivals.

Deterministic for a seed. Each task's runtime depends on its size argument (non-linearly
for ``crunch``) times a log-normal factor the arguments do not explain; the benchmark
passes the exact runtime in the ``bench_runtime_s`` header, which the task sleeps for and
only the oracle reads. Rates are derived from each stream's share of its accelerator
class's capacity, so ``load`` is the offered utilisation (0.9 = 90% busy on average).
``initech`` is bursty: besides its Poisson stream it drops a batch of ``crunch`` tasks
every ``BURST_EVERY_S`` seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

POLICY = {
    "tiers": [
        {"name": "hi", "sla_s": 0.5}, {"name": "mid", "sla_s": 5}, {"name": "lo", "sla_s": 30},
    ],
    "tenants": {
        "acme": {"max_tier": "hi", "weight": 3},
        "globex": {"max_tier": "mid", "weight": 2},
        "initech": {"max_tier": "lo", "weight": 1},
        "default": {"max_tier": "lo", "weight": 1},
    },
    "accelerators": ["cpu", "gpu"],
    "stage": "takeover",
}

#: Concurrent slots per accelerator class (one worker each).
SLOTS = {"cpu": 6, "gpu": 2}
NOISE_SIGMA = 0.3
BURST_EVERY_S = 30.0
BURST_SPREAD_S = 1.5


@dataclass(frozen=True)
class TaskKind:
    accelerator: str
    tier: str  # declared in @app.task(aitp={...}); capped by the tenant's max_tier
    low: int
    high: int
    runtime: Callable[[int], float]

    def mean_runtime(self) -> float:
        sizes = range(self.low, self.high + 1)
        return sum(self.runtime(n) for n in sizes) / len(sizes) * math.exp(NOISE_SIGMA ** 2 / 2)


KINDS = {
    "bench.lookup": TaskKind("cpu", "hi", 1, 60, lambda n: 0.005 + 0.0015 * n),
    "bench.report": TaskKind("cpu", "mid", 100, 2500, lambda n: 0.08 + 0.0004 * n),
    "bench.crunch": TaskKind("cpu", "lo", 200, 2500, lambda n: 0.4 + 0.5 * (n / 1000) ** 2),
    "bench.embed": TaskKind("gpu", "hi", 1, 64, lambda n: 0.03 + 0.008 * n),
}

#: (tenant, task, share of its class's offered work); the CPU shares leave 0.17 to bursts.
STREAMS = [
    ("acme", "bench.lookup", 0.19),
    ("acme", "bench.report", 0.04),
    ("acme", "bench.crunch", 0.04),
    ("globex", "bench.lookup", 0.08),
    ("globex", "bench.report", 0.24),
    ("initech", "bench.report", 0.11),
    ("initech", "bench.crunch", 0.13),
    ("acme", "bench.embed", 0.5),
    ("globex", "bench.embed", 0.5),
]
BURST_SHARE = 1.0 - sum(s for _t, task, s in STREAMS if KINDS[task].accelerator == "cpu")


@dataclass(frozen=True)
class Item:
    """One task to publish ``at`` seconds after the start."""

    index: int
    at: float
    task: str
    tenant: str
    size: int
    runtime_s: float


def _draw(rng: random.Random, task: str) -> tuple[int, float]:
    kind = KINDS[task]
    size = rng.randint(kind.low, kind.high)
    return size, kind.runtime(size) * rng.lognormvariate(0.0, NOISE_SIGMA)


def rate_of(task: str, share: float, load: float) -> float:
    """Arrivals per second of a stream with this share of its class at this load."""
    kind = KINDS[task]
    return share * load * SLOTS[kind.accelerator] / kind.mean_runtime()


def schedule(duration_s: float, load: float = 0.9, seed: int = 1) -> list[Item]:
    """Every arrival in ``duration_s`` seconds, in time order, deterministic for ``seed``."""
    rng = random.Random(seed)
    raw: list[tuple[float, str, str]] = []
    for tenant, task, share in STREAMS:
        rate = rate_of(task, share, load)
        t = rng.expovariate(rate)
        while t < duration_s:
            raw.append((t, tenant, task))
            t += rng.expovariate(rate)
    crunch = KINDS["bench.crunch"]
    per_burst = round(BURST_SHARE * load * SLOTS["cpu"] * BURST_EVERY_S / crunch.mean_runtime())
    start = BURST_EVERY_S / 2
    while start < duration_s - BURST_SPREAD_S:
        raw += [(start + rng.uniform(0, BURST_SPREAD_S), "initech", "bench.crunch")
                for _ in range(per_burst)]
        start += BURST_EVERY_S
    raw.sort()
    items = []
    for index, (at, tenant, task) in enumerate(raw):
        size, runtime = _draw(rng, task)
        items.append(Item(index, at, task, tenant, size, runtime))
    return items


def offered_load(items: list[Item], duration_s: float) -> dict[str, float]:
    """Work offered per class as a share of its capacity over ``duration_s``."""
    work: dict[str, float] = {}
    for item in items:
        accel = KINDS[item.task].accelerator
        work[accel] = work.get(accel, 0.0) + item.runtime_s
    return {a: w / (SLOTS[a] * duration_s) for a, w in work.items()}
