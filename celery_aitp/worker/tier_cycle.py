"""Weighted tier order for AITP workers on Redis: tiers first, no tier starves.

Kombu's Redis transport asks its queue-order strategy for the order of the queues in
each ``BRPOP`` (the first non-empty queue in that order is served) and tells it which
queue was served (``rotate``). :class:`WeightedTierCycle` is such a strategy
(``broker_transport_options['queue_order_strategy']``), doing stride scheduling:

* every queue ``q`` has a weight ``w_q`` (its tier's read weight times its tenant's
  fair-share weight, see :func:`queue_weights`) and a *pass* value;
* queues are offered in increasing pass (ties: heavier first), and the served queue's
  pass grows by ``1 / w_q``;
* a queue that was offered before the served one was empty at that moment, so its pass
  is raised to the served queue's: a queue cannot save up credit while idle and then
  burst.

While every queue has work, queue ``q`` gets ``w_q / sum(w)`` of the reads; an empty
higher tier costs nothing (the read goes to the next queue). A backlogged queue's pass
stands still while the others' grow, so its rank rises with every read it waits: the
effective priority of its oldest message rises with waiting time.

**Bound.** Between two reads of a backlogged queue ``q`` (among ``m`` queues of total
weight ``W``) there are at most ``G_q = ceil(W / w_q) + 2m`` reads of other queues; a
message with ``k`` messages ahead of it in its queue is read within ``(k + 1) * (G_q +
1)`` reads. With ``c`` pool processes and runs of at most ``R`` seconds, reads happen
at least ``c`` per ``R`` while the worker is saturated, so it waits at most
``(ceil((k + 1) * (G_q + 1) / c) + 1) * R`` (see :func:`longest_wait_s`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.queues import parse_tier_queue

#: The strategy's dotted name, as ``queue_order_strategy`` takes it.
STRATEGY = "celery_aitp.worker.tier_cycle:WeightedTierCycle"
#: Pass values are shifted back to 0 beyond this, keeping float steps exact.
_RENORMALISE_AT = 1e6

_lock = threading.Lock()
_weights: dict[str, float] = {}
_default_weight = 1.0


def queue_weights(policy: Policy, queues: Iterable[str]) -> tuple[dict[str, float], float]:
    """Read weight of each tier queue, and the weight of any other queue (the lowest tier's).

    ``weight(aitp.<tenant>.<acc>.<tier>) = tier weight * tenant fair-share weight``.
    """
    tiers = policy.tier_weights()
    out: dict[str, float] = {}
    for name in queues:
        parsed = parse_tier_queue(name)
        if parsed is None:
            continue
        tenant, _, tier = parsed
        spec = policy.tenants.get(tenant)
        out[name] = tiers.get(tier, min(tiers.values())) * (spec.weight if spec else 1.0)
    return out, min(tiers.values())


def configure(weights: Mapping[str, float], default: float = 1.0) -> None:
    """Set the weights every :class:`WeightedTierCycle` of this process uses (bootstep)."""
    global _default_weight
    with _lock:
        _weights.clear()
        _weights.update(weights)
        _default_weight = float(default)


def weight_of(queue: str) -> float:
    return _weights.get(queue, _default_weight)


def longest_wait_s(weights: Mapping[str, float], queue: str, ahead: int, processes: int,
                   max_runtime_s: float) -> float:
    """The documented bound on a message's wait in ``queue`` (module docstring)."""
    total = sum(weights.values())
    gap = math.ceil(total / weights[queue]) + 2 * len(weights)
    reads = (ahead + 1) * (gap + 1)
    return (math.ceil(reads / max(1, processes)) + 1) * max_runtime_s


class WeightedTierCycle:
    """A kombu queue-order strategy (``update`` / ``consume`` / ``rotate``)."""

    def __init__(self, it: Any = None) -> None:
        self.items: list[str] = []
        self.passes: dict[str, float] = {}
        self._offered: list[str] = []
        self.update(it or [])

    def update(self, it: Iterable[str]) -> None:
        """The queues being consumed changed; a new queue starts at the current minimum."""
        items = list(it)
        start = min(self.passes.values(), default=0.0)
        self.passes = {q: self.passes.get(q, start) for q in items}
        self.items[:] = items

    def consume(self, n: int) -> list[str]:
        """The queue order for the next read: lowest pass first, heavier first on ties."""
        index = {q: i for i, q in enumerate(self.items)}
        order = sorted(self.items, key=lambda q: (self.passes.get(q, 0.0), -weight_of(q),
                                                  index[q]))[:n]
        self._offered = order
        return order

    def rotate(self, last_used: str) -> str:
        """Charge the served queue; queues offered before it were empty: no credit."""
        passes = self.passes
        base = passes.get(last_used)
        if base is None:
            return last_used
        for queue in self._offered:
            if queue == last_used:
                break
            if passes.get(queue, base) < base:
                passes[queue] = base
        passes[last_used] = base + 1.0 / weight_of(last_used)
        low = min(passes.values())
        if low > _RENORMALISE_AT:
            for queue in passes:
                passes[queue] -= low
        return last_used
