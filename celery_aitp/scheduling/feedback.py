"""Feedback from what happens: a tenant that misses its SLAs gets a bounded boost.

Workers add every run's wait to a decaying store hash (``waits``, half-life
``feedback.window_s``): per tenant and tier, the runs (``n:<tenant>:<tier>``) and the
misses (``m:<tenant>:<tier>``: waited longer than the tier's ``sla_s``, or the tenant's
``sla_s`` when that is tighter). One process at a time (the workers' feedback pass, under
the store lock ``lock:feedback``) turns them into boosts every few seconds:

* a tenant that missed more than ``feedback.max_miss_rate`` of its recent runs has its
  boost doubled, up to ``feedback.max_boost``;
* one that missed less than half of that (or ran nothing recently) has it halved, down
  to 1 (no boost);
* in between, or with fewer than ``feedback.min_runs`` recent runs, it stays.

So a boost rises within one pass of the misses showing up and falls back as slowly as
the waits' window forgets them. Every change is kept in the store hash ``boosts`` and in
an audit log (``celery aitp boosts`` shows both). Producers read the boosts in the
background (:class:`BoostSource`) and divide a boosted tenant's effective sizes by its
boost, so its tasks climb the size classes until it meets its SLAs again: never above its
``max_tier``, and at most ``max_boost`` times shorter than they are.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.priority_policy import FeedbackSettings
from celery_aitp.store.decayed import DecayedSums, decayed_values, decode_hash
from celery_aitp.store.redis_store import RedisStore, translated_errors

logger = logging.getLogger(__name__)

#: The live-view source name (``view.sources``).
BOOSTS_SOURCE = "boosts"
#: Audit entries kept.
HISTORY_LIMIT = 1000


def waits_key(store: RedisStore) -> str:
    return store.keys.any("waits")


def boosts_key(store: RedisStore) -> str:
    return store.keys.any("boosts")


def history_key(store: RedisStore) -> str:
    return store.keys.any("boosts", "history")


def sla_of(policy: Policy, tenant: str, tier: str) -> float | None:
    """The wait a run of ``tenant`` in ``tier`` should stay within, if any."""
    tier_sla = next((t.sla_s for t in policy.tiers if t.name == tier), None)
    spec = policy.tenant_spec(tenant)  # an unlisted tenant: its class's
    tenant_sla = spec.sla_s if spec is not None else None
    if tier_sla is None:
        return tenant_sla
    return tier_sla if tenant_sla is None else min(tier_sla, tenant_sla)


def wait_fields(policy: Policy, tenant: Any, tier: Any, wait_s: Any) -> dict[str, float]:
    """The ``waits`` increments of one observed run (none for a run it cannot judge:
    an unknown tenant or tier, or no usable wait)."""
    if not isinstance(tenant, str) or not isinstance(tier, str) or \
            isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or \
            not 0 <= wait_s < 1e9 or tenant not in policy.tenants:
        return {}
    sla = sla_of(policy, tenant, tier)
    if sla is None:
        return {}
    missed = 1.0 if wait_s > sla else 0.0
    return {f"n:{tenant}:{tier}": 1.0, f"m:{tenant}:{tier}": missed}


def miss_stats(values: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """(recent runs, recent misses) per tenant, from the decayed ``waits`` hash."""
    found: dict[str, list[float]] = {}
    for name, value in values.items():
        kind, _, rest = name.partition(":")
        tenant = rest.rpartition(":")[0]
        if kind not in ("n", "m") or not tenant or not value >= 0:
            continue
        found.setdefault(tenant, [0.0, 0.0])[0 if kind == "n" else 1] += value
    return {tenant: (runs, min(misses, runs)) for tenant, (runs, misses) in found.items()}


@dataclass(frozen=True)
class Change:
    """One boost change, as the audit log keeps it."""

    tenant: str
    old: float
    new: float
    why: str


def next_boosts(stats: Mapping[str, tuple[float, float]], current: Mapping[str, float],
                settings: FeedbackSettings) -> tuple[dict[str, float], list[Change]]:
    """The boosts after one pass (tenants at 1 left out) and what changed, and why."""
    boosts: dict[str, float] = {}
    changes: list[Change] = []
    allowed = settings.max_miss_rate
    for tenant in sorted(set(stats) | set(current)):
        runs, misses = stats.get(tenant, (0.0, 0.0))
        old = current.get(tenant, 1.0)
        rate = misses / runs if runs > 0 else 0.0
        new = old
        if runs >= settings.min_runs and rate > allowed:
            new = min(settings.max_boost, old * 2.0)
        elif rate < allowed / 2:
            new = max(1.0, old / 2.0)
        if new > 1.0:
            boosts[tenant] = new
        if new != old:
            changes.append(Change(tenant, old, new, (
                f"{rate:.0%} of {runs:.0f} recent runs waited past their SLA "
                f"(allowed {allowed:.0%})")))
    return boosts, changes


class Boosts:
    """The boosts in force, by tenant (1 for a tenant not named). Immutable."""

    __slots__ = ("by_tenant",)

    def __init__(self, by_tenant: Mapping[str, float] | None = None) -> None:
        self.by_tenant: dict[str, float] = dict(by_tenant or {})

    def of(self, tenant: str) -> float:
        return self.by_tenant.get(tenant, 1.0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Boosts) and other.by_tenant == self.by_tenant

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.by_tenant.items())))


def read_boosts(store: RedisStore, policy: Policy) -> Boosts:
    """The boosts in the store, kept to the policy's tenants and to [1, max_boost]
    (anyone who can write the store can write this hash)."""
    with translated_errors():
        raw = decode_hash(store.client.hgetall(boosts_key(store)))
    found = {}
    for tenant, text in raw.items():
        try:
            value = float(text)
        except ValueError:
            continue
        if tenant in policy.tenants and value > 1.0:
            found[tenant] = min(value, policy.feedback.max_boost)
    return Boosts(found)


def boost_history(store: RedisStore, limit: int = 50) -> list[dict[str, Any]]:
    """The last boost changes, newest first."""
    with translated_errors():
        raw = store.client.lrange(history_key(store), 0, max(0, limit - 1))
    found = []
    for item in raw:
        try:
            doc = json.loads(item)
        except ValueError:
            continue
        if isinstance(doc, dict):
            found.append(doc)
    return found


class BoostSource:
    """Live-view source ``boosts``: the boosts in force; the same object until they
    change (decisions depend on it as a whole)."""

    name = BOOSTS_SOURCE
    initial = Boosts()

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def fetch(self, store: RedisStore, previous: Any) -> Boosts:
        found = read_boosts(store, self.policy)
        return previous if found == previous else found


class FeedbackPass:
    """Adjusts the boosts every ``interval_s``, one process at a time (store lock)."""

    def __init__(self, store: RedisStore, policy: Policy, interval_s: float) -> None:
        self.store = store
        self.policy = policy
        self.interval_s = interval_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def step(self, now: float | None = None) -> list[Change]:
        """One pass: read the recent waits and the boosts, write what changed."""
        now = time.time() if now is None else now
        store = self.store
        with translated_errors():
            raw = store.client.hgetall(waits_key(store))
        stats = miss_stats(decayed_values(decode_hash(raw), now)[0])
        current = read_boosts(store, self.policy).by_tenant
        boosts, changes = next_boosts(stats, current, self.policy.feedback)
        if not changes:
            return changes
        who = f"feedback@{self.owner}"
        with translated_errors():
            pipe = store.client.pipeline(transaction=True)
            pipe.delete(boosts_key(store))
            if boosts:
                pipe.hset(boosts_key(store), mapping={t: repr(b) for t, b in boosts.items()})
            for change in changes:
                pipe.lpush(history_key(store), json.dumps({
                    "at": now, "who": who, "tenant": change.tenant, "old": change.old,
                    "new": change.new, "why": change.why}))
            pipe.ltrim(history_key(store), 0, HISTORY_LIMIT - 1)
            pipe.execute()
        for change in changes:
            logger.info("aitp: boost of %s %g -> %g: %s", change.tenant, change.old,
                        change.new, change.why)
        return changes

    def run(self, stop: threading.Event) -> None:
        """A pass every ``interval_s`` until ``stop`` is set."""
        lock = self.store.keys.feedback_lock
        while not stop.wait(self.interval_s):
            try:
                if self.store.try_lock(lock, self.interval_s * 0.9, self.owner):
                    self.step()
            except Exception as exc:  # never stop the worker; try again next time
                logger.warning("aitp: feedback pass skipped: %r", exc)


class WaitSink:
    """Observed waits of one process, shipped to the ``waits`` hash in batches."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}

    def add(self, tenant: Any, tier: Any, wait_s: Any) -> None:
        fields = wait_fields(self.policy, tenant, tier, wait_s)
        if not fields:
            return
        with self._lock:
            for name, value in fields.items():
                self._pending[name] = self._pending.get(name, 0.0) + value

    def queue_flush(self, pipe: Any, store: RedisStore, now: float) -> dict[str, float]:
        """Queue the pending sums on ``pipe``; returns them (to put back on failure)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if pending:
            DecayedSums(store).add(pipe, waits_key(store), pending, now,
                                   self.policy.feedback.window_s)
        return pending

    def put_back(self, pending: Mapping[str, float]) -> None:
        with self._lock:
            for name, value in pending.items():
                self._pending[name] = self._pending.get(name, 0.0) + value
