"""The ``gate`` stage: the migration stage decides what is really routed (coexistence
routes nothing, split one arm, takeover all)."""

from __future__ import annotations

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage
from celery_aitp.publish.split import SplitRule

#: Reasons the gate gives a task a live worker could take but the stage does not route.
GATED_REASONS = frozenset({"shadow", "split_standard_arm"})

#: Read per publish: module globals are found faster than Enum members.
_TAKEOVER, _COEXISTENCE, _SPLIT = Stage.TAKEOVER, Stage.COEXISTENCE, Stage.SPLIT


class GateStage:
    """Apply the migration stage: shadow routes nothing, split routes one arm, takeover all.

    In the split stage every task gets an arm (``routed`` or ``standard``) whether or not
    a live worker could take it, so arm metrics compare like with like.
    """

    name = "gate"

    def __init__(self) -> None:
        self._rule = SplitRule(SplitSettings())

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        stage = view.stage
        decision.stage = view.stage_value
        if stage is _TAKEOVER:
            return
        if stage is _COEXISTENCE:
            if decision.routed:
                decision.fall_back("shadow")
            return
        rule = self._rule
        if rule.source is not view.split:  # the stored split changed: compile it once
            rule = self._rule = SplitRule(view.split)
        selected = rule.routes(request.root_id or request.task_id, request.task,
                               decision.tenant, decision.tier,
                               decision.predicted_runtime_s, decision.predicted_p90_s)
        decision.arm = "routed" if selected else "standard"
        if decision.routed and not selected:
            decision.fall_back("split_standard_arm")

    def memo_key(self, request: Request, decision: Decision, view: View) -> tuple[bool, ...]:
        """In the split stage, whether the task's arm key falls in the routed share:
        the selectors read only the task, tenant, tier and prediction, which the rest of
        the key fixes."""
        if view.stage is not _SPLIT:
            return ()
        rule = self._rule
        if rule.source is not view.split:
            rule = self._rule = SplitRule(view.split)
        return (rule.in_share(request.root_id or request.task_id),)
