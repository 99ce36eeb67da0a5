"""Fairness and priority-spread figures, computed from run and decision records (pure).

Definitions (the README's metrics reference repeats them):

* **work share** of tenant *i*: its run time in the window over everyone's,
  ``s_i = r_i / sum_j r_j`` (a run without a run time counts as one second's worth of
  nothing: it is skipped).
* **fair share**: its weight over the weights of the tenants *active* in the window,
  ``f_i = w_i / sum_{j active} w_j``. Idle tenants do not hold a share, as in any
  work-conserving scheduler.
* **Jain's fairness index** over the active tenants of ``x_i = s_i / f_i``:
  ``J = (sum x_i)^2 / (n * sum x_i^2)``; 1 when every tenant gets exactly its fair share,
  ``1/n`` when one tenant gets everything.
* **priority entropy**: Shannon entropy, in bits, of the tier distribution of the decisions
  in the window, ``H = -sum_t p_t log2 p_t``; 0 when every task gets the same tier (the
  priority carries no information), ``log2(#tiers)`` when tiers are used evenly. The
  normalised value divides by ``log2(#tiers)``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping


def work_shares(runtime_by_tenant: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's share of the total run time (empty when nothing ran)."""
    total = sum(v for v in runtime_by_tenant.values() if v > 0)
    if total <= 0:
        return {}
    return {t: max(0.0, v) / total for t, v in runtime_by_tenant.items()}


def fair_shares(weights: Mapping[str, float], active: Iterable[str]) -> dict[str, float]:
    """Weight over the total weight of the active tenants (unknown tenants weigh 1)."""
    active = list(dict.fromkeys(active))
    total = sum(weights.get(t, 1.0) for t in active)
    if total <= 0:
        return {}
    return {t: weights.get(t, 1.0) / total for t in active}


def jain_index(shares: Mapping[str, float], fair: Mapping[str, float]) -> float | None:
    """Jain's index of share/fair-share over the tenants that have a fair share."""
    ratios = [shares.get(t, 0.0) / f for t, f in fair.items() if f > 0]
    if not ratios:
        return None
    squares = sum(x * x for x in ratios)
    if squares == 0:
        return None
    return sum(ratios) ** 2 / (len(ratios) * squares)


def priority_entropy(tiers: Iterable[str]) -> float | None:
    """Shannon entropy (bits) of the tier distribution; None without decisions."""
    counts = Counter(t for t in tiers if t)
    total = sum(counts.values())
    if total == 0:
        return None
    entropy = -sum((n / total) * math.log2(n / total) for n in counts.values())
    return entropy + 0.0  # never -0.0


def normalised_entropy(entropy: float | None, n_tiers: int) -> float | None:
    """Entropy over its maximum, ``log2(n_tiers)``, in [0, 1]."""
    if entropy is None or n_tiers < 2:
        return None
    return min(1.0, entropy / math.log2(n_tiers))
