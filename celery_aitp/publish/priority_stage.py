"""The ``priority`` stage: tiers are size classes, shortest (most urgent) work first.

    urgency   = sum(weight_f * factor_f) / sum(weight_f)     f: tenant, sla, impact,
                                                             resources, age (scheduling.factors)
    effective = size / (urgency_range ** urgency * boost)    (boost:
                                                             scheduling/feedback.py)
    size      = a model's predicted runtime at placement.size_quantile (the median by
                default), else the history's bound, else a declared hint
    tier      = the size class of ``effective`` among the fleet's recent effective sizes
                on the task's accelerator class (scheduling/size_classes.py)
          -> raised to the task's declared tier if that is higher (a floor)
          -> lowered to the tenant's max_tier if above it (the cap; nothing raises it)
          -> one tier lower while the tenant is above its fair share

The median, because it is what orders uncertain sizes for the mean slowdown: swapping two
neighbours ``i, j`` in a non-preemptive order changes the expected sum of slowdowns by
``E[S_i] E[1/S_j] - E[S_j] E[1/S_i]``, so the best order ranks by ``E[S] / E[1/S]``,
which for a log-normal runtime is the median squared, however wide the spread (Smith's
rule with random sizes). Ranked by the p90, a task with a wide prediction counted as a
long one and waited behind longer work (public logs: docs/placement.md). A task with no
prediction at all, or on an accelerator class with too few recent sizes to draw
boundaries from (a model's and the cold start's each have their own; either stands in
for the other until it has some), takes the lowest tier (or its floor), as before
anything is known.

What does not change between publishes of the same task by the same tenant (tenant,
SLA, declared labels, resources, urgency) is computed once and cached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from statistics import NormalDist
from typing import Any, NamedTuple

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import MODEL_PREDICTION, Decision, Request, runtime_hint
from celery_aitp.core.running import running_origin
from celery_aitp.core.view import View
from celery_aitp.policy import Policy
from celery_aitp.priority_policy import URGENCY_FACTORS
from celery_aitp.scheduling.factors import (
    age_factor,
    resource_demand,
    sla_factor,
    tenant_factor,
)
from celery_aitp.scheduling.feedback import BOOSTS_SOURCE, Boosts, BoostSource
from celery_aitp.scheduling.size_classes import SizeClasses
from celery_aitp.scheduling.size_source import SIZES_SOURCE, SizeSource
from celery_aitp.scheduling.usage import USAGE_SOURCE, UsageSource, is_demoted

#: Labels accepted in one ``aitp_labels`` header; more is bad input.
MAX_HEADER_LABELS = 16
CACHE_LIMIT = 20_000
_NO_CLASSES = SizeClasses()
_NO_BOOSTS = Boosts()


class Charge(NamedTuple):
    """What one placed task adds to a shared tally: ``item`` appended to ``pending``
    (fair-share usage, or the size histogram), drained by that tally's source."""

    pending: Any  # a deque
    item: tuple[Any, ...]


class _Static:
    """The per-(task, tenant) part of the placement."""

    __slots__ = ("declared", "profile", "factors", "partial", "floor", "cap", "hint",
                 "notes")

    def __init__(self, declared: Mapping[str, Any], profile: Any,
                 factors: dict[str, float], partial: float, floor: int | None, cap: int,
                 notes: tuple[str, ...]) -> None:
        self.declared = declared
        self.profile = profile
        self.factors = factors  # tenant, sla, impact, resources (age: per publish)
        self.partial = partial  # their weighted sum
        self.floor = floor
        self.cap = cap
        self.hint = runtime_hint(declared)
        self.notes = notes


#: Share of one core a process's fair-share usage re-reads may take (see UsageSource).
USAGE_READ_BUDGET = 0.05


