"""Tier queue names and declarations, shared by producers and workers.

Producers and workers must declare a tier queue identically (RabbitMQ refuses a second
declaration with other arguments), so both build it here.
"""

from __future__ import annotations

from typing import Any

from kombu import Exchange, Queue

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


def tier_queue(name: str, default_queue: str, max_priority: int | None = None) -> Queue:
    """The kombu Queue for a tier queue.

    On RabbitMQ, rejected messages dead-letter to the default queue: that is how
    evacuation moves them there atomically, without a publish/ack gap.
    """
    arguments: dict[str, Any] = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": default_queue,
    }
    if max_priority is not None:
        arguments["x-max-priority"] = int(max_priority)
    return Queue(
        name,
        Exchange(name, type="direct"),
        routing_key=name,
        queue_arguments=arguments,
    )


def all_tier_queues(tenants: Any, accelerators: Any, tiers: Any) -> list[str]:
    """Every tier queue a policy can produce, highest tier first."""
    return [
        tier_queue_name(tenant, accelerator, tier)
        for tier in tiers
        for tenant in tenants
        for accelerator in accelerators
    ]
