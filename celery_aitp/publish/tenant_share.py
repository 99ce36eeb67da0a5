"""One decision per tenant class: a new tenant of a class reuses its class's decision.

The decision memo (:mod:`celery_aitp.publish.memo`) keys a decision by tenant, so with
thousands of tenants nearly every publish is a new key and runs the whole tail. For
tenants that share the queues of a class (``tenant_class``, or unlisted under
``unlisted_tenants``), the tail's result depends on the tenant only through:

- its spec: the class, ``max_tier`` and ``sla_s`` (a listed tenant of a class may set
  its own; priority and spill read them);
- whether it is above its fair share (per tenant: already part of the memo key, from
  the priority stage's ``memo_key``);
- its feedback boost (per tenant, read from the view);
- whether the split stage's ``tenants`` selector names it;

and the decision carries its name (header, record, fair-share charge). So the memo key
with the tenant replaced by that *identity* is the key of a decision every such tenant
can share: the first tenant of an identity runs the tail; a new tenant of the same
identity gets a copy with its own name, charged to its own fair share. Its counter is
the class's already (``counter_tenant``). Tenants with queues of their own are left to
the memo as before: their name is in the queue.

The identity is worked out from the tenant the tenant stage resolved (never from a
header): no claim can give a tenant another's tier.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.cache import BoundedDict
from celery_aitp.core.request import Decision
from celery_aitp.core.view import View
from celery_aitp.policy import Policy, Tenant
from celery_aitp.scheduling.feedback import BOOSTS_SOURCE, Boosts

_NO_BOOSTS = Boosts()


class _ClassKey:
    """Marks a memo key whose tenant is replaced by its identity (never equal to a
    tenant name)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<class key>"


CLASS_KEY = _ClassKey()


class ClassShare:
    """Finds and keeps class decisions among the memo's templates (so they live and die
    with the view they were made on). The memo makes a copy's template as for any
    decision: its header, record and fair-share charge are its own tenant's."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        #: Listed tenants of a class by name, and every unlisted one (None: there are no
        #: unlisted tenants, or they have queues of their own).
        self._listed = {name: _identity(spec) for name, spec in policy.tenants.items()
                        if spec.tenant_class is not None}
        unlisted = policy.tenant_spec("") if policy.unlisted_tenants is not None else None
        self._unlisted = _identity(unlisted) if unlisted is not None and \
            unlisted.tenant_class is not None else None
        self._tenants = frozenset(policy.tenants)

    def spec_identity(self, tenant: str) -> tuple[Any, ...] | None:
        """(class, max_tier, sla_s) of a tenant of a class; None for one with queues of
        its own (or none at all)."""
        found = self._listed.get(tenant)
        if found is None and tenant not in self._tenants:
            return self._unlisted
        return found

    def class_key(self, key: tuple[Any, ...], decision: Decision, view: View
                  ) -> tuple[Any, ...] | None:
        """The memo ``key`` (task, tenant, ...) with the tenant replaced by its identity;
        None for a tenant that does not share a class's queues."""
        tenant = decision.tenant
        spec = self.spec_identity(tenant)
        if spec is None:
            return None
        boost = view.sources.get(BOOSTS_SOURCE, _NO_BOOSTS).of(tenant)
        named = tenant in view.split.tenants if view.split.tenants else False
        return (key[0], CLASS_KEY, spec, boost, named) + key[2:]

    def find(self, key: tuple[Any, ...], decision: Decision, view: View,
             templates: BoundedDict[tuple[Any, ...], Any]) -> Decision | None:
        """The decision of ``decision``'s class identity, copied with its tenant's name;
        None if there is none yet (or the tenant has queues of its own)."""
        ckey = self.class_key(key, decision, view)
        if ckey is None:
            return None
        shared = templates.get(ckey)
        if not isinstance(shared, Decision):
            return None
        return renamed_decision(shared, decision.tenant)

    def keep(self, key: tuple[Any, ...], decision: Decision, view: View,
             templates: BoundedDict[tuple[Any, ...], Any]) -> None:
        """Keep a decision the pipeline just made for other tenants of its identity
        (among the memo's templates, so it lives and dies with their view)."""
        ckey = self.class_key(key, decision, view)
        if ckey is not None and ckey not in templates:
            templates.put(ckey, decision)


def _identity(spec: Tenant) -> tuple[Any, ...]:
    return (spec.tenant_class, spec.max_tier, spec.sla_s)


def renamed_decision(decision: Decision, tenant: str) -> Decision:
    """A copy of ``decision`` for another tenant, every other field the same (the
    nested dicts are shared: nothing changes them once decided)."""
    copy = Decision.__new__(Decision)
    for name in Decision.__slots__:
        setattr(copy, name, getattr(decision, name))
    copy.tenant = tenant
    copy.notes = list(decision.notes)
    return copy
