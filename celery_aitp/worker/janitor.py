"""Move messages out of tier queues that no live worker serves any more.

Runs in every worker of an app with the middleware (and on demand from
``celery aitp evacuate``). A broker queue none of whose logical tier queues has a live
advertisement is drained into the default queue by the broker adapter's atomic move
(on RabbitMQ one broker queue holds every tier of a tenant and accelerator, see
:mod:`celery_aitp.layout`); in the coexistence stage every tier queue is (after a
rollback nothing may wait there). Bound: a message waits at most
``worker_ttl_s + evacuate_interval_s`` (15 s by default) after its last consumer
disappeared before it is on the default queue.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterable
from typing import Any

from celery_aitp.core.view import stage_from_doc
from celery_aitp.errors import AdapterError, PolicyError, StoreError
from celery_aitp.layout import physical_groups
from celery_aitp.policy import Stage, parse_policy
from celery_aitp.policy_history import policy_history
from celery_aitp.queues import all_tier_queues, policy_queues
from celery_aitp.redact import redact
from celery_aitp.registry import QUEUE_OPS, resolve
from celery_aitp.store.redis_store import translated_errors

logger = logging.getLogger(__name__)

#: Recent policy versions whose tier queues the janitor keeps draining after a change.
RETIRED_VERSIONS = 50


def queue_ops_for(app: Any) -> Any:
    """The QueueOps adapter for the app's broker transport."""
    from celery_aitp.deployment import transport_driver

    return resolve(QUEUE_OPS, transport_driver(app))(app)


class BrokerQueuePass:
    """What a periodic pass over the broker's queues needs: the middleware, the broker's
    QueueOps (made on first use, so a pass that never runs opens no connection) and the
    owner name it takes the store lock under."""

    def __init__(self, middleware: Any, ops: Any = None) -> None:
        self.middleware = middleware
        self._ops = ops
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def ops(self) -> Any:
        if self._ops is None:
            self._ops = queue_ops_for(self.middleware.app)
        return self._ops


