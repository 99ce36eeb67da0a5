"""Occupancy reports: what producers need to tell a saturated tier from an idle fleet.

Every worker of an app with the middleware (standard ones too) writes one JSON document
to the store hash ``occupancy`` every ``spill.report_interval_s``: its pool slots, how
many are busy (requests the pool has accepted, as the main process sees them), its
accelerator class, whether it consumes Celery's default queue, and, for a worker that
serves tier queues, those queues and their depths on the broker. Producers read the
whole hash in their background refresh (:mod:`celery_aitp.scheduling.spill`); the
report is removed when the worker stops, ignored once older than
``spill.max_report_age_s`` and deleted by the readers after an hour (a worker killed
without stopping). Its ``at`` is the store server's time, as the readers' ``now``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery_aitp.errors import AdapterError, StoreError
from celery_aitp.layout import physical_groups
from celery_aitp.redact import redact
from celery_aitp.scheduling.spill import occupancy_key
from celery_aitp.store.redis_store import translated_errors
from celery_aitp.worker.janitor import BrokerQueuePass

logger = logging.getLogger(__name__)


def busy_requests() -> int:
    """Requests this worker's pool is running now (Celery's own bookkeeping)."""
    from celery.worker import state

    return len(state.active_requests)


class OccupancyReporter(BrokerQueuePass):
    """Writes this worker's occupancy report periodically."""

    def __init__(self, middleware: Any, hostname: str, slots: int, accelerator: str,
                 tier_queues: Sequence[str], consumes_default: Callable[[], bool],
                 busy: Callable[[], int] = busy_requests, ops: Any = None) -> None:
        super().__init__(middleware, ops)
        self.hostname = hostname
        self.slots = max(1, int(slots or 1))
        self.accelerator = accelerator
        self.tier_queues = list(tier_queues)
        self.consumes_default = consumes_default
        self.busy = busy

    def depths(self) -> dict[str, int]:
        """Waiting messages of each tier queue served here (on RabbitMQ, where one broker
        queue holds a tenant's tiers, each tier gets the whole broker queue's depth)."""
        if not self.tier_queues:
            return {}
        groups = physical_groups(self.middleware.layout, self.tier_queues)
        found = self.ops.depths(list(groups))
        return {logical: int(found.get(physical, 0))
                for physical, names in groups.items() for logical in names}

    def report(self) -> dict[str, Any]:
        """This worker's occupancy document (raises AdapterError if the broker fails);
        :meth:`publish` replaces its ``at`` by the store server's time."""
        return {"at": time.time(), "worker": self.hostname, "slots": self.slots,
                "busy": min(self.slots, max(0, self.busy())),
                "accelerator": self.accelerator, "default_queue": self.consumes_default(),
                "queues": self.tier_queues, "depths": self.depths()}

    def publish(self) -> None:
        """Write one report, its ``at`` the store server's time, the clock its readers
        judge its age and prune it by (raises StoreError or AdapterError)."""
        store = self.middleware.store
        store.put_stamped(occupancy_key(store), self.hostname, self.report(), "at")

    def withdraw(self) -> None:
        store = self.middleware.store
        try:
            with translated_errors():
                store.client.hdel(occupancy_key(store), self.hostname)
        except StoreError as exc:
            logger.warning("aitp: could not withdraw the occupancy report: %s", redact(exc))

    def run(self, stop: threading.Event) -> None:
        interval = self.middleware.policy.spill.report_interval_s
        while True:
            try:
                self.publish()
            except (StoreError, AdapterError) as exc:
                logger.debug("aitp: occupancy report failed: %s", redact(exc))
            except Exception:  # never let the reporter die
                logger.exception("aitp: occupancy report failed")
            if stop.wait(interval):
                return
