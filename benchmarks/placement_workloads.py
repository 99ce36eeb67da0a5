"""The placement benchmark's workloads: one undeclared task ``job(d)``, four size mixes.

Every workload publishes the same task, ``bench.job(d)``, whose argument ``d`` (work units,
about one millisecond each) decides its runtime up to a small log-normal noise the
argument does not explain. Nothing is declared: no tier, no hint. Arrivals are Poisson at
``load`` (0.85) of one worker's capacity (``SLOTS`` processes), computed from the mix's
mean runtime; the arrival times are then scaled so that the run's work is exactly that
load (every workload and seed offers the same utilisation). Deterministic for a seed.

- ``bimodal``: 80% of calls take 10-50 ms, 20% take 0.5-1.5 s; two tenants at random;
- ``pareto``: heavy-tailed runtimes (Pareto, alpha 1.5, from 50 ms, capped at 5 s);
- ``skewed``: the bimodal mix, one tenant sends 80% of the tasks;
- ``bursts``: the bimodal mix in bursts (on 2 s, off 3 s) with the same average load.

With ``tenants`` other than 2 (:func:`spread`), the same arrivals come from that many
tenants the policy does not list, all of one class (``CROWD_POLICY``: what a SaaS with
thousands of customers configures, rather than listing each).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

TASK = "bench.job"
SLOTS = 4
LOAD = 0.85
NOISE_SIGMA = 0.05
TENANTS = ("acme", "globex")
#: The deployment's policy: two tenants, everything else celery_aitp's defaults.
POLICY = {"tenants": {"acme": {}, "globex": {}, "default": {}}, "stage": "takeover"}

#: The policy of an N-tenant run (top-level fields replacing POLICY's): no tenant listed
#: but the default; every name in the header becomes a tenant of class ``standard`` (its
#: own fair share, the class's shared queues, celery_aitp's defaults otherwise).
CROWD_POLICY = {"tenants": {"default": {}}, "tenant_classes": {"standard": {}},
                "unlisted_tenants": "standard"}

PARETO_ALPHA = 1.5
PARETO_FROM_S = 0.05
PARETO_CAP_S = 5.0
BURST_ON_S = 2.0
BURST_OFF_S = 3.0


@dataclass(frozen=True)
class Item:
    """One task to publish ``at`` seconds after the start."""

    index: int
    at: float
    tenant: str
    units: int  # the argument d
    runtime_s: float  # what the task really takes (only the oracle reads it)


def _bimodal(rng: random.Random) -> float:
    if rng.random() < 0.8:
        return rng.uniform(0.010, 0.050)
    return rng.uniform(0.5, 1.5)


def _pareto(rng: random.Random) -> float:
    return min(PARETO_CAP_S, PARETO_FROM_S * rng.paretovariate(PARETO_ALPHA))


@dataclass(frozen=True)
class Workload:
    name: str
    size: Callable[[random.Random], float]  # the argument's runtime in seconds
    heavy_share: float = 0.5  # share of tasks the first tenant sends
    bursty: bool = False

    def mean_runtime(self) -> float:
        """The mix's mean runtime (a large fixed sample: exact enough for the rate)."""
        rng = random.Random(12345)
        return sum(self.size(rng) for _ in range(200_000)) / 200_000

    def rate(self, load: float = LOAD) -> float:
        return load * SLOTS / self.mean_runtime()

    def schedule(self, duration_s: float, seed: int, load: float = LOAD, tenants: int = 2
                 ) -> list[Item]:
        """Every arrival in ``duration_s`` seconds, in time order, from ``tenants``."""
        rng = random.Random(seed)
        rate = self.rate(load)
        cycle = BURST_ON_S + BURST_OFF_S
        on_rate = rate * cycle / BURST_ON_S
        items: list[Item] = []
        t = 0.0
        while True:
            if self.bursty:
                t += rng.expovariate(on_rate)
                if t % cycle >= BURST_ON_S:  # skip the off period
                    t = (t // cycle + 1) * cycle + rng.expovariate(on_rate)
            else:
                t += rng.expovariate(rate)
            if t >= duration_s:
                return spread(_at_load(items, duration_s, load), tenants,
                              self.heavy_share > 0.5, seed)
            ideal = self.size(rng)
            units = max(1, round(ideal * 1000))
            runtime = units / 1000 * rng.lognormvariate(0.0, NOISE_SIGMA)
            tenant = TENANTS[0] if rng.random() < self.heavy_share else TENANTS[1]
            items.append(Item(len(items), t, tenant, units, runtime))


WORKLOADS = {
    "bimodal": Workload("bimodal", _bimodal),
    "pareto": Workload("pareto", _pareto),
    "skewed": Workload("skewed", _bimodal, heavy_share=0.8),
    "bursts": Workload("bursts", _bimodal, bursty=True),
}


def _at_load(items: list[Item], duration_s: float, load: float) -> list[Item]:
    """The same arrivals with their times scaled so the work they bring is exactly
    ``load`` of the capacity over the run (a random draw may bring 77% or 90%)."""
    factor = offered_load(items, duration_s) / load
    return [Item(i.index, i.at * factor, i.tenant, i.units, i.runtime_s) for i in items]


def tenant_names(count: int) -> tuple[str, ...]:
    """The tenants of a run: today's two for 2, else ``c0000``, ``c0001``..."""
    if count < 2:
        raise ValueError(f"tenants must be at least 2, got {count}")
    return TENANTS if count == 2 else tuple(f"c{i:04d}" for i in range(count))


def spread(items: list[Item], count: int, skewed: bool, seed: int) -> list[Item]:
    """The same arrivals from ``count`` tenants: each task goes to one at random (its own
    random stream, so times and sizes stay the workload's). In a skewed workload the heavy
    tenant keeps its tasks (one large customer) and the others' are spread over the rest."""
    names = tenant_names(count)
    if count == 2:
        return items
    rng = random.Random(seed)
    found = []
    for i in items:
        if skewed and i.tenant == TENANTS[0]:
            tenant = names[0]
        else:
            tenant = names[rng.randrange(1, count) if skewed else rng.randrange(count)]
        found.append(Item(i.index, i.at, tenant, i.units, i.runtime_s))
    return found


def offered_load(items: list[Item], duration_s: float) -> float:
    return sum(i.runtime_s for i in items) / (SLOTS * duration_s)