class Janitor(BrokerQueuePass):
    """Finds orphaned tier queues and drains them into the default queue.

    Cost per pass follows the owners of queues (tenants with queues of their own, and
    tenant classes), not the number of tenants: with classes, thousands of tenants cost
    a few queues. Classed tenants' former queues are looked at once per process, at most
    ``FORMER_PER_PASS`` of them per pass: a policy takes effect when workers restart, so
    the first passes after the change drain them (and ``celery aitp evacuate`` does on
    demand) without a burst of thousands of broker calls at start (on RabbitMQ each
    missing queue costs a channel).
    """

    #: Former queues looked at per pass (10,000 classed tenants: 30,000 queues).
    FORMER_PER_PASS = 1000
    _former_next: int | None = 0  # the next former queue to look at (None: all done)

    def __init__(self, middleware: Any, ops: Any = None) -> None:
        super().__init__(middleware, ops)
        self._version_queues: dict[str, list[str]] = {}  # tier queues per policy digest
        self._history_head: Any = None  # the policy history's newest entry, as last read
        self._recorded: list[str] | None = None  # the recent versions' tier queues
        self._retired_next = 0  # where the next batch of many retired queues starts

    def known_queues(self) -> list[str]:
        """Every logical tier queue the policy can produce, the classes' over-share
        lanes included."""
        return policy_queues(self.middleware.policy)

    def former_queues(self) -> list[str]:
        """Queues of their own of listed tenants that now share a class's: nothing routes
        there any more, but messages from before the policy change may wait."""
        policy = self.middleware.policy
        classed = [t for t, spec in policy.tenants.items() if spec.tenant_class is not None]
        return all_tier_queues(classed, policy.accelerators, policy.tier_names)

    def retired_queues(self) -> list[str]:
        """Tier queues a recent recorded policy produced and this one does not: a tenant,
        class, tier or accelerator taken out (by ``policy apply`` or a restart with a new
        file). Nothing routes there or reads them any more, yet messages published before
        the change wait there, and runs under way come back there; they are looked at
        every pass, as the policy's own queues are (a worker still on the old policy
        keeps its queues live)."""
        current = set(self.known_queues())
        return [queue for queue in self._recorded_queues() if queue not in current]

    def _recorded_queues(self) -> list[str]:
        """The tier queues of the recent recorded versions, read again only when a version
        was recorded since (the history's newest entry changed: one ``LINDEX`` a pass)."""
        store = self.middleware.store
        with translated_errors():
            head = store.client.lindex(store.keys.policy_history, 0)
        if head != self._history_head or self._recorded is None:
            found: dict[str, None] = {}
            for entry in policy_history(store, RETIRED_VERSIONS):
                found.update(dict.fromkeys(self._queues_of_version(entry)))
            self._history_head, self._recorded = head, list(found)
        return self._recorded

    def _queues_of_version(self, entry: dict[str, Any]) -> list[str]:
        """The tier queues of one policy history entry (parsed once per version; one
        that does not parse here, e.g. written by a newer version, gives none)."""
        digest = str(entry.get("digest"))
        cache = self._version_queues
        if digest not in cache:
            document = entry.get("policy")
            try:
                cache[digest] = policy_queues(parse_policy(document)) \
                    if isinstance(document, dict) else []
            except PolicyError:
                cache[digest] = []
        return cache[digest]

    def evacuate(self, queues: Iterable[str]) -> dict[str, int]:
        """Drain the broker queues holding ``queues`` (logical tier queue or broker queue
        names) into the default queue now; returns messages moved per broker queue."""
        layout = self.middleware.layout
        default = self.middleware.default_queue
        physical = [q for q in dict.fromkeys(layout.physical(q) for q in queues) if q != default]
        moved: dict[str, int] = {}
        for queue, depth in self.ops.depths(physical).items():
            if depth:
                moved[queue] = self.ops.move_all(queue, default)
        total = sum(moved.values())
        if total:
            self.middleware.counters.incr("evacuated", total)
            logger.warning("aitp: moved %d message(s) from tier queues to %s: %s",
                           total, default, moved)
        return moved

    def orphaned(self, live: frozenset[str], retired: Iterable[str] = ()) -> list[str]:
        """Broker queues of the policy (and ``retired`` ones) none of whose tier queues a
        live worker serves."""
        groups = physical_groups(self.middleware.layout, [*self.known_queues(), *retired])
        return [queue for queue, logical in groups.items()
                if not any(name in live for name in logical)]

    def sweep(self) -> dict[str, int]:
        """One pass: drain every known tier queue that has no live consumer.

        In coexistence nothing should wait in a tier queue at all (a rollback drained
        them; only a process that could not see the change still routes), so every
        tier queue is drained.
        """
        store = self.middleware.store
        stage, _ = stage_from_doc(store.read_stage(), self.middleware.policy)
        former = self._former_batch()
        retired = self._retired_batch()
        if stage is Stage.COEXISTENCE:
            return self.evacuate(self.known_queues() + retired + former)
        return self.evacuate(self.orphaned(store.live_queues(), retired) + former)

    def every_queue(self) -> list[str]:
        """Every tier queue a message may wait in: the policy's, the classed tenants'
        former ones and the retired ones (``celery aitp evacuate --all``)."""
        return self.known_queues() + self.former_queues() + self.retired_queues()

    def _retired_batch(self) -> list[str]:
        """The retired queues to look at this pass: all of them, or the next
        ``FORMER_PER_PASS`` in turn when there are more (an old policy that listed
        thousands of tenants: on RabbitMQ each missing queue costs a channel)."""
        retired = self.retired_queues()
        if len(retired) <= self.FORMER_PER_PASS:
            return retired
        start = self._retired_next % len(retired)
        self._retired_next = start + self.FORMER_PER_PASS
        return (retired + retired)[start:start + self.FORMER_PER_PASS]

    def _former_batch(self) -> list[str]:
        """The next former queues to look at, until each has been once."""
        start = self._former_next
        if start is None:
            return []
        former = self.former_queues()
        end = start + self.FORMER_PER_PASS
        self._former_next = end if end < len(former) else None
        return former[start:end]

    def run(self, stop: threading.Event) -> None:
        """Sweep every ``evacuate_interval_s`` until ``stop`` is set; one sweeper at a time."""
        settings = self.middleware.settings
        interval = settings.evacuate_interval_s
        lock_key = self.middleware.store.keys.janitor_lock
        while not stop.wait(interval):
            try:
                if self.middleware.store.try_lock(lock_key, interval * 0.9, self.owner):
                    self.sweep()
            except (StoreError, AdapterError) as exc:
                logger.warning("aitp: janitor pass skipped: %s", redact(exc))
            except Exception:
                logger.exception("aitp: janitor pass failed")
