"""Run the stages in order and return a Decision.

The default stage list is built from the policy in :func:`default_stages`; a later
capability swaps one entry (for example the LightGBM predictor for ``predict``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.predict.stages import prediction_stages
from celery_aitp.publish.live_view import Source, View
from celery_aitp.publish.priority_stage import PriorityStage
from celery_aitp.publish.profile_stage import ProfileStage
from celery_aitp.publish.request import Decision, Request
from celery_aitp.publish.stages import GateStage, PublishStage, RouteStage, TenantStage
from celery_aitp.publish.visibility_stage import VisibilityStage

#: The fixed order of stage names; replacing a stage keeps its slot.
STAGE_ORDER = ("tenant", "features", "predict", "profile", "priority", "route", "gate",
               "visibility")


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
    return {
        "tenant": TenantStage(policy, producer_tenant),
        **prediction_stages(clock),
        "profile": ProfileStage(policy, profile_refresh_s, wall),
        "priority": PriorityStage(policy, wall),
        "route": RouteStage(),
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

    def sources(self) -> list[Source]:
        """Background-fetched state the stages declared (``stage.sources``), in order.

        Stages may share a source: it is listed (and fetched) once, under its name.
        """
        found: dict[str, Source] = {}
        for stage in self.stages:
            for source in getattr(stage, "sources", ()):
                found.setdefault(source.name, source)
        return list(found.values())

    def replace(self, name: str, stage: PublishStage) -> Pipeline:
        """A new pipeline with one stage swapped in (or added in its slot)."""
        current = {s.name: s for s in self.stages}
        current[name] = stage
        return Pipeline(current)

    def decide(self, request: Request, view: View, now: float,
               feature_key: tuple[Any, ...] | None = None) -> Decision:
        """Run every stage; ``feature_key`` is the model's cache key for this request
        when the caller computed it already (the decision memo), else the features
        stage computes it."""
        decision = Decision(view.stage_value, now, request.task, request.task_id)
        decision.feature_key = feature_key
        for stage in self.stages:
            stage(request, decision, view)
        return decision
