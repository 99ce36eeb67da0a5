"""A process kept for shorter work: the longest tasks never hold every process.

Tiers are size classes (docs/placement.md), so a worker's lowest tier holds its longest
tasks. When they fill every process, a short task that arrives waits for a long run to
end; no order of the queue avoids that wait, since a run is never interrupted. So an
AITP worker on Redis with ``c`` processes (``c >= processes + 2``) starts a lowest-tier
task only while fewer than ``c - reserve.processes`` of its processes run long work: a
lowest-tier task, or any other that has already run as long as the worker's mean
lowest-tier run (its short prediction proved wrong, and it holds the process as long
work would: trace replay, HPC2N, the first model kept, mean slowdown 102 -> 90;
docs/performance.md). The
weighted tier order (:mod:`~celery_aitp.worker.tier_cycle`) leaves the lowest tier's
queues out of a read while the reserve holds.

It holds only while it can pay off, and never for long:

* only while a higher tier was read within the last ``max_wait_runs`` mean lowest-tier
  runs: a worker whose tasks all land in the lowest tier (cold start, no size classes
  yet) reads its queues as before; until this worker has timed a lowest-tier run the
  fleet's mean one (the ``usage`` source) counts instead, and with neither the reserve
  does not hold at all;
* a lowest-tier task that has waited ``max_wait_runs`` mean lowest-tier runs (the oldest
  one in its queues, sampled every :data:`SAMPLE_S` while the lowest tier is capped) may
  take a kept process, and so may any while more of them wait than the tier may run at
  once (a backlog the capped tier cannot drain: the worker is loaded with long work, and
  keeping a process would only let it grow).

The same wait also ages the lowest tier while it runs on fewer than its share of
processes: while higher tiers are read and the lowest was not for half a max wait, its
oldest wait is sampled too, and once it reaches ``max_wait_runs`` mean runs the next read
offers the lowest tier's queues first. Under a backlog of higher tiers the weighted order
alone reads the lowest tier once in 73 reads (placement benchmark, pareto: long tasks
waited up to 2.6x FIFO's longest wait). At its share it is not put first: on a mix whose
long work needs most of the worker, that cost the short tasks' p95 wait 0.47 -> 0.77x
FIFO's (bimodal).

Each time a lowest-tier task takes a kept process, and each time the lowest tier is read
first, the worker counts it (``reserve:let_go_age``, ``reserve:let_go_backlog``,
``reserve:let_go_unread`` while the broker cannot be read, ``reserve:read_first``;
``aitp_reserve_events_total`` on the dashboard): how often the short tasks' process went
to long work, and why.

**Bound.** A lowest-tier task waits at most ``max_wait_runs * R_lo + 2 * SAMPLE_S`` plus
one run (``R_lo``: the worker's mean lowest-tier run; one sample period to be seen, one
broker poll to be read: the worker polls every :data:`SAMPLE_S` while the reserve is on;
then the next process to be free while the tier runs below its share reads it first).

**An express worker makes it stand aside.** A live express worker
(``--aitp-express``) reading every top-tier queue of this worker runs short tasks
beside the long ones (one process more on the same cores: the operating system
time-slices it in), which a kept process only approximates: while one is advertised
(:func:`express_covers`) the reserve does not hold and this worker's long work may take
every process (quick 20 s placement runs, bimodal: long tasks' longest wait 1.91x ->
0.92x FIFO's, short tasks' p95 0.08x -> 0.06x). The lowest tier's aging (below) goes on.

On a simulated worker (4 processes, 85% load, exact sizes, strict tiers) a reserve of
one cut the mean slowdown of a 10-50 ms / 0.5-1.5 s mix by 15-25% and the short tasks'
p95 wait by 15-30%, while the long tasks' longest wait rose from 1.1x to 1.6-1.75x FIFO's
(``max_wait_runs`` 1.5); the real worker gains less (docs/performance.md).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.priority_policy import TierOrder
from celery_aitp.queues import queues_of_tier
from celery_aitp.redact import redact
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker.janitor import BrokerQueuePass

logger = logging.getLogger(__name__)

#: Seconds between two samples of the lowest tier's oldest wait (and the broker poll
#: interval of a worker with the reserve on).
SAMPLE_S = 0.25
#: Weight of the latest run in the mean lowest-tier runtime (an exponential average; the
#: first ``1 / RUNTIME_WEIGHT`` runs weigh alike, so one long first run does not set the
#: starvation bound for the next twenty).
RUNTIME_WEIGHT = 0.1


def lowest_tier_queues(policy: Policy, queues: Iterable[str]) -> list[str]:
    """The queues among ``queues`` of the policy's lowest tier (the over-share lane of
    that tier included)."""
    return queues_of_tier(queues, policy.tier_names[-1])


def reserved_queues(policy: Policy, queues: Collection[str], processes: int) -> list[str]:
    """The lowest tier's queues a worker reading ``queues`` with ``processes`` keeps a
    reserve against, or [] when it keeps none: the policy keeps processes, the worker
    reads in the weighted order, has ``reserve.processes + 2`` processes or more, and
    reads queues of the lowest tier and of a higher one (the worker's bootstep and the
    replay both ask here)."""
    kept = policy.reserve.processes
    lowest = lowest_tier_queues(policy, queues)
    if (not kept or policy.tier_order is not TierOrder.WEIGHTED
            or processes < kept + 2 or len(lowest) == len(queues)):
        return []
    return lowest


def express_covers(workers: Iterable[Mapping[str, Any]], queues: Collection[str],
                   now: float, ttl_s: float) -> bool:
    """Whether express workers advertised within ``ttl_s`` (``--aitp-express``, the
    store's worker documents) read every one of ``queues``: a worker's top-tier queues."""
    served: set[str] = set()
    for doc in workers:
        beat = doc.get("heartbeat")
        queues_read = doc.get("queues")
        if doc.get("express") is True and isinstance(beat, (int, float)) \
                and now - beat <= ttl_s and isinstance(queues_read, list):
            served.update(q for q in queues_read if isinstance(q, str))
    return bool(queues) and set(queues) <= served


def running_requests() -> list[Any]:
    """Requests this worker holds (received, not finished): Celery's own bookkeeping.

    A strict worker holds no message in reserve, so these are the running ones and the
    one being handed to a process."""
    from celery.worker import state

    return list(state.reserved_requests)


def _queue_of(request: Any) -> Any:
    delivery = getattr(request, "delivery_info", None) or {}
    return delivery.get("routing_key")


class Reserve:
    """Whether the lowest tier must wait for a process (``holds``), from what runs here."""

    def __init__(self, lowest: Collection[str], processes: int, kept: int,
                 max_wait_runs: float, requests: Callable[[], Iterable[Any]] = running_requests,
                 clock: Callable[[], float] = time.monotonic,
                 counters: Counters | None = None) -> None:
        self.lowest = frozenset(lowest)
        self.limit = processes - kept  # long runs allowed at once
        self.max_wait_runs = max_wait_runs
        self.requests = requests
        self.clock = clock
        self.counters = counters
        self.mean_runtime_s: float | None = None  # of this worker's lowest-tier runs
        self._runs_timed = 0
        #: The fleet's mean run of this worker's lowest tier (the ``usage`` source, set by
        #: :func:`~celery_aitp.worker.tier_cycle.follow_usage`), counted in until this
        #: worker has timed a run of its own.
        self.fleet_runtime_s: float | None = None
        self.oldest_wait_s = 0.0  # sampled from the broker while capped
        self.waiting = 0  # the lowest tier's waiting tasks, sampled likewise
        #: Whether the lowest tier holds its share of processes (and higher tiers are in
        #: use): the reserve holds unless its oldest task waited too long.
        self.capped = False
        #: Whether the sampler reads the lowest tier's queues: while capped, or while
        #: higher tiers are read and the lowest tier was not for half a max wait.
        self.watching = False
        #: Whether a live express worker reads this worker's top tier: the reserve
        #: stands aside (module docstring).
        self.express_live = False
        self._higher_read_at = -math.inf
        self._lowest_read_at = -math.inf
        self._started: dict[Any, tuple[float, bool]] = {}  # request -> (start, lowest)
        #: What a lowest-tier read after the last :meth:`holds` / :meth:`overdue` counts
        #: as: the reserve let go (its reason), the tier was offered first, or nothing.
        self._counts_as: str | None = None
        self._lock = threading.Lock()

    @property
    def runtime_s(self) -> float | None:
        """The mean lowest-tier run the bound counts in: this worker's, else the fleet's.

        A new worker has timed none, and without the fleet's it neither kept a process
        nor aged the lowest tier until its first long run ended and then bounded the
        wait by that one run (placement benchmark, pareto, each run on new workers: the
        long tasks' longest waits, up to 2.2x-4.1x FIFO's, in the first 10 s)."""
        mean = self.mean_runtime_s
        return self.fleet_runtime_s if mean is None else mean

    def follow_fleet(self, tier_runtime: Mapping[str, float],
                     tier_of: Mapping[str, str]) -> None:
        """Take the fleet's mean lowest-tier run from the ``usage`` source's
        ``tier_runtime`` (``<accelerator>.<tier>`` -> seconds); ``tier_of`` maps a queue
        to that key. Of several accelerator classes, the longest mean counts; a mean
        that is not a positive finite number is ignored (anyone who can write the store
        can write the hash, and an infinite one would switch the aging off)."""
        means = [mean for mean in (tier_runtime.get(key, 0.0) for key in
                                   (tier_of.get(q) for q in self.lowest) if key is not None)
                 if 0.0 < mean < math.inf]
        self.fleet_runtime_s = max(means) if means else None

    @property
    def max_wait_s(self) -> float:
        """How long the reserve may keep a lowest-tier task waiting (inf: not yet known)."""
        mean = self.runtime_s
        return math.inf if mean is None else self.max_wait_runs * mean

    def holds(self) -> bool:
        """Whether the next read must leave the lowest tier's queues out."""
        now = self.clock()
        with self._lock:
            running = self._track(now)
            wait = self.max_wait_s
            busy = wait < math.inf and now - self._higher_read_at <= wait
            self.capped = busy and running >= self.limit and not self.express_live
            self.watching = self.capped or (busy and now - self._lowest_read_at >= wait / 2)
            oldest = self.oldest_wait_s
            held = self.capped and oldest < wait and self.waiting <= self.limit
            self._counts_as = None  # why a kept process may go to the lowest tier:
            if self.capped and not held:
                if oldest == math.inf:
                    self._counts_as = "let_go_unread"  # its queues cannot be read
                elif oldest >= wait:
                    self._counts_as = "let_go_age"
                else:
                    self._counts_as = "let_go_backlog"
            return held

    def lets_go_at(self, oldest_wait_s: float) -> float:
        """When, on this reserve's clock, :meth:`holds` turns false by time alone: the
        oldest lowest-tier task (``oldest_wait_s`` old now) reaches the longest wait, or
        no higher tier has been read for that long (inf: no runs timed yet). The replay
        wakes a simulated worker then; a real one polls every :data:`SAMPLE_S`."""
        wait = self.max_wait_s
        return min(self.clock() + wait - oldest_wait_s, self._higher_read_at + wait)

    def overdue(self) -> bool:
        """Whether the lowest tier's oldest task has waited ``max_wait_s`` while the tier
        runs on fewer than its share of processes: the next read offers it first. At its
        share, the reserve only lets go (a tier loaded with long work that went first
        would take every process from the short tasks). A broker that cannot be read
        proves nothing. Asked right after :meth:`holds`, whose ``capped`` it reads (the
        tier cycle asks both for one read)."""
        first = not self.capped and self.max_wait_s <= self.oldest_wait_s < math.inf
        if first:
            self._counts_as = "read_first"
        return first

    def read(self, queue: str) -> None:
        """A message was read from ``queue`` (any queue but the lowest tier's is higher)."""
        if queue not in self.lowest:
            self._higher_read_at = self.clock()
        else:  # most likely the oldest one: the next sample tells
            self._lowest_read_at = self.clock()
            self.oldest_wait_s = 0.0
            if self._counts_as is not None and self.counters is not None:
                self.counters.incr(f"reserve:{self._counts_as}")

    def sampled(self, oldest_wait_s: float, waiting: int = 0) -> None:
        """The longest wait among the lowest tier's queues and how many tasks wait in
        them, as the sampler found them."""
        self.oldest_wait_s = oldest_wait_s
        self.waiting = waiting

    def _track(self, now: float) -> int:
        """Count the long runs: the lowest tier's, and any other that has run as long as
        the mean lowest-tier run (a short prediction that proved wrong holds a process
        as long work does). Each run is timed from its start (Celery's ``time_start``,
        else first seen here); a lowest-tier run's end (the first read after it) feeds
        the mean."""
        # by task id: an object's id() is reused
        seen = {getattr(r, "id", None) or id(r): r for r in self.requests()}
        started = self._started
        for key in [k for k in started if k not in seen]:
            at, lowest = started.pop(key)
            if lowest:
                self._observe(now - at)
        for key, request in seen.items():
            if key not in started:
                began = getattr(request, "time_start", None)
                at = now - max(0.0, time.time() - began) if isinstance(began, float) else now
                started[key] = (at, _queue_of(request) in self.lowest)
        mean = self.runtime_s
        long_after = math.inf if mean is None else mean
        return sum(1 for at, lowest in started.values() if lowest or now - at >= long_after)

    def _observe(self, runtime_s: float) -> None:
        self._runs_timed += 1
        mean = self.mean_runtime_s or 0.0
        weight = max(RUNTIME_WEIGHT, 1.0 / self._runs_timed)
        self.mean_runtime_s = mean + weight * (runtime_s - mean)


class ReserveSampler(BrokerQueuePass):
    """Reads the oldest wait of the lowest tier's queues while the reserve watches them."""

    def __init__(self, middleware: Any, reserve: Reserve, ops: Any = None) -> None:
        super().__init__(middleware, ops)
        self.reserve = reserve
        self.queues = sorted(reserve.lowest)
        self.failing = False  # the last sample failed (its warning is logged once)

    def sample(self) -> None:
        """One sample (nothing to read while the reserve does not watch). The depths
        come first, in one call: only the queues that hold a task have their oldest one
        read (a busy worker's lowest tier is often empty, and it may have a queue per
        tenant)."""
        if not self.reserve.watching:
            self.reserve.sampled(0.0)
            return
        ops = self.ops
        depths = ops.depths(self.queues)
        waiting = [q for q, n in depths.items() if n]
        ages = ops.oldest_ages(waiting, time.time()) if waiting else {}
        self.reserve.sampled(max((a for a in ages.values() if a is not None), default=0.0),
                             sum(depths.values()))

    def tick(self) -> None:
        """One sample that never raises: if the broker cannot be read, the reserve lets
        go (it cannot tell how long the lowest tier has waited) until a sample succeeds;
        the first failure of a run of them is logged."""
        try:
            self.sample()
        except Exception as exc:
            self.reserve.sampled(math.inf)
            if not self.failing:
                logger.warning("aitp: reserve lets go until the lowest tier's queues can "
                               "be read again: %s", redact(repr(exc)))
            self.failing = True
            return
        self.failing = False

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_S):
            self.tick()
