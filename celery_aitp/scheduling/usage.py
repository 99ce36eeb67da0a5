"""Per-tenant usage with a half-life, and who is above their fair share.

One store hash ``usage`` (under the prefix) holds decaying sums (see
:mod:`celery_aitp.store.decayed`), half-life ``fair_share.half_life_s``:

* ``p:<tenant>`` predicted runtime published (producers, from each decision's p50, or
  ``fair_share.default_cost_s`` without a prediction) and ``n:<tenant>`` tasks published;
* ``o:<tenant>`` observed runtime and ``r:<tenant>`` runs (workers, after each run);
* ``t:<tier>`` decisions per tier (for the priority-distribution entropy);
* ``s:<accelerator>.<tier>`` observed runtime and ``k:<accelerator>.<tier>`` runs per
  tier (workers): the mean run of a tier, which the weighted tier order charges each
  read by (``worker/tier_cycle.py``).

Producers add in batches from the background refresher, never per publish; the same
round trip reads the hash back. A tenant's usage is ``max(predicted, observed)``: the
prediction reacts at once to a flood (before it runs), the observation corrects
under-prediction. Among active tenants (at least ``fair_share.min_active_share`` of all
usage), tenant ``i`` is above its share when ``usage_i / sum(usage) > w_i / sum(w) *
(1 + fair_share.tolerance)``; its tasks are then demoted one tier until it is back under.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_aitp.fairness import served_fairness, tier_entropy
from celery_aitp.policy import TIER_WEIGHT_RATIO, Policy
from celery_aitp.store.decayed import DecayedSums, decayed_values, decode_hash
from celery_aitp.store.redis_store import RedisStore, translated_errors

#: The live-view source name of fair-share usage (``view.sources``).
USAGE_SOURCE = "usage"
#: Publishes kept for the next batch while the store is unreachable (oldest dropped).
PENDING_LIMIT = 100_000
#: The largest charge of a read in the weighted tier order (a tier's mean run over the
#: shortest tier's): the ratio between neighbouring tiers' weights, so a backlogged tier
#: is never read less often than the tier below it would be uncharged. It bounds how long
#: its tasks wait in reads (``worker/tier_cycle.py``); on the placement benchmark's pareto
#: mix (lowest tier about 25x the top's) a cap of 1,000 let its longest wait reach 2.64x
#: FIFO's, 8 about 2.1x, with a lower mean slowdown too.
MAX_CHARGE = float(TIER_WEIGHT_RATIO)


def is_demoted(sources: Mapping[str, Any], tenant: str) -> bool:
    """Whether ``tenant`` is above its fair share in a view's ``sources`` (its usage
    snapshot); False before the first snapshot."""
    usage = sources.get(USAGE_SOURCE)
    return usage is not None and tenant in usage.demoted


def tier_charges(tier_runtime: Mapping[str, float]) -> dict[str, float]:
    """The charge of one read of each measured ``<accelerator>.<tier>``: its mean run
    over the shortest tier mean of its accelerator class, in ``[1, MAX_CHARGE]``
    (``worker/tier_cycle.py``)."""
    shortest: dict[str, float] = {}
    for key, mean in tier_runtime.items():
        accelerator = key.rpartition(".")[0]
        if 0 < mean < shortest.get(accelerator, math.inf):
            shortest[accelerator] = mean
    return {key: min(MAX_CHARGE, mean / shortest[key.rpartition(".")[0]])
            for key, mean in tier_runtime.items() if mean > 0}


def usage_key(store: RedisStore) -> str:
    return store.keys.any("usage")


def demoted_tenants(usage: Mapping[str, float], weights: Mapping[str, float],
                    tolerance: float, min_active_share: float) -> tuple[frozenset[str],
                                                                         dict[str, float]]:
    """Tenants above their weighted share, and each active tenant's fair share.

    A tenant below ``min_active_share`` of the total does not count as active (a trickle
    must not make a lone heavy user look unfair), unless such small tenants together
    reach that share: a thousand customers at 0.1% each are real demand. Such a small
    tenant is never demoted itself, whatever its share: among a thousand, one long task
    puts a customer several times over its 0.1%, and demoting it (in a class: its next
    tasks to the over-share lane) delayed its short tasks for nobody's gain (placement
    benchmark, 1,000 tenants, bimodal: the oracle demoted 51 of 854 tasks).
    """
    total = sum(u for t, u in usage.items() if t in weights and u > 0)
    if total <= 0:
        return frozenset(), {}
    using = [t for t, u in usage.items() if t in weights and u > 0]
    active = [t for t in using if usage[t] / total >= min_active_share]
    small = sum(usage[t] for t in using) - sum(usage[t] for t in active)
    if small / total >= min_active_share:
        active = using
    weight_sum = sum(weights[t] for t in active)
    fair = {t: weights[t] / weight_sum for t in active}
    if len(active) < 2:
        return frozenset(), fair
    over = frozenset(t for t in active if usage[t] / total > fair[t] * (1.0 + tolerance)
                     and usage[t] / total >= min_active_share)
    return over, fair


@dataclass(frozen=True)
class UsageSnapshot:
    """Decayed usage as of ``at``, and what the priority stage and the metrics need."""

    at: float = 0.0
    predicted: Mapping[str, float] = field(default_factory=dict)
    published: Mapping[str, float] = field(default_factory=dict)
    observed: Mapping[str, float] = field(default_factory=dict)
    runs: Mapping[str, float] = field(default_factory=dict)
    tiers: Mapping[str, float] = field(default_factory=dict)
    #: mean observed run (seconds) per ``<accelerator>.<tier>``
    tier_runtime: Mapping[str, float] = field(default_factory=dict)
    usage: Mapping[str, float] = field(default_factory=dict)
    fair: Mapping[str, float] = field(default_factory=dict)
    demoted: frozenset[str] = frozenset()
    jain: float | None = None
    entropy: float | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, float], at: float, policy: Policy) -> UsageSnapshot:
        groups: dict[str, dict[str, float]] = {k: {} for k in "pnortsk"}
        for name, value in values.items():
            kind, _, key = name.partition(":")
            if kind in groups and key:
                groups[kind][key] = value
        predicted, observed = groups["p"], groups["o"]
        usage = {t: max(predicted.get(t, 0.0), observed.get(t, 0.0))
                 for t in set(predicted) | set(observed) if policy.tenant_spec(t) is not None}
        weights = {t: spec.weight for t, spec in policy.tenants.items()}
        for tenant in usage.keys() - weights.keys():  # unlisted tenants: their class's
            weights[tenant] = _unlisted_weight(policy)
        fs = policy.fair_share
        demoted, fair = demoted_tenants(usage, weights, fs.tolerance, fs.min_active_share)
        if not fs.enabled:
            demoted = frozenset()
        return cls(
            at=at, predicted=predicted, published=groups["n"], observed=observed,
            runs=groups["r"], tiers=groups["t"], usage=usage, fair=fair, demoted=demoted,
            tier_runtime={key: seconds / groups["k"][key] for key, seconds in groups["s"].items()
                          if groups["k"].get(key, 0.0) > 0 and seconds >= 0},
            jain=_served_jain(observed, groups["r"], groups["n"], predicted, weights),
            entropy=tier_entropy(groups["t"], policy.tier_names),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (for the dashboard, metrics and ``explain``)."""
        return {
            "at": self.at, "usage_s": dict(self.usage), "predicted_s": dict(self.predicted),
            "observed_s": dict(self.observed), "published": dict(self.published),
            "runs": dict(self.runs), "tiers": dict(self.tiers),
            "tier_runtime_s": dict(self.tier_runtime), "fair_share": dict(self.fair),
            "demoted": sorted(self.demoted), "jain": self.jain, "entropy": self.entropy,
        }


