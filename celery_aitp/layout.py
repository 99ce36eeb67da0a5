"""Where a logical tier queue lives on the broker, and with which message priority.

Decisions, headers, advertisements and records always name the *logical* tier queue
``aitp.<tenant>.<accelerator>.<tier>``. The broker holds messages in *physical*
queues, laid out so that a worker reads the highest tier first:

- Redis (and the memory transport): one list per logical queue, read in tier order
  by the worker's queue-order strategy. A message keeps the priority its caller gave
  it (``keeps_caller_priority``): kombu reads a priority level before queue order, as
  it does for any queues a plain Celery worker reads, so tasks of equal priority (all
  of them, when nobody sets one) come in tier order.
- RabbitMQ: no ordering across queues, so one priority queue per tenant and
  accelerator, ``aitp.<tenant>.<accelerator>``, and the tier becomes the message
  priority (highest tier, highest priority). A task with a priority of its own cannot
  keep it in there, so it keeps Celery's route instead
  (:mod:`celery_aitp.publish.caller_priority`). A class's over-share lanes
  (``aitp.<class>~over.<accelerator>.<tier>``) are the level below the lowest tier in
  its class's queue (priority 0, whatever their tier: one level, FIFO): read after every
  tier of the class, and raised by aging like the lowest tier (a separate queue would be
  served alternately with the class's, whatever the tiers).

Producers and workers build declarations only here, so they are identical (RabbitMQ
refuses a second declaration with other arguments). The RabbitMQ declaration does not
depend on the policy, so a producer and a worker with different tier lists still agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kombu import Exchange, Queue

from celery_aitp.queues import PREFIX, lane_class, parse_tier_queue, tier_queue_name

#: ``x-max-priority`` of RabbitMQ tier queues; a policy has at most 10 tiers.
AMQP_MAX_PRIORITY = 10

#: Transport driver types of RabbitMQ (kombu's ``pyamqp`` and ``librabbitmq``).
AMQP_DRIVERS = frozenset({"amqp"})


def _queue(name: str, arguments: dict[str, Any] | None = None) -> Queue:
    """A durable queue on its own direct exchange, as Celery declares missing queues."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name,
                 queue_arguments=arguments or None)


class PerTierLayout:
    """Physical queue = logical queue (Redis, memory). The caller's message priority."""

    name = "per-tier"
    #: Messages keep the caller's priority; :meth:`priority` is not used for them.
    keeps_caller_priority = True

    def physical(self, logical: str) -> str:
        return logical

    def priority(self, logical: str) -> int:
        """Kombu's level for a message without a priority (tiers need none here)."""
        return 0

    def declaration(self, physical: str) -> Queue:
        return _queue(physical)

    def is_tier_destination(self, name: str) -> bool:
        return parse_tier_queue(name) is not None


class PerTenantLayout:
    """One RabbitMQ priority queue per tenant and accelerator; the tier is the priority."""

    name = "per-tenant-priority"
    #: The message priority is the tier's, so a caller's own cannot be kept in here.
    keeps_caller_priority = False

    def __init__(self, tier_names: Sequence[str]) -> None:
        if not 1 <= len(tier_names) <= AMQP_MAX_PRIORITY:
            raise ValueError(f"1 to {AMQP_MAX_PRIORITY} tiers are supported on RabbitMQ")
        self._priority = {tier: AMQP_MAX_PRIORITY - i for i, tier in enumerate(tier_names)}

    def physical(self, logical: str) -> str:
        parts = parse_tier_queue(logical)
        if parts is None:
            return logical
        tenant, accelerator, _tier = parts
        return f"{PREFIX}.{lane_class(tenant) or tenant}.{accelerator}"

    def priority(self, logical: str) -> int:
        """The tier's priority; 0 (below every tier) for an over-share lane."""
        parts = parse_tier_queue(logical)
        if parts is None or lane_class(parts[0]) is not None:
            return 0
        return self._priority.get(parts[2], 0)

    def declaration(self, physical: str) -> Queue:
        return _queue(physical, {"x-max-priority": AMQP_MAX_PRIORITY})

    def is_tier_destination(self, name: str) -> bool:
        parts = name.split(".")
        return len(parts) == 3 and parts[0] == PREFIX and all(parts[1:])


Layout = PerTierLayout | PerTenantLayout


def layout_for(driver_type: str, tier_names: Sequence[str]) -> Layout:
    """The layout for a kombu transport driver type ('redis', 'amqp', 'memory', ...)."""
    if driver_type in AMQP_DRIVERS:
        return PerTenantLayout(tier_names)
    return PerTierLayout()


def physical_groups(layout: Layout, logical: Iterable[str]) -> dict[str, list[str]]:
    """Physical queue -> the logical queues it holds, in the order given."""
    groups: dict[str, list[str]] = {}
    for name in logical:
        groups.setdefault(layout.physical(name), []).append(name)
    return groups


def physical_of_all(layout: Layout, tenants: Iterable[str], accelerators: Iterable[str],
                    tiers: Iterable[str]) -> dict[str, list[str]]:
    """Every physical queue a policy can use, with its logical queues."""
    tiers = list(tiers)
    accelerators = list(accelerators)
    logical = [tier_queue_name(t, a, tier) for tier in tiers for t in tenants
               for a in accelerators]
    return physical_groups(layout, logical)
