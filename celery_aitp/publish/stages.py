"""The publish-time decision as an ordered list of small stages.

Order (one way only): features -> predict -> profile -> priority -> route -> gate.
Each stage reads the Request, the shared View and what earlier stages wrote into the
Decision, and fills in its own part. Later issues replace a stage's implementation by
handing :class:`~celery_aitp.publish.pipeline.Pipeline` another callable with the same
signature; nothing else changes. The ``profile`` and ``priority`` stages live in their
own modules (``profile_stage.py``, ``priority_stage.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import Policy, SplitSettings, Stage, TenantNames
from celery_aitp.publish.split import SplitRule, arm_key, split_bucket
from celery_aitp.queues import tier_queue_name

__all__ = [
    "GATED_REASONS", "GateStage", "PublishStage", "RouteStage", "TenantStage", "split_bucket",
    "split_selects",
]

#: Reasons the gate gives a task a live worker could take but the stage does not route.
GATED_REASONS = frozenset({"shadow", "split_standard_arm"})

#: Longest tenant name accepted from a header before it is treated as bad input.
MAX_TENANT_LEN = 64


class PublishStage(Protocol):
    """One step of the decision. Must be fast and may raise: the hook falls back."""

    name: str

    def __call__(self, request: Request, decision: Decision, view: View) -> None: ...


class TenantStage:
    """Who the task is for: header, then the policy's keyword argument, then the tenant of
    the task publishing it (chain steps, chord bodies, sub-tasks), then the default.

    The header and the keyword argument are caller data: they may name only a tenant of
    the policy whose ``trusted_header`` is on, or, in a process pinned to one tenant
    (``producer_tenant``), only that tenant. Anything else is counted (``tenant_unknown``,
    ``tenant_invalid``, ``tenant_refused``) and the task gets the default tenant (the
    pinned one, if any). Tiers are never read from a header.
    """

    name = "tenant"

    def __init__(self, policy: Policy, producer_tenant: str | None = None) -> None:
        self.tenants = TenantNames(policy)
        if producer_tenant is not None and producer_tenant not in policy.tenants:
            raise ValueError(f"producer_tenant: {producer_tenant!r} is not in the policy's "
                             "tenants")
        self.claimable = frozenset((producer_tenant,)) if producer_tenant is not None else \
            frozenset(name for name, spec in policy.tenants.items() if spec.trusted_header)
        #: A header may name a tenant the policy does not list (``unlisted_tenants``).
        unlisted = policy.tenant_spec("") if policy.unlisted_tenants else None
        self.claim_unlisted = producer_tenant is None and unlisted is not None and \
            unlisted.trusted_header
        self.unlisted_class = policy.unlisted_tenants
        self.default = producer_tenant or policy.default_tenant
        self.kwarg = policy.tenant_kwarg
        #: Tenants of a class are counted under it (``decisions:...`` counters): the
        #: store's counters grow with queue owners, not with tenants.
        self.counted_as = {t: spec.tenant_class for t, spec in policy.tenants.items()
                           if spec.tenant_class is not None}
        self.default_counted = self.counted_as.get(self.default)

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        raw: Any = request.headers.get("aitp_tenant")
        if raw is None and self.kwarg and isinstance(request.kwargs, dict):
            raw = request.kwargs.get(self.kwarg)
        if raw is None and request.parent_tenant is None:  # the common case, at once
            decision.tenant = self.default
            decision.counter_tenant = self.default_counted
            return
        tenant, note = self.resolve(raw, request.parent_tenant)
        decision.tenant = tenant
        if self.counted_as:
            decision.counter_tenant = self.counted_as.get(tenant)
        if self.unlisted_class is not None and tenant not in self.tenants.listed:
            decision.counter_tenant = self.unlisted_class
        if note is not None:
            decision.notes.append(note)

    def resolve(self, raw: Any, parent: str | None) -> tuple[str, str | None]:
        """The tenant for a claimed name (``raw``: header or keyword argument, None if
        neither) and the publishing task's tenant, with the note to count, if any."""
        if raw is None:
            if parent is None:  # validated when its own task was decided
                return self.default, None
            if parent in self.tenants:
                return parent, None
            return self.default, "tenant_unknown"  # the policy changed since: it is gone
        if isinstance(raw, str) and raw in self.claimable:
            return raw, None
        if not isinstance(raw, str) or len(raw) > MAX_TENANT_LEN:
            return self.default, "tenant_invalid"
        if raw in self.tenants.listed:
            return self.default, "tenant_refused"
        if raw in self.tenants:  # a valid name the policy does not list
            return (raw, None) if self.claim_unlisted else (self.default, "tenant_refused")
        return self.default, "tenant_unknown"


class RouteStage:
    """The tier queue for (tenant, accelerator, tier), if some live worker serves it.

    A tenant of a class (``tenant_class``, or not listed with ``unlisted_tenants`` set)
    uses its class's queues: ``aitp.<class>.<accelerator>.<tier>``.
    """

    name = "route"

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy
        self._owner: BoundedDict[str, str] = BoundedDict(100_000)  # unlisted: open-ended

    def owner(self, tenant: str) -> str:
        owner = self._owner.get(tenant)
        if owner is None:
            owner = self._owner.put(tenant, self.policy.queue_owner(tenant)
                                    if self.policy is not None else tenant)
        return owner

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        queue = tier_queue_name(self.owner(decision.tenant), decision.accelerator, decision.tier)
        decision.queue = queue
        if not view.fresh:
            decision.fall_back("store_unreachable")
        elif queue not in view.live_queues:
            decision.fall_back("no_live_worker")
        else:
            decision.routed = True
            decision.reason = "routed"

    #: Nothing: tenant, accelerator and tier come from earlier stages, freshness and
    #: live queues from the view (see ``Pipeline.key``).
    memo_key = ()


def split_selects(split: SplitSettings, request: Request, decision: Decision) -> bool:
    """Whether the split's selectors and percentage put this task on the routed arm."""
    return SplitRule(split).routes(arm_key(request.task_id, request.root_id), request.task,
                                   decision.tenant, decision.tier,
                                   decision.predicted_runtime_s, decision.predicted_p90_s)


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