def _served_jain(observed: Mapping[str, float], runs: Mapping[str, float],
                 published: Mapping[str, float], predicted: Mapping[str, float],
                 weights: Mapping[str, float]) -> float | None:
    """Jain's index of served work normalised by max-min fair shares (``fairness``).

    Demand is estimated in the unit of served work: a tenant's observed runtime scaled
    by tasks published over tasks run (its own mean runtime times what it asked for),
    or its predicted runtime before any of its tasks ran.
    """
    demanded: dict[str, float] = {}
    for tenant in set(observed) | set(predicted):
        if tenant not in weights:
            continue
        done, asked = runs.get(tenant, 0.0), published.get(tenant, 0.0)
        if done > 0:
            demanded[tenant] = observed.get(tenant, 0.0) * max(1.0, asked / done)
        else:
            demanded[tenant] = predicted.get(tenant, 0.0)
    return served_fairness(observed, demanded, weights)


class UsageStore:
    """Adds to and reads the usage hash."""

    def __init__(self, store: RedisStore, half_life_s: float) -> None:
        self.store = store
        self.key = usage_key(store)
        self.half_life_s = half_life_s
        self.sums = DecayedSums(store)

    def queue_add(self, pipe: Any, amounts: Mapping[str, float], now: float) -> None:
        if amounts:
            self.sums.add(pipe, self.key, amounts, now, self.half_life_s)

    def add(self, amounts: Mapping[str, float], now: float) -> None:
        """Add a batch without reading the hash back."""
        if not amounts:
            return
        with translated_errors():
            pipe = self.store.client.pipeline(transaction=False)
            self.queue_add(pipe, amounts, now)
            pipe.execute()

    def add_and_read(self, amounts: Mapping[str, float], now: float) -> dict[str, float]:
        """Add a batch and read the whole hash back, in one round trip."""
        with translated_errors():
            pipe = self.store.client.pipeline(transaction=False)
            self.queue_add(pipe, amounts, now)
            pipe.hgetall(self.key)
            raw = pipe.execute()[-1]
        return decayed_values(decode_hash(raw), now)[0]


