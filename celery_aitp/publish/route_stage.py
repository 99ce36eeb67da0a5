"""The ``route`` stage: the tier queue a decision names, and whether a live worker
serves it (otherwise the task falls back to Celery's default queue)."""

from __future__ import annotations

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import Policy
from celery_aitp.queues import tier_queue_name


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
