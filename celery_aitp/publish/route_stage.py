"""The ``route`` stage: the tier queue a decision names, and whether a live worker
serves it (otherwise the task falls back to Celery's default queue)."""

from __future__ import annotations

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import Policy
from celery_aitp.queues import lane_owner, tier_queue_name
from celery_aitp.scheduling.usage import is_demoted


class RouteStage:
    """The tier queue for (tenant, accelerator, tier), if some live worker serves it.

    A tenant of a class (``tenant_class``, or not listed with ``unlisted_tenants`` set)
    uses its class's queues: ``aitp.<class>.<accelerator>.<tier>``. While such a tenant
    is above its fair share (the ``usage`` source's ``demoted``, with ``fair_share``
    on), its tasks go to the class's over-share lane of their tier instead,
    ``aitp.<class>~over.<accelerator>.<tier>``: workers serving the class read each lane
    with the weight of the tier below (``worker/tier_cycle.py``), so the flooder's
    backlog waits there and not ahead of the class's other tenants in the shared FIFO
    queues, and its short tasks still go before its long ones. A lane, like any tier
    queue, is routed to only while a live worker advertises it.
    """

    name = "route"

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy
        self._owner: BoundedDict[str, str] = BoundedDict(100_000)  # unlisted: open-ended
        self.classes = frozenset(policy.tenant_classes) if policy is not None else frozenset()
        self.fair_share = policy is not None and policy.fair_share.enabled

    def owner(self, tenant: str) -> str:
        owner = self._owner.get(tenant)
        if owner is None:
            owner = self._owner.put(tenant, self.policy.queue_owner(tenant)
                                    if self.policy is not None else tenant)
        return owner

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        owner = self.owner(decision.tenant)
        if owner in self.classes and self._over_share(decision.tenant, view):
            owner = lane_owner(owner)
        queue = decision.queue = tier_queue_name(owner, decision.accelerator, decision.tier)
        if not view.fresh:
            decision.fall_back("store_unreachable")
        elif queue not in view.live_queues:
            decision.fall_back("no_live_worker")
        else:
            decision.routed = True
            decision.reason = "routed"

    def _over_share(self, tenant: str, view: View) -> bool:
        return self.fair_share and is_demoted(view.sources, tenant)

    def memo_key(self, request: Request, decision: Decision, view: View
                 ) -> tuple[bool, ...]:
        """With tenant classes, whether the tenant is above its fair share (the lane);
        tenant, accelerator and tier come from earlier stages, freshness and live queues
        from the view (see ``Pipeline.key``)."""
        if not self.classes:
            return ()
        return (self._over_share(decision.tenant, view),)
