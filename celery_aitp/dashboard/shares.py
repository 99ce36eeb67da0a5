"""Work shares behind the tenants page, computed from the window's run records (pure).

* **work share** of tenant *i*: its run time in the window over everyone's,
  ``s_i = r_i / sum_j r_j`` (runs without a run time are skipped).
* **fair share**: its weight over the weights of the tenants *active* in the window,
  ``f_i = w_i / sum_{j active} w_j``. Idle tenants do not hold a share, as in any
  work-conserving scheduler.

Jain's fairness index and the priority entropy are not computed here: the page shows the
scheduler's own figures (:mod:`celery_aitp.fairness` over the decayed usage).
"""

from __future__ import annotations

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
