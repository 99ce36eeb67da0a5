"""Fold observed runs into profile histograms, per-tenant usage and waits, shipped in batches.

The run observer hands every record to :meth:`RunLedger.add` (in the pool process, a few
dict updates). The live view's background round calls :meth:`RunLedger.flush`, which
sends everything pending in one pipeline: one atomic histogram update per task name
and one usage update. If the store is down the batch is kept (it is a sum, so it stays
small) and sent with the next round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery_aitp.errors import StoreError
from celery_aitp.policy import Policy, TenantNames
from celery_aitp.profiles.samples import fold, run_fields
from celery_aitp.profiles.store import ProfileStore
from celery_aitp.scheduling.feedback import WaitSink
from celery_aitp.scheduling.usage import UsageStore
from celery_aitp.store.redis_store import RedisStore, translated_errors
from celery_aitp.telemetry.counters import Counters

logger = logging.getLogger(__name__)

#: Distinct task names kept pending between two rounds; others wait (and are counted).
MAX_PENDING_TASKS = 10_000
MAX_TASK_NAME = 200


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < 1e9 else None


class RunLedger:
    """Pending profile samples and observed usage of one process."""

    def __init__(self, policy: Policy, counters: Counters,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.counters = counters
        self.clock = clock
        self._lock = threading.Lock()
        self._profiles: dict[str, dict[str, float]] = {}
        self._usage: dict[str, float] = {}
        self.waits = WaitSink(policy)  # what the feedback pass judges SLAs by
        self.tenants = TenantNames(policy)  # listed, or unlisted when the policy takes them
        #: the tiers whose mean run is kept (``s:``/``k:`` usage fields; a bounded set)
        self.tier_keys = frozenset(f"{accelerator}.{tier}" for accelerator in policy.accelerators
                                   for tier in policy.tier_names)

    def add(self, record: Mapping[str, Any]) -> None:
        """Take one observation record (never raises on odd input)."""
        task = record.get("task")
        if not isinstance(task, str) or not task or len(task) > MAX_TASK_NAME:
            self.counters.incr("ledger_skipped")
            return
        fields = run_fields(record)
        tenant = record.get("tenant")
        self.waits.add(tenant, record.get("tier"), record.get("wait_s"))
        runtime = _seconds(record.get("runtime_s"))
        with self._lock:
            batch = self._profiles.get(task)
            if batch is None:
                if len(self._profiles) >= MAX_PENDING_TASKS:
                    self.counters.incr("ledger_dropped")
                    return
                batch = self._profiles[task] = {}
            fold(batch, fields)
            if runtime is None:
                return
            if isinstance(tenant, str) and tenant in self.tenants:
                fold(self._usage, {f"o:{tenant}": runtime, f"r:{tenant}": 1.0})
            tier = f"{record.get('accelerator')}.{record.get('tier')}"
            if tier in self.tier_keys:
                fold(self._usage, {f"s:{tier}": runtime, f"k:{tier}": 1.0})

    def take(self) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        with self._lock:
            profiles, self._profiles = self._profiles, {}
            usage, self._usage = self._usage, {}
        return profiles, usage

    def put_back(self, profiles: dict[str, dict[str, float]], usage: dict[str, float]) -> None:
        with self._lock:
            for task, batch in profiles.items():
                fold(self._profiles.setdefault(task, {}), batch)
            fold(self._usage, usage)

    def flush(self, store: RedisStore) -> None:
        """Send what is pending in one round trip (called by the live view's refresher)."""
        profiles, usage = self.take()
        now = self.clock()
        profile_store = ProfileStore(store, self.policy.profiles)
        waits: dict[str, float] = {}
        try:
            with translated_errors():
                pipe = store.client.pipeline(transaction=False)
                profile_store.queue_writes(pipe, profiles, now)
                UsageStore(store, self.policy.fair_share.half_life_s).queue_add(pipe, usage, now)
                waits = self.waits.queue_flush(pipe, store, now)
                if not profiles and not usage and not waits:
                    return
                replies = pipe.execute()
        except StoreError:
            self.put_back(profiles, usage)
            self.waits.put_back(waits)
            raise
        if profiles:
            size = replies[len(profiles) + 1]  # the index's HLEN after the histogram updates
            if isinstance(size, int) and size > self.policy.profiles.max_tasks:
                dropped = profile_store.trim(size)
                self.counters.incr("profiles_trimmed", dropped)