def read_usage(store: RedisStore, policy: Policy, now: float | None = None) -> UsageSnapshot:
    """The current usage snapshot, for readers (dashboard, CLI); adds nothing."""
    now = time.time() if now is None else now
    values = UsageStore(store, policy.fair_share.half_life_s).add_and_read({}, now)
    return UsageSnapshot.from_values(values, now, policy)


class UsageSource:
    """Live-view source ``usage``: ships this process's publishes, reads everyone's usage.

    The priority stage appends ``(tenant, tier, cost_s)`` to :attr:`pending` (a deque
    append, atomic and about 50 ns); each refresh round adds them up and sends them.
    """

    name = USAGE_SOURCE
    initial = UsageSnapshot()

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.time,
                 read_budget: float | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.pending: deque[tuple[str, str, float]] = deque(maxlen=PENDING_LIMIT)
        self._carry: dict[str, float] = {}  # a batch the store did not take last time
        #: Share of a core the hash re-reads may take (None: every round). The hash has a
        #: few fields per active tenant: with thousands, reading it every round would cost
        #: each process a good part of a core; between reads the batches still ship.
        self.read_budget = read_budget
        self._next_read = 0.0

    def drain(self) -> dict[str, float]:
        """Sum what was published since the last round into usage-hash increments."""
        amounts, self._carry = self._carry, {}
        pending = self.pending
        for _ in range(len(pending)):
            tenant, tier, cost = pending.popleft()
            for name, amount in ((f"p:{tenant}", cost), (f"n:{tenant}", 1.0),
                                 (f"t:{tier}", 1.0)):
                amounts[name] = amounts.get(name, 0.0) + amount
        return amounts

    def fetch(self, store: RedisStore, previous: UsageSnapshot) -> UsageSnapshot:
        now = self.clock()
        amounts = self.drain()
        usage = UsageStore(store, self.policy.fair_share.half_life_s)
        started = time.monotonic()
        reread = self.read_budget is None or started >= self._next_read
        try:
            if not reread:
                usage.add(amounts, now)
                return previous
            values = usage.add_and_read(amounts, now)
        except Exception:
            self._carry = amounts  # sent with the next round (a sum: bounded in size)
            raise
        snapshot = UsageSnapshot.from_values(values, now, self.policy)
        if self.read_budget is not None:
            self._next_read = started + (time.monotonic() - started) / self.read_budget
        return snapshot


def _unlisted_weight(policy: Policy) -> float:
    spec = policy.tenant_spec("")
    return spec.weight if spec is not None else 1.0