class PriorityStage:
    """Fills ``tier``, ``score`` (the urgency), ``factors`` and ``tier_steps``; charges
    fair-share usage and the size histogram."""

    name = "priority"

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        # In real time (not a replay's simulated clock) the usage re-reads keep to a budget.
        self.usage = UsageSource(policy, clock,
                                 USAGE_READ_BUDGET if clock is time.time else None)
        self.sizes = SizeSource(policy.placement, len(policy.tiers), clock)
        self.sources = (self.usage, self.sizes, BoostSource(policy))
        self.keyed_sources = (USAGE_SOURCE,)  # read through memo_key only
        p = policy.priority
        self.settings = p
        self.weights = {f: float(getattr(p.weights, f)) for f in URGENCY_FACTORS}
        self.total = sum(self.weights.values()) or 1.0
        self.urgency_range = policy.placement.urgency_range
        self.size_power = quantile_power(policy.placement.size_quantile)
        self.names = policy.tier_names
        self.lowest = len(self.names) - 1
        self.rank = {name: i for i, name in enumerate(self.names)}
        self.cap = {t: self.rank[s.max_tier] if s.max_tier else 0
                    for t, s in policy.tenants.items()}
        slas = [t.sla_s for t in policy.tiers]
        self.sla_range = (min(slas), max(slas))
        self.tier_sla = {t.name: t.sla_s for t in policy.tiers}
        self.tenant_sla = {t: s.sla_s for t, s in policy.tenants.items()}
        # Tenants the policy does not list have their class's cap and SLA (the default
        # tenant's otherwise: TenantStage gives them no other name).
        unlisted = policy.tenant_spec("") or policy.tenants[policy.default_tenant]
        self.unlisted_cap = self.rank[unlisted.max_tier] if unlisted.max_tier else 0
        self.unlisted_sla = unlisted.sla_s
        self.default_floor = (self.rank[policy.default_tier]
                              if policy.default_tier is not None else None)
        self.labels = dict(policy.labels)
        self.fair_share = policy.fair_share.enabled
        self.default_cost = policy.fair_share.default_cost_s
        self._cache: BoundedDict[tuple[str, str], _Static] = BoundedDict(CACHE_LIMIT)
        self._fitted: tuple[Any, SizeClasses] = (_NO_CLASSES, _NO_CLASSES)

    # --- the cached part ------------------------------------------------------------

    def _label_impact(self, names: Any, notes: list[str], bad: str) -> float:
        if isinstance(names, str):
            names = names.split(",")
        if not isinstance(names, (list, tuple)) or len(names) > MAX_HEADER_LABELS:
            notes.append(bad)
            return 0.0
        impact = 0.0
        unknown = False
        for name in names:
            weight = self.labels.get(name.strip()) if isinstance(name, str) else None
            if weight is None:
                unknown = True
            elif weight > impact:
                impact = weight
        if unknown:
            notes.append("labels_unknown")
        return impact

    def _static(self, request: Request, tenant: str, profile: Any) -> _Static:
        declared = request.declared
        notes: list[str] = []
        floor = self.default_floor
        sla: float | None = self.tenant_sla.get(tenant, self.unlisted_sla)
        wanted = declared.get("tier")
        if wanted is not None:
            rank = self.rank.get(wanted) if isinstance(wanted, str) else None
            if rank is None:
                notes.append("tier_unknown")
            else:
                floor = rank
                tier_sla = self.tier_sla[wanted]
                sla = tier_sla if sla is None else min(sla, tier_sla)
        impact = 0.0
        if declared.get("labels") is not None:
            impact = self._label_impact(declared["labels"], notes, "labels_invalid")
        declared_impact = declared.get("impact")
        if isinstance(declared_impact, (int, float)) and not isinstance(declared_impact, bool):
            impact = max(impact, min(1.0, max(0.0, float(declared_impact))))
        p = self.settings
        resources = resource_demand(profile, self.policy.default_accelerator,
                                    p.memory_scale_mb, p.cpu_scale_cores)
        if p.favor_small:
            resources = 1.0 - resources
        cap = self.cap.get(tenant, self.unlisted_cap)
        factors = {"tenant": tenant_factor(cap, len(self.names)),
                   "sla": sla_factor(sla, *self.sla_range), "impact": impact,
                   "resources": resources}
        partial = sum(self.weights[name] * value for name, value in factors.items())
        return _Static(declared, profile, factors, partial, floor, cap, tuple(notes))

    def _cached(self, request: Request, decision: Decision) -> _Static:
        key = (request.task, decision.tenant)
        static = self._cache.get(key)
        if static is None or static.declared is not request.declared or \
                static.profile is not decision.profile:
            static = self._cache.put(key, self._static(request, decision.tenant,
                                                       decision.profile))
        return static

    # --- per publish ----------------------------------------------------------------

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        static = self._cached(request, decision)
        if static.notes:
            decision.notes.extend(static.notes)
        factors = dict(static.factors)
        if "aitp_labels" in request.headers:
            factors["impact"] = self._header_impact(request.headers["aitp_labels"],
                                                    factors["impact"], decision)
        now = decision.decided_at
        factors["age"] = 0.0
        if request.retries:
            origin = _origin(request, now)
            decision.origin_at = origin
            factors["age"] = age_factor(now - origin, self.settings.max_age_s)
        else:
            decision.origin_at = now
        urgency = (static.partial + self.weights["impact"] * (factors["impact"]
                                                              - static.factors["impact"])
                   + self.weights["age"] * factors["age"]) / self.total
        size = _size_of(decision, static.hint, self.size_power)
        boost = view.sources.get(BOOSTS_SOURCE, _NO_BOOSTS).of(decision.tenant)
        effective = None if size is None else size / (self.urgency_range ** urgency * boost)
        classes = self._classes(view)
        sizes_of = bounds_family(classes, size_family(decision))
        by_size = classes.rank(sizes_of, effective, self.lowest)
        demoted = self._demoted(decision.tenant, view)
        rank = by_size
        if static.floor is not None and static.floor < rank:
            rank = static.floor
        if rank < static.cap:
            rank = static.cap  # the tenant's max_tier: nothing raises a task above it
        demoted = demoted and rank < self.lowest
        if demoted:
            rank += 1
        names = self.names
        decision.tier = names[rank]
        decision.tier_steps = {
            "size": names[by_size], "effective_size_s": effective,
            "bounds_s": classes.as_dict().get(sizes_of), "bounds_of": sizes_of,
            "floor": names[static.floor] if static.floor is not None else None,
            "cap": names[static.cap], "fair_share": demoted, "boost": boost}
        decision.score = urgency
        decision.factors = factors
        for charge in self.charges_of(decision):
            charge.pending.append(charge.item)

    def _classes(self, view: View) -> SizeClasses:
        """The view's size boundaries made for this policy's number of tiers. The value
        in the view may have been drawn for another (a pipeline rebuilt for a new policy
        sees its predecessor's until its own source has fetched once): ranked by those,
        a size could get a rank past the lowest tier (IndexError). Checked once per
        value."""
        found = view.sources.get(SIZES_SOURCE, _NO_CLASSES)
        seen, fitted = self._fitted
        if found is not seen:
            fitted = found.for_tiers(len(self.names))
            self._fitted = (found, fitted)
        return fitted

    def memo_key(self, request: Request, decision: Decision, view: View
                 ) -> tuple[bool] | None:
        """Whether the tenant is above its fair share; None for a retry (its age
        factor grows with time) or a task with an ``aitp_labels`` header (read per
        publish). The rest is the task, tenant and prediction, and the view (the size
        boundaries included)."""
        if request.retries or "aitp_labels" in request.headers:
            return None
        return (self._demoted(decision.tenant, view),)

    def _demoted(self, tenant: str, view: View) -> bool:
        return self.fair_share and is_demoted(view.sources, tenant)

    def charges_of(self, decision: Decision) -> tuple[Charge, ...]:
        """What a placed decision adds to the shared tallies:
        its tenant's fair-share usage (the predicted runtime, or
        ``fair_share.default_cost_s`` without one) and, with a size, the histogram the
        tier boundaries come from."""
        runtime_s = decision.predicted_runtime_s
        usage = Charge(self.usage.pending, (decision.tenant, decision.tier, runtime_s
                                            if runtime_s is not None and runtime_s >= 0
                                            else self.default_cost))
        effective = (decision.tier_steps or {}).get("effective_size_s")
        if effective is None:
            return (usage,)
        return usage, Charge(self.sizes.pending, (size_family(decision), effective))

    def _header_impact(self, raw: Any, impact: float, decision: Decision) -> float:
        if not self.settings.header_labels:
            decision.notes.append("labels_ignored")
            return impact
        return max(impact, self._label_impact(raw, decision.notes, "labels_invalid"))


