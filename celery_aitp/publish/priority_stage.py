"""The ``priority`` stage: a weighted score of normalised factors, mapped to a tier.

    score = sum(weight_f * factor_f) / sum(weight_f)        (factors: scheduling.factors)
    tier  = highest tier whose min_score <= score
          -> raised to the task's declared tier if that is higher (a floor)
          -> lowered to the tenant's max_tier if above it (the cap; nothing raises it)
          -> one tier lower while the tenant is above its fair share

What does not change between publishes of the same task by the same tenant (tenant,
SLA, declared labels, resources) is computed once and cached; per publish remain the
runtime and age factors, header labels, the tier lookup and the usage charge.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from math import log
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.priority_policy import FACTORS
from celery_aitp.publish.live_view import View
from celery_aitp.publish.request import Decision, Request
from celery_aitp.scheduling.factors import (
    age_factor,
    resource_demand,
    sla_factor,
    tenant_factor,
)
from celery_aitp.scheduling.usage import USAGE_SOURCE, UsageSource
from celery_aitp.worker.running import running_origin

#: Labels accepted in one ``aitp_labels`` header; more is bad input.
MAX_HEADER_LABELS = 16
CACHE_LIMIT = 20_000


class _Static:
    """The per-(task, tenant) part of the score."""

    __slots__ = ("declared", "profile", "tenant", "sla", "impact", "resources", "partial",
                 "floor", "cap", "lowest", "names", "hint", "notes", "_placed")

    def __init__(self, declared: Mapping[str, Any], profile: Any, factors: tuple[float, ...],
                 partial: float, floor: int | None, cap: int, names: tuple[str, ...],
                 notes: tuple[str, ...]) -> None:
        self.declared = declared
        self.profile = profile
        self.tenant, self.sla, self.impact, self.resources = factors
        self.partial = partial  # weighted tenant + sla + resources
        self.floor = floor
        self.cap = cap
        self.names = names
        self.lowest = len(names) - 1
        hint = declared.get("runtime_hint_s")
        self.hint = hint if isinstance(hint, (int, float)) and not isinstance(hint, bool) \
            else None
        self.notes = notes
        self._placed: dict[tuple[int, bool], tuple[str, dict[str, Any]]] = {}

    def place(self, by_score: int, demoted: bool) -> tuple[str, dict[str, Any]]:
        """The tier and the steps that led to it (cached: a handful per task and tenant)."""
        found = self._placed.get((by_score, demoted))
        if found is None:
            rank = by_score
            if self.floor is not None and self.floor < rank:
                rank = self.floor
            if rank < self.cap:
                rank = self.cap  # the tenant's max_tier: nothing raises a task above it
            demoted = demoted and rank < self.lowest
            if demoted:
                rank += 1
            names = self.names
            steps = {"score": names[by_score],
                     "floor": names[self.floor] if self.floor is not None else None,
                     "cap": names[self.cap], "fair_share": demoted}
            found = self._placed[(by_score, demoted)] = (names[rank], steps)
        return found


class PriorityStage:
    """Fills ``tier``, ``score``, ``factors`` and ``tier_steps``; charges fair-share usage."""

    name = "priority"

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.usage = UsageSource(policy, clock)
        self.sources = (self.usage,)
        p = policy.priority
        self.settings = p
        self.weights = {f: float(getattr(p.weights, f)) for f in FACTORS}
        self.total = sum(self.weights.values())
        self._w_impact = self.weights["impact"]
        self._w_runtime = self.weights["runtime"]
        self._w_age = self.weights["age"]
        self._rt_low, self._rt_high = p.runtime_min_s, p.runtime_max_s
        self._rt_span = log(p.runtime_max_s / p.runtime_min_s)
        self.names = policy.tier_names
        self.rank = {name: i for i, name in enumerate(self.names)}
        self.min_scores = policy.tier_min_scores()
        self.cap = {t: self.rank[s.max_tier] if s.max_tier else 0
                    for t, s in policy.tenants.items()}
        slas = [t.sla_s for t in policy.tiers]
        self.sla_range = (min(slas), max(slas))
        self.tier_sla = {t.name: t.sla_s for t in policy.tiers}
        self.tenant_sla = {t: s.sla_s for t, s in policy.tenants.items()}
        self.default_floor = (self.rank[policy.default_tier]
                              if policy.default_tier is not None else None)
        self.labels = dict(policy.labels)
        self.fair_share = policy.fair_share.enabled
        self.default_cost = policy.fair_share.default_cost_s
        self._cache: dict[tuple[str, str], _Static] = {}

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
        sla: float | None = self.tenant_sla.get(tenant)
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
        cap = self.cap.get(tenant, 0)
        tenant_f = tenant_factor(cap, len(self.names))
        sla_f = sla_factor(sla, *self.sla_range)
        w = self.weights
        partial = w["tenant"] * tenant_f + w["sla"] * sla_f + w["resources"] * resources
        return _Static(declared, profile, (tenant_f, sla_f, impact, resources), partial, floor,
                       cap, self.names, tuple(notes))

    # --- per publish ----------------------------------------------------------------

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        tenant = decision.tenant
        profile = decision.profile
        key = (request.task, tenant)
        static = self._cache.get(key)
        if static is None or static.declared is not request.declared or \
                static.profile is not profile:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            static = self._cache[key] = self._static(request, tenant, profile)
        if static.notes:
            decision.notes.extend(static.notes)
        headers = request.headers
        impact = static.impact
        if "aitp_labels" in headers:
            impact = self._header_impact(headers["aitp_labels"], impact, decision)
        predicted = decision.predicted_p90_s
        if predicted is None:
            predicted = decision.predicted_runtime_s
            if predicted is None:
                predicted = static.hint
        runtime = self._runtime(predicted)
        now = decision.decided_at
        age = 0.0
        if request.retries:
            origin = _origin(request, now)
            decision.origin_at = origin
            age = age_factor(now - origin, self.settings.max_age_s)
        else:
            decision.origin_at = now
        score = self._score(static, impact, runtime, age)
        rank = self.rank_of(score)
        demoted = False
        if self.fair_share:
            usage = view.sources.get(USAGE_SOURCE)
            demoted = usage is not None and tenant in usage.demoted
        decision.tier, decision.tier_steps = static.place(rank, demoted)
        decision.score = score
        decision.factors = {"tenant": static.tenant, "sla": static.sla, "impact": impact,
                            "resources": static.resources, "runtime": runtime, "age": age}
        self.usage.pending.append(self.charge_of(decision))

    def _score(self, static: _Static, impact: float, runtime: float, age: float) -> float:
        return (static.partial + self._w_impact * impact + self._w_runtime * runtime
                + self._w_age * age) / self.total

    def rank_of(self, score: float) -> int:
        """The rank of the highest tier whose ``min_score`` the score reaches: the tier
        the score alone picks (before floor, cap and fair share)."""
        rank = 0
        for threshold in self.min_scores:
            if score >= threshold:
                break
            rank += 1
        return rank

    def rescore(self, task: str, tenant: str, p90: float) -> tuple[float, float, int] | None:
        """(runtime factor, score, rank) the stage gives a first publish of ``task`` for
        ``tenant`` with no ``aitp_labels`` header and a predicted p90 of ``p90``; None
        unless the stage has scored that task for that tenant already (its cached part,
        which a view or declaration change replaces, is all the rest depends on)."""
        static = self._cache.get((task, tenant))
        if static is None:
            return None
        runtime = self._runtime(p90)
        score = self._score(static, static.impact, runtime, 0.0)
        return runtime, score, self.rank_of(score)

    def charge_of(self, decision: Decision) -> tuple[str, str, float]:
        """What a decision adds to its tenant's fair-share usage: the predicted runtime,
        or ``fair_share.default_cost_s`` without one."""
        return self.charge_for(decision.tenant, decision.tier, decision.predicted_runtime_s)

    def charge_for(self, tenant: str, tier: str, runtime_s: float | None
                   ) -> tuple[str, str, float]:
        """``charge_of`` a decision for ``tenant`` at ``tier`` predicting ``runtime_s``."""
        return tenant, tier, runtime_s if runtime_s is not None and runtime_s >= 0 \
            else self.default_cost

    def _runtime(self, seconds: float | None) -> float:
        """``scheduling.factors.runtime_factor`` with the policy's constants precomputed."""
        if seconds is None or seconds != seconds:  # unknown (or NaN): neutral
            return 0.5
        if seconds <= self._rt_low:
            return 1.0
        if seconds >= self._rt_high:
            return 0.0
        return 1.0 - log(seconds / self._rt_low) / self._rt_span

    def _header_impact(self, raw: Any, impact: float, decision: Decision) -> float:
        if not self.settings.header_labels:
            decision.notes.append("labels_ignored")
            return impact
        return max(impact, self._label_impact(raw, decision.notes, "labels_invalid"))


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
