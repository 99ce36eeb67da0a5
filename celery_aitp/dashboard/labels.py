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

from celery_aitp.policy import Policy, Stage

OTHER = "other"
NONE = "none"
ALL = "all"
MAX_FREE_VALUES = 64
MAX_LABEL_LEN = 80


class Bounds:
    """Maps raw values to bounded label values for one policy and app."""

    def __init__(self, policy: Policy, tasks: Iterable[str] = ()) -> None:
        self.tenants = frozenset(policy.tenants)
        self.tiers = frozenset(policy.tier_names)
        self.accelerators = frozenset(policy.accelerators)
        self.stages = frozenset(s.value for s in Stage)
        self.tasks = frozenset(t for t in tasks if not t.startswith("celery."))
        self._free: dict[str, set[str]] = {}

    @staticmethod
    def _closed(value: Any, allowed: frozenset[str]) -> str:
        if value is None or value == "":
            return NONE
        text = str(value)
        return text if text in allowed else OTHER

    def tenant(self, value: Any) -> str:
        return self._closed(value, self.tenants)

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