#: Prediction sources of the cold start: the history's bounds, per task or per magnitude
#: class of a task, and a repeated call's own runs. They are ranked together: ranked
#: apart, the calls that repeat (a task's short calls, typically) were split into tiers
#: among themselves, and half of them took the lowest tier beside the long tasks
#: (placement benchmark, bimodal: cold start 0.94x FIFO's against 0.59x).
HISTORY_SOURCES = frozenset({"call_history", "size_history", "history", "task_history"})
#: Suffix of the size histogram (and boundaries) of those sizes.
HISTORY_FAMILY = "~history"


def size_family(decision: Decision) -> str:
    """Which histogram a task's size joins and is ranked in: its accelerator class's, or,
    for a cold-start size (the history's bound for the whole task, or for its calls of
    one magnitude), that class's ``~history`` one.

    The two kinds of size do not mix: a cold-start bound is the longest recent run of the
    task (or of a magnitude class), the same for all its calls, and a model's prediction
    is per call. Ranked among recent cold-start bounds, a model's sizes right after a
    model is promoted (about a thousand tasks, the window) were all shorter than the
    bounds' mass and all took the top tier (placement benchmark, pareto: 445 of 473 tasks
    in ``hi``, no better than FIFO).
    """
    if decision.prediction_source in HISTORY_SOURCES:
        return decision.accelerator + HISTORY_FAMILY
    return decision.accelerator


