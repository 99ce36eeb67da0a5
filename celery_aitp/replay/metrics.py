"""Scheduling quality of one run: waits, slowdown, SLA hits and fairness, per group.

One definition for the replay simulator and the scheduling benchmark, so their tables
mean the same thing:

- wait: start minus publish, seconds; p50/p95 are linear-interpolated percentiles.
- slowdown: bounded slowdown ``(wait + runtime) / max(runtime, tau)``, floored at 1
  (Feitelson's bounded slowdown: with ``tau`` 0.1 s, a 5 ms task that waits 1 s counts
  11, not 201; batch traces use a larger ``tau``, e.g. 10 s).
- short and long: the fastest 80% of the tasks by true runtime, and the slowest 20%
  (:data:`SHORT_SHARE`), so the groups do not depend on any policy's decisions.
- SLA hit: share of tasks whose wait is within their tier's ``sla_s``.
- Jain's index over tenants' mean slowdowns: ``(sum x)^2 / (n * sum x^2)``; 1 means every
  tenant is slowed down alike (FIFO spreads delay evenly by construction; tiers
  concentrate it on the lowest tier by design).

numpy (the ``replay`` extra) is imported by the functions that compute, so the package
imports without it (see :mod:`celery_aitp.extras`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery_aitp.fairness import jain_index

if TYPE_CHECKING:
    import numpy as np

#: Runtime floor of the bounded slowdown, seconds.
TAU_S = 0.1
#: Waits shorter than this are the simulated clock's rounding (seconds): read as none.
WAIT_NOISE_S = 1e-6
#: Share of the tasks, fastest first by true runtime, that count as short.
SHORT_SHARE = 0.8


@dataclass(frozen=True)
class GroupStats:
    """Figures of one group of tasks (a tier, a tenant, or all)."""

    kind: str  # 'tier', 'tenant' or 'all'
    name: str
    tasks: int
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    mean_slowdown: float
    sla_hit: float | None  # None when no task of the group has an SLA


@dataclass
class RunStats:
    """Every group of one run, plus run-wide figures."""

    run: str
    groups: list[GroupStats] = field(default_factory=list)
    jain: float | None = None  # None: no tenant
    lost: int = 0

    def group(self, kind: str, name: str) -> GroupStats | None:
        for g in self.groups:
            if g.kind == kind and g.name == name:
                return g
        return None

    @property
    def overall(self) -> GroupStats:
        found = self.group("all", "all")
        assert found is not None
        return found


def bounded_slowdown(wait: np.ndarray, runtime: np.ndarray, tau_s: float = TAU_S
                     ) -> np.ndarray:
    import numpy as np

    return np.maximum(1.0, (wait + runtime) / np.maximum(runtime, tau_s))


def short_mask(runtime: Sequence[float], share: float = SHORT_SHARE) -> list[bool]:
    """Which tasks are short: the fastest ``share`` by true runtime (ties by position,
    so exactly ``round(share * n)`` are short)."""
    order = sorted(range(len(runtime)), key=lambda i: (runtime[i], i))
    short = [False] * len(runtime)
    for i in order[: round(share * len(runtime))]:
        short[i] = True
    return short


def _group(kind: str, name: str, wait: np.ndarray, slow: np.ndarray,
           sla: np.ndarray) -> GroupStats:
    import numpy as np

    has_sla = ~np.isnan(sla)
    hit = float(np.mean(wait[has_sla] <= sla[has_sla])) if has_sla.any() else None
    p50, p95 = np.percentile(wait, [50, 95])
    return GroupStats(kind, name, int(wait.size), float(p50), float(p95), float(wait.max()),
                      float(slow.mean()), hit)


def run_stats(run: str, wait: Sequence[float], runtime: Sequence[float],
              tiers: Sequence[str], tenants: Sequence[str], sla_by_tier: Mapping[str, float],
              tier_order: Sequence[str] = (), lost: int = 0, tau_s: float = TAU_S,
              short: Sequence[bool] | None = None) -> RunStats:
    """Figures per tier (in ``tier_order`` first), per tenant, short and long (when
    ``short`` marks them) and overall."""
    import numpy as np

    w = np.asarray(wait, dtype=float)
    w = np.where(w < WAIT_NOISE_S, 0.0, w)  # the simulated clock's rounding, not a wait
    r = np.asarray(runtime, dtype=float)
    tier_arr = np.asarray(tiers, dtype=object)
    tenant_arr = np.asarray(tenants, dtype=object)
    sla = np.asarray([sla_by_tier.get(t, np.nan) for t in tiers], dtype=float)
    slow = bounded_slowdown(w, r, tau_s)
    stats = RunStats(run, lost=lost)
    if w.size == 0:
        return stats
    known = [t for t in tier_order if t in set(tiers)]
    for name in known + sorted(set(tiers) - set(known)):
        mask = tier_arr == name
        stats.groups.append(_group("tier", name, w[mask], slow[mask], sla[mask]))
    tenant_slowdowns = []
    for name in sorted(set(tenants)):
        mask = tenant_arr == name
        group = _group("tenant", name, w[mask], slow[mask], sla[mask])
        stats.groups.append(group)
        tenant_slowdowns.append(group.mean_slowdown)
    if short is not None:
        is_short = np.asarray(short, dtype=bool)
        for name, mask in (("short", is_short), ("long", ~is_short)):
            if mask.any():
                stats.groups.append(_group("size", name, w[mask], slow[mask], sla[mask]))
    stats.groups.append(_group("all", "all", w, slow, sla))
    stats.jain = jain_index(tenant_slowdowns)  # one definition: celery_aitp.fairness
    return stats


@dataclass(frozen=True)
class Target:
    """One of the scheduling targets, measured."""

    name: str
    value: float
    limit: float

    @property
    def met(self) -> bool:
        return self.value <= self.limit


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return 0.0 if a <= 0 else float("inf")


def _tier(run: RunStats, tier: str) -> GroupStats:
    found = run.group("tier", tier)
    assert found is not None
    return found


def ran(*runs: RunStats) -> bool:
    """Whether each of ``runs`` ran some task: one whose tasks were all lost (sent to a
    class no worker serves) has nothing to compare, and no targets are computed."""
    return all(run.group("all", "all") is not None for run in runs)


def targets(fifo: RunStats, policy: RunStats, oracle: RunStats,
            tier_order: Sequence[str]) -> list[Target]:
    """The issue's three targets: top tier p95 vs FIFO, slowdown vs oracle, lowest tier max.

    Tier groups compare the same tasks: callers label every run with the tier the policy
    run gave each task.
    """
    if not ran(fifo, policy, oracle):
        return []
    present = [t for t in tier_order if policy.group("tier", t) and fifo.group("tier", t)]
    out = [Target("mean slowdown / oracle's",
                  _ratio(policy.overall.mean_slowdown, oracle.overall.mean_slowdown), 1.15)]
    if present:
        top, low = present[0], present[-1]
        out.insert(0, Target(f"{top} tier p95 wait / FIFO's",
                             _ratio(_tier(policy, top).wait_p95_s, _tier(fifo, top).wait_p95_s),
                             0.2))
        out.append(Target(f"{low} tier longest wait / FIFO's",
                          _ratio(_tier(policy, low).wait_max_s, _tier(fifo, low).wait_max_s),
                          2.0))
    return out


def size_targets(fifo: RunStats, policy: RunStats, oracle: RunStats) -> list[Target]:
    """Issue 17's targets on groups by true runtime (short: the fastest 80%), which every
    run shares whatever tiers it gave: mean slowdown at most 0.5x FIFO's and 1.2x the
    oracle's, short tasks' p95 wait at most 0.3x FIFO's, long tasks' longest wait at most
    2x FIFO's."""
    if not ran(fifo, policy, oracle):
        return []
    out = [Target("mean slowdown / FIFO's",
                  _ratio(policy.overall.mean_slowdown, fifo.overall.mean_slowdown), 0.5),
           Target("mean slowdown / oracle's",
                  _ratio(policy.overall.mean_slowdown, oracle.overall.mean_slowdown), 1.2)]
    short, short_fifo = policy.group("size", "short"), fifo.group("size", "short")
    if short is not None and short_fifo is not None:
        out.append(Target("short tasks' p95 wait / FIFO's",
                          _ratio(short.wait_p95_s, short_fifo.wait_p95_s), 0.3))
    long, long_fifo = policy.group("size", "long"), fifo.group("size", "long")
    if long is not None and long_fifo is not None:
        out.append(Target("long tasks' longest wait / FIFO's",
                          _ratio(long.wait_max_s, long_fifo.wait_max_s), 2.0))
    return out


def cold_start_target(fifo: RunStats, cold: RunStats) -> Target | None:
    """Cold start (no model, history only) must not be worse than FIFO: mean slowdown."""
    if not ran(fifo, cold):
        return None
    return Target("cold start mean slowdown / FIFO's",
                  _ratio(cold.overall.mean_slowdown, fifo.overall.mean_slowdown), 1.0)
