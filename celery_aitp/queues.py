"""Logical tier queue names: ``aitp.<tenant>.<accelerator>.<tier>``.

These names appear in decisions, headers, advertisements and records on every broker;
where the messages physically wait is :mod:`celery_aitp.layout`'s business.
"""

from __future__ import annotations

from typing import Any

PREFIX = "aitp"


def tier_queue_name(tenant: str, accelerator: str, tier: str) -> str:
    """``aitp.<tenant>.<accelerator>.<tier>``."""
    return f"{PREFIX}.{tenant}.{accelerator}.{tier}"


def parse_tier_queue(name: str) -> tuple[str, str, str] | None:
    """(tenant, accelerator, tier) for a tier queue name, else None."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or not all(parts[1:]):
        return None
    return parts[1], parts[2], parts[3]


def is_tier_queue(name: str) -> bool:
    return parse_tier_queue(name) is not None


def all_tier_queues(tenants: Any, accelerators: Any, tiers: Any) -> list[str]:
    """Every tier queue a policy can produce, highest tier first."""
    return [
        tier_queue_name(tenant, accelerator, tier)
        for tier in tiers
        for tenant in tenants
        for accelerator in accelerators
    ]
