"""Logical tier queue names: ``aitp.<tenant>.<accelerator>.<tier>``.

A tenant class also has *over-share lanes* per accelerator and tier,
``aitp.<class>~over.<accelerator>.<tier>``: the tasks of its tenants that are above their
fair share wait there, apart from the class's other tenants, and still in size order
among themselves (``~`` is in no tenant or class name, so a lane's owner never collides
with one).

These names appear in decisions, headers, advertisements and records on every broker;
where the messages physically wait is :mod:`celery_aitp.layout`'s business.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_aitp.policy import Policy

PREFIX = "aitp"
#: Suffix of an over-share lane's owner: ``<class>~over``.
LANE_SUFFIX = "~over"


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


def queues_of_tier(queues: Iterable[str], tier: str) -> list[str]:
    """The tier queues among ``queues`` (lanes included) of ``tier``, in order."""
    return [q for q in queues if (parsed := parse_tier_queue(q)) and parsed[2] == tier]


def all_tier_queues(tenants: Any, accelerators: Any, tiers: Any) -> list[str]:
    """Every tier queue a policy can produce, highest tier first."""
    return [
        tier_queue_name(tenant, accelerator, tier)
        for tier in tiers
        for tenant in tenants
        for accelerator in accelerators
    ]


def lane_owner(tenant_class: str) -> str:
    """The owner name of a class's over-share lane."""
    return tenant_class + LANE_SUFFIX


def lane_class(owner: str) -> str | None:
    """The class whose over-share lane ``owner`` names; None for any other owner."""
    if owner.endswith(LANE_SUFFIX) and len(owner) > len(LANE_SUFFIX):
        return owner[: -len(LANE_SUFFIX)]
    return None


def lane_queues(classes: Iterable[str], accelerators: Iterable[str], tiers: Sequence[str]
                ) -> list[str]:
    """The over-share lanes of ``classes``: one per accelerator and tier, highest first."""
    return all_tier_queues([lane_owner(c) for c in classes], accelerators, tiers)


def served_queues(owners: Sequence[str], classes: Container[str], accelerator: str,
                  tiers: Sequence[str]) -> list[str]:
    """The tier queues a worker serving ``owners`` reads: highest tier first, then owners
    in the order given; then the lanes of the classes among them, in the same order."""
    lanes = [lane_owner(o) for o in owners if o in classes]
    return all_tier_queues(owners, [accelerator], tiers) + all_tier_queues(
        lanes, [accelerator], tiers)


def policy_queues(policy: Policy) -> list[str]:
    """Every tier queue a policy can produce: its queue owners' queues, then the classes'
    lanes (``classes x accelerators x tiers`` more)."""
    accelerators, tiers = list(policy.accelerators), policy.tier_names
    return all_tier_queues(policy.queue_owners(), accelerators, tiers) + \
        lane_queues(policy.tenant_classes, accelerators, tiers)
