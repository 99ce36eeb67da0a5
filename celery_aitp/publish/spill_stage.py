"""The ``spill`` stage: a task that would miss its SLA behind a saturated tier queue goes
to another accelerator class's idle tier queue it can run on (``spill.alternatives``), or
else to Celery's default queue, when the standard workers there are idle.

It runs after the gate, on tasks that are about to go to a tier queue (takeover, or the
routed arm of a split). A task spills when all of these hold:

* its tier queue is saturated (:class:`~celery_aitp.scheduling.spill.Capacity`, with
  hysteresis);
* somewhere can take it: the same tenant and tier's queue of a class listed for the
  task's class in ``spill.alternatives`` that is empty with an idle worker (first in
  the listed order), else the default queue if the standard workers provide the task's
  own class and have idle slots (never a GPU task to a queue CPU workers read);
* its expected wait, backlog per slot x its predicted runtime (tiers are size classes,
  so the tasks ahead of it are about its size), exceeds ``sla_margin`` x its SLA (the
  tier's ``sla_s``, or the tenant's when tighter); without a prediction the declared
  ``runtime_hint_s`` stands in; a task with neither, or with no SLA, never spills;
* it falls in the ``max_fraction`` share of tasks (a stable hash of its id), so a
  saturated tier sends at most that share of its tasks away and keeps draining itself.

The decision keeps the tier it was placed in and says why it left: to the default queue
with ``reason: spill`` (counted like every fallback reason); to another class's queue
routed, with ``reason: spill_class`` (its ``accelerator`` stays the class it was placed
by; the queue names the one it runs on). The estimate is in ``tier_steps.spill``, shown
by ``aitp explain``.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request, runtime_hint
from celery_aitp.core.view import View
from celery_aitp.policy import Policy
from celery_aitp.publish.priority_stage import CACHE_LIMIT
from celery_aitp.publish.split import split_bucket
from celery_aitp.queues import parse_tier_queue, tier_queue_name
from celery_aitp.scheduling.feedback import sla_of
from celery_aitp.scheduling.spill import NO_CAPACITY, SPILL_SOURCE, SpillSource

#: The decision's reason (and counter label) for a task spilled to the default queue.
SPILL_REASON = "spill"
#: The reason for a task spilled to another accelerator class's tier queue (routed).
SPILL_CLASS_REASON = "spill_class"
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
        self.alternatives = {cls: tuple(alts) for cls, alts in settings.alternatives.items()}
        self.policy = policy
        self._sla: BoundedDict[tuple[str, str], float | None] = BoundedDict(CACHE_LIMIT)

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        capacity = view.sources.get(SPILL_SOURCE, NO_CAPACITY)
        if not capacity.backlog or not decision.routed:
            return  # the common case
        backlog = capacity.backlog.get(decision.queue or "")
        if backlog is None:
            return
        accelerator = decision.accelerator
        target = self._alternative(decision.queue or "", capacity.open_queues,
                                   view.live_queues)
        if target is None and capacity.spill_class != accelerator:
            return  # nowhere that can run it
        runtime = decision.predicted_runtime_s
        if runtime is None:
            runtime = runtime_hint(request.declared)
        sla = self._sla_of(decision.tenant, decision.tier or "")
        if runtime is None or not runtime > 0 or sla is None:
            return
        wait = backlog * runtime
        if wait <= self.margin * sla or not self.in_share(request):
            return
        steps = dict(decision.tier_steps or {})
        steps["spill"] = {"expected_wait_s": wait, "sla_s": sla, "backlog_per_slot": backlog,
                          "idle_slots": capacity.idle_slots, "to": "default queue"}
        if target is not None:  # another class's idle tier queue: still routed
            # the decision keeps the class it was placed by (its size and fair-share
            # charges are that class's); the queue says where it runs
            alt, queue = target
            steps["spill"].update(to=queue, idle_slots=None, from_accelerator=accelerator,
                                  to_accelerator=alt)
            decision.queue, decision.reason = queue, SPILL_CLASS_REASON
        else:
            decision.fall_back(SPILL_REASON)
        decision.tier_steps = steps

    def _sla_of(self, tenant: str, tier: str) -> float | None:
        key = (tenant, tier)
        if key in self._sla:
            return self._sla[key]
        return self._sla.put(key, sla_of(self.policy, tenant, tier))

    def _alternative(self, queue: str, open_queues: frozenset[str],
                     live: frozenset[str]) -> tuple[str, str] | None:
        """(class, queue): the first class listed for ``queue``'s whose queue of the same
        owner (the tenant, or its class) and tier is live and open (empty, a worker
        idle); None if none is."""
        parts = parse_tier_queue(queue)
        if parts is None:
            return None
        owner, accelerator, tier = parts
        for alt in self.alternatives.get(accelerator, ()):
            other = tier_queue_name(owner, alt, tier)
            if other in open_queues and other in live:
                return alt, other
        return None

    def in_share(self, request: Request) -> bool:
        """Whether the task is in the share of tasks that may spill (by its id)."""
        return self.percent >= 100 or split_bucket(_SALT + request.task_id) < self.percent

    def memo_key(self, request: Request, decision: Decision, view: View) -> tuple[Any, ...]:
        """Nothing while no queue is saturated; else whether the task is in the spill
        share (the rest, capacity included, is the key's head and the view)."""
        if not view.sources.get(SPILL_SOURCE, NO_CAPACITY).backlog:
            return ()
        return (self.in_share(request),)

