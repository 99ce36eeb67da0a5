"""Bounded label values: every label the dashboard exports comes from a closed set.

Tenants, tiers and accelerators come from the policy, stages from the Stage enum, task
names from the app's registered tasks. Anything else (older records, another policy,
a typo in a header) becomes ``other``; an empty value becomes ``none``. Free-form values
that the code itself produces (fallback reasons, event counter names) pass through up to
a cap of distinct values, then become ``other``. Task ids never become labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.policy import Policy, Stage, TenantNames
from celery_aitp.queues import lane_owner

OTHER = "other"
NONE = "none"
ALL = "all"
MAX_FREE_VALUES = 64
#: Distinct tenant label values at most (besides 'other' and 'none').
MAX_TENANT_LABELS = 50
MAX_LABEL_LEN = 80


class Bounds:
    """Maps raw values to bounded label values for one policy and app."""

    def __init__(self, policy: Policy, tasks: Iterable[str] = ()) -> None:
        # Tenants: the policy's when it lists at most MAX_TENANT_LABELS; beyond (thousands
        # of tenants, or unlisted ones), the first ones seen up to that bound, for the
        # process's life (counters must not hop between series), the rest 'other'.
        many = len(policy.tenants) > MAX_TENANT_LABELS
        # the classes (and their over-share lanes) own queues and counters as a tenant
        # does, and the policy bounds them: always their own value, never 'other'
        classes = {name for cls in policy.tenant_classes for name in (cls, lane_owner(cls))}
        self.tenants = frozenset({policy.default_tenant} if many else policy.tenants) | classes
        self._tenant_names = TenantNames(policy)
        self._seen_tenants: set[str] = set()
        self.tiers = frozenset(policy.tier_names)
        self.accelerators = frozenset(policy.accelerators)
        self.stages = frozenset(s.value for s in Stage)
        self.tasks = frozenset(t for t in tasks if not t.startswith("celery."))
        self._free: dict[str, set[str]] = {}

    def carry_over(self, old: Bounds) -> None:
        """Keep the tenants and free values ``old`` (the previous policy's) gave a series
        of their own: counters must not hop between series when the policy changes."""
        seen = {t for t in old._seen_tenants if t not in self.tenants}
        self._seen_tenants = set(list(seen)[:max(0, MAX_TENANT_LABELS - len(self.tenants))])
        self._free = {kind: set(values) for kind, values in old._free.items()}

    @staticmethod
    def _closed(value: Any, allowed: frozenset[str]) -> str:
        if value is None or value == "":
            return NONE
        text = str(value)
        return text if text in allowed else OTHER

    def tenant(self, value: Any) -> str:
        if value is None or value == "":
            return NONE
        text = str(value)
        if text in self.tenants or text in self._seen_tenants:
            return text
        if text in self._tenant_names and \
                len(self.tenants) + len(self._seen_tenants) < MAX_TENANT_LABELS:
            self._seen_tenants.add(text)
            return text
        return OTHER

    def tier(self, value: Any) -> str:
        return self._closed(value, self.tiers)

    def accelerator(self, value: Any) -> str:
        return self._closed(value, self.accelerators)

    def stage(self, value: Any) -> str:
        return self._closed(value, self.stages)

    def task(self, value: Any) -> str:
        return self._closed(value, self.tasks)

    def queue_labels(self, row: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
        """queue, kind, tenant, accelerator, tier of a queue row (``Fleet``'s); the tier
        is ``all`` for a tier queue holding every tier (RabbitMQ's layout)."""
        tier = self.tier(row.get("tier"))
        if row.get("kind") == "tier" and row.get("tier") is None:
            tier = ALL
        return (str(row.get("queue"))[:MAX_LABEL_LEN], str(row.get("kind")),
                self.tenant(row.get("tenant")), self.accelerator(row.get("accelerator")), tier)

    def free(self, kind: str, value: Any) -> str:
        """A code-produced value (reason, event name), capped in length and in count."""
        if value is None or value == "":
            return NONE
        text = str(value)[:MAX_LABEL_LEN]
        seen = self._free.setdefault(kind, set())
        if text in seen:
            return text
        if len(seen) >= MAX_FREE_VALUES:
            return OTHER
        seen.add(text)
        return text
