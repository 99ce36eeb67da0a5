"""Fairness metrics as plain functions: Jain's index, max-min fair shares, tier entropy.

Pure (no I/O, no Celery), so the dashboard, Prometheus exporters, tests and benchmarks
compute the same numbers from the same inputs. The store keeps what they need (decayed
per-tenant usage and per-tier decision counts, see :mod:`celery_aitp.scheduling.usage`).

Formulas
--------
* Weighted max-min fair allocation of a capacity ``C`` between tenants with demands
  ``d_i`` and weights ``w_i`` (water filling): every tenant gets ``min(d_i, w_i * L)``,
  with the level ``L`` chosen so the allocations sum to ``min(C, sum(d_i))``.
* Jain's fairness index of allocations ``x_1..x_n``: ``(sum x)^2 / (n * sum x^2)``; 1 when
  all are equal, ``1/n`` when one tenant gets everything.
* Fairness of served work (Jain, Chiu and Hawe's normalised form): Jain's index of
  ``served_i / fair_i`` where ``fair_i`` is the max-min fair allocation of the work
  actually served, given each tenant's demand. A tenant that asked for little and got
  all of it scores 1, as does a flooding tenant that got the rest; a tenant that got
  less than its fair allocation pulls the index below 1.
* Priority-distribution entropy: ``-sum p_t * log(p_t) / log(k)`` over the share ``p_t``
  of decisions that went to each of the ``k`` tiers; 0 when every task gets the same
  tier (the priority carries no information), 1 when tiers are used evenly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's index of non-negative values; None when there are none or all are zero."""
    xs = [max(0.0, float(v)) for v in values]
    total = sum(xs)
    squares = sum(x * x for x in xs)
    if not xs or squares <= 0:
        return None
    return total * total / (len(xs) * squares)


def max_min_fair(demands: Mapping[str, float], capacity: float,
                 weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Weighted max-min fair allocation (water filling) of ``capacity``."""
    weights = weights or {}
    remaining = {k: max(0.0, float(d)) for k, d in demands.items()}
    alloc = dict.fromkeys(remaining, 0.0)
    left = max(0.0, float(capacity))
    active = {k for k, d in remaining.items() if d > 0}
    while active and left > 1e-12:
        total_w = sum(max(weights.get(k, 1.0), 1e-12) for k in active)
        level = left / total_w
        satisfied = {k for k in active if remaining[k] <= level * weights.get(k, 1.0)}
        if not satisfied:  # nobody is capped: split what is left by weight
            for k in active:
                alloc[k] += level * weights.get(k, 1.0)
            break
        for k in satisfied:
            alloc[k] += remaining[k]
            left -= remaining[k]
            remaining[k] = 0.0
        active -= satisfied
    return alloc


def served_fairness(served: Mapping[str, float], demanded: Mapping[str, float],
                    weights: Mapping[str, float] | None = None) -> float | None:
    """Jain's index of served work normalised by each tenant's max-min fair allocation.

    ``served`` and ``demanded`` are in the same unit (e.g. runtime seconds); only tenants
    that demanded something count. None when nobody demanded anything.
    """
    tenants = [t for t, d in demanded.items() if d > 0]
    if not tenants:
        return None
    capacity = sum(max(0.0, served.get(t, 0.0)) for t in tenants)
    fair = max_min_fair({t: demanded[t] for t in tenants}, capacity, weights)
    ratios = [served.get(t, 0.0) / fair[t] for t in tenants if fair[t] > 0]
    return jain_index(ratios)


def tier_entropy(counts: Mapping[str, float], tiers: Iterable[str] | None = None) -> float | None:
    """Normalised entropy of the tier distribution; None without any decision."""
    names = list(tiers) if tiers is not None else list(counts)
    values = [max(0.0, float(counts.get(t, 0.0))) for t in names]
    total = sum(values)
    if total <= 0 or len(names) < 2:
        return None
    h = -sum((v / total) * math.log(v / total) for v in values if v > 0)
    return max(0.0, h / math.log(len(names)))
