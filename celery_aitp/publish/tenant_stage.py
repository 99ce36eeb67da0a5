"""The ``tenant`` stage: who a task is for, and which names a caller may claim."""

from __future__ import annotations

import logging
from typing import Any

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import NAME_PATTERN, NAME_RULE, Policy, TenantNames

logger = logging.getLogger(__name__)

#: Longest tenant name accepted from a header before it is treated as bad input.
MAX_TENANT_LEN = 64


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
        self._unknown_reported = False

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
            if note == "tenant_unknown" and not self._unknown_reported:
                self._unknown_reported = True  # once per process: it may be every task
                logger.warning("aitp: a task names tenant %r, %s: such tasks count as tenant "
                               "%r (counter tenant_unknown)", str(raw)[:MAX_TENANT_LEN],
                               self._why_unknown(raw), self.default)

    def _why_unknown(self, raw: Any) -> str:
        if isinstance(raw, str) and NAME_PATTERN.match(raw) is None:
            return f"which is not a valid tenant name ({NAME_RULE})"
        if self.unlisted_class is not None:  # then only a class's own name is unknown
            return "which names a tenant class, not a tenant"
        return ("which the policy does not list; to give tenants nobody lists a fair share "
                "of their own, set unlisted_tenants to a tenant class (docs/scale.md)")

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
