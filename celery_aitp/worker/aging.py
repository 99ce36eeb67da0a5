"""Aging on RabbitMQ: a waiting lower-tier message is raised to its tenant's top priority.

On RabbitMQ every tier of a tenant and accelerator waits in one priority queue
(:mod:`celery_aitp.layout`), which always hands out its highest priority first, so a
lower tier would wait as long as higher tiers have work. With ``tier_order: weighted``
(the default) one worker process at a time (the store lock ``lock:aging``) runs a pass
every ``aging.interval_s``: per broker queue it takes messages in delivery order
(``basic.get``, highest priority first) and republishes each one older than its tier's
promotion age (``Policy.promotion_ages``, measured from the first publish, the ``aitp``
header's ``origin_at``) with the priority of the tenant's highest allowed tier: never
above the tenant's ``max_tier``. Every message it does not promote is handed back
unchanged when the pass closes its channel (RabbitMQ puts it back in its place).

**Bound on the longest wait.** A message of tier ``t`` that waits behind fewer than
``aging.max_inspect`` messages in delivery order is promoted by the first pass after it
is ``A_t`` old, so within ``A_t + interval_s`` (plus the pass's own duration). It then
waits behind the ``h`` top-priority messages that were ahead of it (``h <
max_inspect``: all of them were taken by the same pass); later top-tier messages queue
behind it (FIFO within a priority). With ``c`` pool processes consuming the queue and
runs of at most ``R`` seconds its wait is at most
``A_t + interval_s + ceil((h + 1) / c) * R`` (:func:`longest_wait_s`).

The selection logic (:class:`Selector`) is pure; the broker work is the QueueOps
adapter's ``reprioritise`` (``adapters/rabbitmq_queues.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery_aitp.core.request import header_origin
from celery_aitp.errors import AdapterError, StoreError
from celery_aitp.layout import AMQP_DRIVERS, Layout, physical_of_all
from celery_aitp.policy import Policy
from celery_aitp.priority_policy import TierOrder
from celery_aitp.queues import tier_queue_name
from celery_aitp.worker.janitor import BrokerQueuePass

logger = logging.getLogger(__name__)


#: How long ``celery aitp age`` may hold the aging lock (it gives it up when done).
MANUAL_LOCK_S = 120.0
#: How often ``celery aitp age`` asks for the lock again while a worker's pass holds it.
LOCK_POLL_S = 0.2


class Selector:
    """Decides, message by message in delivery order, which ones to promote.

    ``ages`` maps a message priority to the promotion age of the tier published with it;
    ``target`` is the priority of the tenant's highest allowed tier. Messages at or above
    ``target`` stay; so do messages without a usable first-publish time (counted in
    ``no_age``). Priorities below the lowest tier's count as the lowest tier.
    """

    def __init__(self, ages: Mapping[int, float], target: int, now: float) -> None:
        self.ages = dict(ages)
        self.target = target
        self.now = now
        self.lowest = min(self.ages) if self.ages else target
        self.no_age = 0
        #: True once no later message of this pass can be due (see :meth:`decide`).
        self.done = False
        #: When the first message seen and left in place becomes due (inf: none seen).
        self.next_due = math.inf

    def decide(self, priority: Any, headers: Any) -> int | None:
        """The new priority of this message, or None to leave it where it is."""
        p = priority if type(priority) is int else 0
        if p >= self.target or not self.ages:
            return None
        age_limit = self.ages.get(p)
        if age_limit is None:
            if p > self.lowest:  # a level between tiers: not one of ours
                return None
            age_limit = self.ages[self.lowest]
        origin = first_publish(headers)
        if origin is None:
            self.no_age += 1
            return None
        if self.now - origin >= age_limit:
            return self.target
        self.next_due = min(self.next_due, origin + age_limit)
        if p <= self.lowest:
            # Delivery order is priority, then FIFO: every later message is of the lowest
            # tier and published after this one, so none of them is due either.
            self.done = True
        return None


def first_publish(headers: Any) -> float | None:
    """When the task was first published, from the message's ``aitp`` header."""
    return header_origin(headers.get("aitp")) if isinstance(headers, Mapping) else None


