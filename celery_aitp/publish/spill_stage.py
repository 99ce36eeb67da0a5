"""The ``spill`` stage: a task that would miss its SLA behind a saturated tier queue goes
to Celery's default queue instead, when the standard workers there are idle.

It runs after the gate, on tasks that are about to go to a tier queue (takeover, or the
routed arm of a split). A task spills when all of these hold:

* its tier queue is saturated (:class:`~celery_aitp.scheduling.spill.Capacity`, with
  hysteresis) and the standard workers have idle slots;
* the standard workers provide the task's accelerator class (never spill a GPU task to
  a queue a CPU worker would take it from);
* its expected wait, backlog per slot x its predicted runtime (tiers are size classes,
  so the tasks ahead of it are about its size), exceeds ``sla_margin`` x its SLA (the
  tier's ``sla_s``, or the tenant's when tighter); without a prediction the declared
  ``runtime_hint_s`` stands in; a task with neither, or with no SLA, never spills;
* it falls in the ``max_fraction`` share of tasks (a stable hash of its id), so a
  saturated tier sends at most that share of its tasks away and keeps draining itself.

The decision keeps the tier it was placed in and says why it left
(``reason: spill``, counted like every fallback reason, and the estimate in
``tier_steps.spill``, shown by ``aitp explain``).
"""

from __future__ import annotations

from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.publish.live_view import View
from celery_aitp.publish.request import Decision, Request
from celery_aitp.publish.split import split_bucket
from celery_aitp.scheduling.feedback import sla_of
from celery_aitp.scheduling.spill import NO_CAPACITY, SPILL_SOURCE, SpillSource

#: The decision's reason (and counter label) for a spilled task.
SPILL_REASON = "spill"
#: Salts the hash so the spill share is independent of the split's routed share.
_SALT = "spill:"


class SpillStage:
    """Moves a routed task from a saturated tier queue to the default queue."""

    name = "spill"

    def __init__(self, policy: Policy, source: SpillSource | None = None) -> None:
        settings = policy.spill
        self.sources = (source or SpillSource(settings),)
        self.margin = settings.sla_margin
        self.percent = 100.0 * settings.max_fraction
        self._sla = {(tenant, tier): sla_of(policy, tenant, tier)
                     for tenant in policy.tenants for tier in policy.tier_names}

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        capacity = view.sources.get(SPILL_SOURCE, NO_CAPACITY)
        if not capacity.backlog or not decision.routed:
            return  # the common case
        backlog = capacity.backlog.get(decision.queue or "")
        if backlog is None or capacity.spill_class != decision.accelerator:
            return
        runtime = decision.predicted_runtime_s
        if runtime is None:
            runtime = _hint(request)
        sla = self._sla.get((decision.tenant, decision.tier))
        if runtime is None or not runtime > 0 or sla is None:
            return
        wait = backlog * runtime
        if wait <= self.margin * sla or not self.in_share(request):
            return
        decision.fall_back(SPILL_REASON)
        steps = dict(decision.tier_steps or {})
        steps["spill"] = {"expected_wait_s": wait, "sla_s": sla, "backlog_per_slot": backlog,
                          "idle_slots": capacity.idle_slots, "to": "default queue"}
        decision.tier_steps = steps

    def in_share(self, request: Request) -> bool:
        """Whether the task is in the share of tasks that may spill (by its id)."""
        return self.percent >= 100 or split_bucket(_SALT + request.task_id) < self.percent

    def memo_key(self, request: Request, decision: Decision, view: View) -> tuple[Any, ...]:
        """Nothing while no queue is saturated; else whether the task is in the spill
        share (the rest, capacity included, is the key's head and the view)."""
        if not view.sources.get(SPILL_SOURCE, NO_CAPACITY).backlog:
            return ()
        return (self.in_share(request),)


def _hint(request: Request) -> float | None:
    """The task's declared ``runtime_hint_s``, if it is a positive number."""
    hint = request.declared.get("runtime_hint_s")
    if isinstance(hint, bool) or not isinstance(hint, (int, float)):
        return None
    return float(hint)
