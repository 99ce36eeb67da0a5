"""Run the stages in order and return a Decision.

The stages fall in two halves. The *head* (tenant, features, predict) works out what
differs from task to task: who it is for and how long it will run. The *tail* (profile,
priority, route, gate, visibility) places the task. Each tail stage states what its
result depends on besides the head's results and the shared view (``memo_key``), so the
decision memo (:mod:`celery_aitp.publish.memo`) can hand one tail result to every task
with the same key without re-implementing any stage.

The spill stage (``spill``) runs when the policy enables it; it may send a task the gate
let through to the default queue (see :mod:`celery_aitp.publish.spill_stage`).

The default stage list is built from the policy in :func:`default_stages`; a later
capability swaps one entry (for example the oracle's predictor in a benchmark).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import Source, View
from celery_aitp.policy import Policy
from celery_aitp.publish.gate_stage import GateStage
from celery_aitp.publish.predict_stage import prediction_stages
from celery_aitp.publish.priority_stage import PriorityStage
from celery_aitp.publish.profile_stage import ProfileStage
from celery_aitp.publish.route_stage import RouteStage
from celery_aitp.publish.spill_stage import SpillStage
from celery_aitp.publish.stages import PublishStage
from celery_aitp.publish.tenant_stage import TenantStage
from celery_aitp.publish.visibility_stage import VisibilityStage
from celery_aitp.scheduling.spill import SpillSource

#: The fixed order of stage names; replacing a stage keeps its slot.
STAGE_ORDER = ("tenant", "features", "predict", "profile", "priority", "route", "gate",
               "spill", "visibility")
#: The head: stages every task runs, whose results go into the memo key.
HEAD = frozenset({"tenant", "features", "predict"})


def default_stages(policy: Policy, profile_refresh_s: float = 10.0,
                   clock: Callable[[], float] | None = None,
                   visibility_timeout_s: float | None = None,
                   producer_tenant: str | None = None) -> dict[str, PublishStage]:
    """The stages every deployment starts with; ``clock`` is simulated time in a replay
    (None: the wall clock, and the monotonic one where a stage measures intervals).

    ``visibility_timeout_s`` is the Redis transport's (None on other brokers): with it,
    and the policy's ``visibility_guard`` enabled, the visibility stage runs last.
    ``producer_tenant`` pins this process's tasks to one tenant (see ``TenantStage``).
    """
    wall = clock or time.time
    guard = policy.visibility_guard
    extra: dict[str, PublishStage] = {}
    if visibility_timeout_s is not None and guard.enabled:
        extra["visibility"] = VisibilityStage(guard, visibility_timeout_s)
    if policy.spill.enabled:
        extra["spill"] = SpillStage(policy, SpillSource(policy.spill, clock))
    return {
        "tenant": TenantStage(policy, producer_tenant),
        **prediction_stages(clock),
        "profile": ProfileStage(policy, profile_refresh_s, wall),
        "priority": PriorityStage(policy, wall),
        "route": RouteStage(policy),
        "gate": GateStage(),
        **extra,
    }


class Pipeline:
    """An ordered, immutable list of stages."""

    def __init__(self, stages: dict[str, PublishStage]) -> None:
        unknown = set(stages) - set(STAGE_ORDER)
        if unknown:
            raise ValueError(f"unknown pipeline stages: {sorted(unknown)} (known: {STAGE_ORDER})")
        self.stages: Sequence[PublishStage] = tuple(
            stages[name] for name in STAGE_ORDER if name in stages
        )
        self.head: Sequence[PublishStage] = tuple(s for s in self.stages if s.name in HEAD)
        self.tail: Sequence[PublishStage] = tuple(s for s in self.stages if s.name not in HEAD)
        #: The tail stages' ``memo_key`` methods (a stage whose ``memo_key`` is ``()``
        #: reads nothing per task beyond the key's head part), or None if a tail stage
        #: has no ``memo_key`` at all.
        keys = [getattr(stage, "memo_key", None) for stage in self.tail]
        self._tail_keys: tuple[Callable[..., tuple[Any, ...] | None], ...] | None = \
            None if None in keys else tuple(k for k in keys if callable(k))

    @property
    def memoizable(self) -> bool:
        """Whether every tail stage states what its result depends on."""
        return self._tail_keys is not None

    def sources(self) -> list[Source]:
        """Background-fetched state the stages declared (``stage.sources``), in order.

        Stages may share a source: it is listed (and fetched) once, under its name.
        """
        found: dict[str, Source] = {}
        for stage in self.stages:
            for source in getattr(stage, "sources", ()):
                found.setdefault(source.name, source)
        return list(found.values())

    def tail_view_sources(self) -> frozenset[str]:
        """Sources whose value the tail's result may depend on as a whole: those the tail
        stages declare, but not the ones they read only through their ``memo_key``
        (``keyed_sources``) nor the head's (its results are part of the key)."""
        head = {source.name for stage in self.head for source in getattr(stage, "sources", ())}
        names: set[str] = set()
        for stage in self.tail:
            keyed = set(getattr(stage, "keyed_sources", ()))
            names.update(source.name for source in getattr(stage, "sources", ())
                         if source.name not in keyed)
        return frozenset(names - head)

    def replace(self, name: str, stage: PublishStage) -> Pipeline:
        """A new pipeline with one stage swapped in (or added in its slot)."""
        current = {s.name: s for s in self.stages}
        current[name] = stage
        return Pipeline(current)

    def decide(self, request: Request, view: View, now: float) -> Decision:
        """Run every stage."""
        decision = self.start(request, view, now)
        self.finish(request, decision, view)
        return decision

    def start(self, request: Request, view: View, now: float) -> Decision:
        """A new decision with the head's results: tenant and prediction."""
        decision = Decision(view.stage_value, now, request.task, request.task_id)
        for stage in self.head:
            stage(request, decision, view)
        return decision

    def finish(self, request: Request, decision: Decision, view: View) -> None:
        """Run the tail on a decision :meth:`start` made."""
        for stage in self.tail:
            stage(request, decision, view)

    def key(self, request: Request, decision: Decision, view: View) -> tuple[Any, ...] | None:
        """What the tail's result depends on, for a decision :meth:`start` made, given
        everything the tail reads from the view as a whole: the head's results and each
        tail stage's ``memo_key``. None if some stage cannot vouch for this task."""
        tail_keys = self._tail_keys
        if tail_keys is None:
            return None
        key: tuple[Any, ...] = (request.task, decision.tenant, tuple(decision.notes),
                                decision.predicted_runtime_s, decision.predicted_p90_s,
                                decision.prediction_source)
        for memo_key in tail_keys:
            part = memo_key(request, decision, view)
            if part is None:
                return None
            key += part
        return key