class AgingPlan:
    """Per broker queue of the policy: its tenant's top priority and the promotion ages."""

    def __init__(self, policy: Policy, layout: Layout) -> None:
        ages = policy.promotion_ages()
        #: A message published from now on is due no earlier than this many seconds.
        self.min_age = min(ages.values(), default=math.inf)
        self.selectors: dict[str, tuple[int, dict[int, float]]] = {}
        groups = physical_of_all(layout, policy.queue_owners(), policy.accelerators,
                                 policy.tier_names)
        for physical in groups:
            tenant, accelerator = physical.split(".")[1:3]
            top = policy.allowed_tiers(tenant)[0]
            target = layout.priority(tier_queue_name(tenant, accelerator, top))
            by_priority = {layout.priority(tier_queue_name(tenant, accelerator, tier)): age
                           for tier, age in ages.items()}
            self.selectors[physical] = (target, by_priority)

    def selector(self, queue: str, now: float) -> Selector:
        target, ages = self.selectors[queue]
        return Selector(ages, target, now)


def enabled(policy: Policy, driver: str) -> bool:
    """Aging runs on RabbitMQ with the weighted tier order (Redis has its own order)."""
    return driver in AMQP_DRIVERS and policy.tier_order is TierOrder.WEIGHTED


def longest_wait_s(promote_after_s: float, interval_s: float, ahead: int, processes: int,
                   max_runtime_s: float) -> float:
    """The documented bound (module docstring): ``ahead`` top-priority messages (``h``)."""
    return (promote_after_s + interval_s
            + math.ceil((ahead + 1) / max(1, processes)) * max_runtime_s)


class Ager(BrokerQueuePass):
    """Runs aging passes over the policy's broker queues (one process at a time)."""

    def __init__(self, middleware: Any, ops: Any = None) -> None:
        super().__init__(middleware, ops)
        self._planned_for = middleware.policy
        self.plan = AgingPlan(middleware.policy, middleware.layout)
        #: Per broker queue, when its next message may become due (see :meth:`sweep`).
        self.next_due: dict[str, float] = {}

    def _follow_policy(self) -> None:
        """Plan again after ``policy apply`` (a tier's ``promote_after_s`` may change
        live): the plan was made once, so running workers kept the ages they started
        with."""
        policy = self.middleware.policy
        if policy is not self._planned_for:
            self._planned_for = policy
            self.plan = AgingPlan(policy, self.middleware.layout)
            self.next_due.clear()

    def sweep(self, now: float | None = None) -> dict[str, int]:
        """One pass over the broker queues that may hold a due message; returns messages
        promoted per queue.

        A queue is taken from only when a message in it may be due: after a pass, that is
        when the first message it left in place turns due, or ``min_age`` after the pass
        for anything published since (a pass that hit ``max_inspect`` looks again next
        time). So an idle queue, or one whose lower tiers are young, is not touched.
        """
        self._follow_policy()
        settings = self.middleware.policy.aging
        counters = self.middleware.counters
        promoted: dict[str, int] = {}
        for queue in self.plan.selectors:
            at = time.time() if now is None else now
            if at < self.next_due.get(queue, -math.inf):
                continue
            selector = self.plan.selector(queue, at)
            try:
                inspected, raised = self.ops.reprioritise(queue, selector,
                                                          settings.max_inspect)
            finally:
                if selector.no_age:
                    counters.incr("aging_no_age", selector.no_age)
            if inspected >= settings.max_inspect and not selector.done:
                self.next_due[queue] = at  # not all seen: look again next pass
            else:
                self.next_due[queue] = min(selector.next_due, at + self.plan.min_age)
            if raised:
                promoted[queue] = raised
                counters.incr("aged", raised)
            if inspected:
                counters.incr("aging_inspected", inspected)
        if promoted:
            logger.info("aitp: raised %d aged message(s) to their tenant's top priority: %s",
                        sum(promoted.values()), promoted)
        return promoted

    def pass_now(self, wait_s: float = 0.0) -> dict[str, int] | None:
        """One pass over every broker queue now (``celery aitp age``), under the same lock
        as the workers' passes, waiting up to ``wait_s`` for it (a worker holds it for most
        of each ``aging.interval_s``); None if it stayed taken."""
        store = self.middleware.store
        key = store.keys.aging_lock
        deadline = time.monotonic() + wait_s
        while not store.try_lock(key, MANUAL_LOCK_S, self.owner):
            if time.monotonic() >= deadline:
                return None
            time.sleep(LOCK_POLL_S)
        try:
            return self.sweep()
        finally:
            store.release_lock(key, self.owner)

    def run(self, stop: threading.Event) -> None:
        """A pass every ``aging.interval_s`` until ``stop`` is set; one process at a time."""
        store = self.middleware.store
        lock_key = store.keys.aging_lock
        while not stop.wait(interval := self.middleware.policy.aging.interval_s):
            try:
                if store.try_lock(lock_key, interval * 0.9, self.owner):
                    self.sweep()
            except (StoreError, AdapterError) as exc:
                logger.warning("aitp: aging pass skipped: %s", exc)
            except Exception:
                logger.exception("aitp: aging pass failed")