def bounds_family(classes: SizeClasses, family: str) -> str:
    """The histogram whose boundaries rank a size of ``family``: its own, or, while it
    has none, the other kind of size's on the same accelerator class.

    Without a stand-in, every task of a newly promoted model took the lowest tier until
    the model's own histogram held ``placement.min_samples`` sizes and the producer had
    read it back (placement benchmark, pareto: 33 of the run's first 101 tasks, short
    ones too, waited there behind the long work, up to 3.3x FIFO's longest wait). Ranked
    among cold-start bounds (the longest recent runs), a model's sizes land a tier too
    high at worst, for those few seconds; a cold-start bound ranked among a model's
    medians lands lower, never ahead of the short work."""
    if family in classes.bounds:
        return family
    if family.endswith(HISTORY_FAMILY):
        other = family[:-len(HISTORY_FAMILY)]
    else:
        other = family + HISTORY_FAMILY
    return other if other in classes.bounds else family


def quantile_power(quantile: float) -> float:
    """Where ``quantile`` of a log-normal runtime lies between its median (0) and its p90
    (1), on a log scale: a model predicts those two quantiles, and the others follow."""
    normal = NormalDist()
    return normal.inv_cdf(quantile) / normal.inv_cdf(0.9)


def _size_of(decision: Decision, hint: float | None, power: float) -> float | None:
    """The size a task is placed by: a model's prediction at the policy's quantile
    (``power``: :func:`quantile_power`); a history estimate's bound (the p90 field: the
    longest recent run, the same for every call of a task or magnitude class, so its
    calls keep one tier); else the p50, else the hint."""
    p50, p90 = decision.predicted_runtime_s, decision.predicted_p90_s
    if decision.prediction_source == MODEL_PREDICTION and p50 is not None and p90 is not None \
            and 0 < p50 < p90:
        return p50 * (p90 / p50) ** power
    for value in (p90, p50, hint):
        if value is not None and value >= 0:
            return float(value)
    return None


def _origin(request: Request, now: float) -> float:
    """When the task was first published: for a retry, what the running task's own header
    says (the worker received it from the middleware). An ``aitp`` header a caller passes
    in is never read: it could claim any age and so a higher score.
    """
    if not request.retries:
        return now
    origin = running_origin(request.task_id)
    if origin is not None and 0 < origin <= now:
        return origin
    return now
