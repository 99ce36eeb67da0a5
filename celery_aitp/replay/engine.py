"""The discrete-event core: arrivals, queues and worker slots, as Redis workers consume.

Consumption follows kombu's Redis transport exactly where it matters for waits: a
worker with a free slot reads the first non-empty key in the order ``for step in
priority steps: for queue in cycle.consume(...)`` (``Channel._brpop_start``), FIFO
within a key, then calls ``cycle.rotate(queue)``. The cycle is kombu's own strategy
class (``priority`` for AITP workers: tiers highest first, no rotation), so another
strategy (a weighted tier cycle, round robin) plugs in by name. A slot takes a message
only when it is free (prefetch 1 with late acks, the AITP worker default). An arriving
task goes to the idle worker that has been blocked longest, as Redis serves blocked
BRPOP clients in order.

A worker that keeps processes for its higher tiers (:mod:`celery_aitp.worker.reserve`)
asks the worker's own :class:`~celery_aitp.worker.reserve.Reserve` before each read, on
the simulated clock: it sees exact waits where the real worker samples them every
quarter second, and it is woken when the reserve would let go by time alone (its oldest
lowest-tier task reaches the longest wait, or no higher tier was read for that long).

Workers that name the same ``machine`` share its cores (an express worker beside a
regular one, ``--aitp-express``): each of the ``n`` runs on a machine of ``c`` cores
progresses at ``min(1, c / n)``, as the operating system time-slices processes, so its
end moves whenever a run on the machine starts or ends. The time a run loses that way
is in :attr:`Outcome.lost` (a wait, not work: the run's own length is its runtime).

Everything is plain lists, tuples and ``heapq``: no object per event. Ties are broken
by sequence numbers, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kombu.utils.scheduling import cycle_by_name, priority_cycle

from celery_aitp.worker.reserve import Reserve
from celery_aitp.worker.tier_cycle import STRATEGY, WeightedTierCycle

#: kombu's Redis priority steps: a message priority rounds down to one; lower is read first.
PRIORITY_STEPS = (0, 3, 6, 9)

#: route(task index, now) -> (queue name, message priority, tier label)
Router = Callable[[int, float], tuple[str, int, str]]
#: on_complete(task index, started_at, finished_at)
CompletionHook = Callable[[int, float, float], None]


def priority_step(priority: int) -> int:
    """The kombu Redis step a message priority lands in (clamped to 0..9)."""
    priority = min(max(int(priority), 0), 9)
    return PRIORITY_STEPS[bisect(PRIORITY_STEPS, priority) - 1]


#: How long after the reserve would let go a wake-up comes (so the wait has passed it).
WAKE_AFTER_S = 1e-6


@dataclass(frozen=True)
class KeptProcesses:
    """A simulated worker's reserve: ``kept`` processes the ``lowest`` queues may not all
    hold (``reserve`` in the policy); ``express``: an express worker reads its top tier,
    so it keeps none and only ages the lowest tier."""

    lowest: frozenset[str]
    kept: int
    max_wait_runs: float
    express: bool = False


class SimWorker:
    """One simulated worker: the queues it reads, in order, and its concurrency."""

    __slots__ = ("name", "accelerator", "queues", "slots", "strategy", "overhead_s",
                 "reserve", "machine")

    def __init__(self, name: str, accelerator: str, queues: Sequence[str], slots: int,
                 strategy: str = "priority", overhead_s: float | None = None,
                 reserve: KeptProcesses | None = None, machine: str | None = None) -> None:
        if slots < 1:
            raise ValueError(f"worker {name}: slots must be at least 1, got {slots}")
        self.name = name
        self.accelerator = accelerator
        self.queues = list(queues)
        self.slots = slots
        self.strategy = strategy
        self.overhead_s = overhead_s  # None: the engine's
        self.reserve = reserve
        #: the machine whose cores it shares with other workers (None: a core per slot)
        self.machine = machine


class Outcome:
    """What one simulation produced, per task (by trace index) and over time."""

    __slots__ = ("started", "lost", "worker", "labels", "label_names", "queues", "stranded",
                 "makespan_s")

    def __init__(self, n: int) -> None:
        self.started: list[float] = [math.nan] * n
        #: seconds each run lost to sharing its machine's cores (0 on a core of its own)
        self.lost: list[float] = [0.0] * n
        self.worker: list[int] = [-1] * n  # index of the simulated worker that ran it
        self.labels: list[int] = [0] * n  # index into label_names (tier decided)
        self.label_names: list[str] = []
        self.queues: list[str] = [""] * n
        self.stranded: list[int] = []  # routed to a queue no simulated worker reads
        self.makespan_s = 0.0

    def label_of(self, i: int) -> str:
        return self.label_names[self.labels[i]]


class _Request:
    """A run as the reserve sees a Celery request (its id and queue)."""

    __slots__ = ("id", "delivery_info")

    def __init__(self, task: int, queue: str) -> None:
        self.id = task
        self.delivery_info = {"routing_key": queue}


class _SharedRun:
    """A run on a machine's shared cores: its work left, its worker, and the sequence
    number of its current end event (earlier ones are stale)."""

    __slots__ = ("left", "worker", "seq")

    def __init__(self, left: float, worker: int) -> None:
        self.left = left
        self.worker = worker
        self.seq = 0


class _Machine:
    """Cores shared by the runs of several workers."""

    __slots__ = ("cores", "runs", "since")

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.runs: dict[int, _SharedRun] = {}  # by task
        self.since = 0.0  # when the work left was last brought up to date

    def rate(self) -> float:
        return min(1.0, self.cores / len(self.runs)) if self.runs else 1.0

    def advance(self, now: float) -> None:
        """Take the work done since the last change off every run."""
        done = (now - self.since) * self.rate()
        for run in self.runs.values():
            run.left -= done
        self.since = now


class _Run:
    """The mutable state of one simulation; methods are the event handlers."""

    def __init__(self, engine: Engine, published: Sequence[float], runtime: Sequence[float],
                 route: Router) -> None:
        self.workers = engine.workers
        self.published = published
        self.runtime = runtime
        self.route = route
        self.overheads = [engine.overhead_s if w.overhead_s is None else max(0.0, w.overhead_s)
                          for w in self.workers]
        n = len(published)
        self.out = Outcome(n)
        self.readers: dict[str, list[int]] = {}
        for w, worker in enumerate(self.workers):
            for queue in worker.queues:
                self.readers.setdefault(queue, []).append(w)
        self.deques: dict[tuple[str, int], deque[int]] = {}
        self.queue_of: dict[int, str] = {}  # id(deque) -> queue name
        self.steps: list[int] = [0]
        self.cycles = []
        for worker in self.workers:
            cycle = cycle_by_name(worker.strategy)()
            cycle.update(list(worker.queues))
            self.cycles.append(cycle)
        self.static = [type(c).rotate is priority_cycle.rotate for c in self.cycles]
        self.free = [w.slots for w in self.workers]
        self.blocked_since = [0.0] * len(self.workers)
        self.label_index: dict[str, int] = {}
        self.heap: list[tuple[float, int, int, int]] = []  # (finish, seq, worker, task)
        self.seq = 0
        self.now = 0.0
        self.running: list[dict[int, _Request]] = [{} for _ in self.workers]
        names = {w.machine for w in self.workers if w.machine is not None}
        missing = names - set(engine.cores)
        if missing:
            raise ValueError(f"machines without a core count: {', '.join(sorted(missing))}")
        machines = {name: _Machine(engine.cores[name]) for name in names}
        self.machine: list[_Machine | None] = [
            None if w.machine is None else machines[w.machine] for w in self.workers]
        self.reserves = [self._reserve(w, worker) for w, worker in enumerate(self.workers)]
        self.orders = [self._order(w) for w in range(len(self.workers))]

    def _reserve(self, w: int, worker: SimWorker) -> Reserve | None:
        plan = worker.reserve
        if plan is None:
            return None
        cycle = self.cycles[w]
        if not isinstance(cycle, WeightedTierCycle):
            raise ValueError(f"worker {worker.name}: a reserve needs the weighted tier "
                             f"order ({STRATEGY}), not {worker.strategy}")
        if not 0 < plan.kept < worker.slots:
            raise ValueError(f"worker {worker.name}: a reserve keeps 1 to {worker.slots - 1} "
                             f"of its {worker.slots} slots, not {plan.kept}")
        cycle.reserve = Reserve(plan.lowest, worker.slots, plan.kept, plan.max_wait_runs,
                                requests=self.running[w].values, clock=lambda: self.now)
        cycle.reserve.express_live = plan.express
        return cycle.reserve

    def _deque(self, queue: str, step: int) -> deque[int]:
        found = self.deques.get((queue, step))
        if found is None:
            found = self.deques[(queue, step)] = deque()
            self.queue_of[id(found)] = queue
        return found

    def _order(self, w: int) -> list[deque[int]]:
        return [self._deque(q, s) for s in self.steps for q in self._names(w)]

    def _names(self, w: int) -> list[str]:
        """The queues worker ``w`` reads next, in order, as its cycle (and the reserve the
        cycle asks) says."""
        reserve = self.reserves[w]
        if reserve is not None:  # what the worker's sampler would have found
            reserve.holds()  # whether it watches the lowest tier now
            if reserve.watching:
                reserve.sampled(*self._lowest_wait(w, reserve))
            else:
                reserve.sampled(0.0)
        cycle = self.cycles[w]
        return cycle.consume(len(cycle.items))

    def _lowest_wait(self, w: int, reserve: Reserve) -> tuple[float, int]:
        """(oldest wait, tasks waiting) of the lowest tier's queues worker ``w`` reads."""
        oldest, waiting = 0.0, 0
        for (queue, _), dq in self.deques.items():
            if dq and queue in reserve.lowest:
                waiting += len(dq)
                oldest = max(oldest, self.now - self.published[dq[0]])
        return oldest, waiting

    def _wake_when_let_go(self, w: int) -> None:
        """Wake worker ``w`` when its reserve would let a waiting lowest-tier task in by
        time alone (no other event may come before)."""
        reserve = self.reserves[w]
        if reserve is None or not self.free[w] or not reserve.holds():
            return
        oldest, waiting = self._lowest_wait(w, reserve)
        if not waiting:
            return
        at = reserve.lets_go_at(oldest) + WAKE_AFTER_S
        self.seq += 1
        heapq.heappush(self.heap, (max(at, self.now), self.seq, w, -1))

    def _label(self, label: str) -> int:
        li = self.label_index.get(label)
        if li is None:
            li = self.label_index[label] = len(self.out.label_names)
            self.out.label_names.append(label)
        return li

    def arrive(self, task: int, now: float) -> None:
        self.now = now
        queue, priority, label = self.route(task, now)
        self.out.labels[task] = self._label(label)
        self.out.queues[task] = queue
        readers = self.readers.get(queue)
        if not readers:
            self.out.stranded.append(task)
            return
        free, blocked = self.free, self.blocked_since
        w = -1
        for r in readers:
            if free[r] and (w < 0 or blocked[r] < blocked[w]) and self._reads(r, queue):
                w = r
        if w >= 0:
            self._rotated(w, queue)
            self.start(task, w, now)
            return
        step = priority_step(priority)
        if step not in self.steps:
            self.steps.append(step)
            self.steps.sort()
            self.orders = [self._order(w) for w in range(len(self.workers))]
        self._deque(queue, step).append(task)
        for r in readers:
            self._wake_when_let_go(r)

    def _reads(self, w: int, queue: str) -> bool:
        """Whether worker ``w``'s next read includes ``queue`` (its reserve may leave the
        lowest tier out)."""
        reserve = self.reserves[w]
        return reserve is None or queue not in reserve.lowest or queue in self._names(w)

    def _rotated(self, w: int, queue: str) -> None:
        if not self.static[w]:
            self.cycles[w].rotate(queue)
            self.orders[w] = self._order(w)

    def stale(self, w: int, task: int, seq: int) -> bool:
        """Whether a run's end event was moved since (its machine's load changed)."""
        machine = self.machine[w]
        if machine is None:
            return False
        run = machine.runs.get(task)
        return run is None or run.seq != seq  # ended already, or its end moved

    def _reschedule(self, machine: _Machine, now: float) -> None:
        """New end events for every run of a machine whose load just changed."""
        rate = machine.rate()
        for task, run in machine.runs.items():
            self.seq += 1
            run.seq = self.seq
            heapq.heappush(self.heap, (now + max(0.0, run.left) / rate, self.seq, run.worker,
                                       task))

    def finished(self, w: int, task: int, now: float) -> None:
        self.now = now
        machine = self.machine[w]
        if machine is not None:
            machine.advance(now)
            del machine.runs[task]
            self.out.lost[task] = max(0.0, now - self.out.started[task]
                                      - self.runtime[task] - self.overheads[w])
            self._reschedule(machine, now)
        reserve = self.reserves[w]
        if reserve is not None and self.running[w].pop(task, None) is not None:
            reserve.holds()  # times the run that ended
        self.free[w] += 1
        self.read(w, now)

    def woken(self, w: int, now: float) -> None:
        """The reserve may let go now: the worker's next poll reads again."""
        self.now = now
        if self.free[w]:
            self.read(w, now)

    def read(self, w: int, now: float) -> None:
        """Worker ``w`` has a free slot: it reads the first waiting task in its order."""
        kept = self.reserves[w] is not None
        if kept or (self.free[w] == 1 and not self.static[w]):
            self.orders[w] = self._order(w)  # no read was pending: a new BRPOP, a new order
        for dq in self.orders[w]:
            if dq:
                task = dq.popleft()
                self._rotated(w, self.queue_of[id(dq)])
                self.start(task, w, now)
                if kept and self.free[w]:
                    self.read(w, now)  # the reserve may let another slot read
                return
        if self.free[w] == 1:
            self.blocked_since[w] = now  # its BRPOP starts waiting now
        self._wake_when_let_go(w)

    def start(self, task: int, w: int, now: float) -> None:
        self.out.started[task] = now
        self.out.worker[task] = w
        reserve = self.reserves[w]
        if reserve is not None:  # its cycle's rotate tells it of the read
            self.running[w][task] = _Request(task, self.out.queues[task])
            reserve.holds()  # times the run from its start
        self.free[w] -= 1
        if self.free[w]:
            self.blocked_since[w] = now  # it issues its next BRPOP right away
        machine = self.machine[w]
        if machine is not None:
            machine.advance(now)
            machine.runs[task] = _SharedRun(self.runtime[task] + self.overheads[w], w)
            self._reschedule(machine, now)
            return
        self.seq += 1
        finish = now + self.runtime[task] + self.overheads[w]
        heapq.heappush(self.heap, (finish, self.seq, w, task))


class Engine:
    """Runs one simulation of ``published``/``runtime`` under ``route`` on ``workers``;
    ``cores``: the core count of each machine the workers name."""

    def __init__(self, workers: Sequence[SimWorker], overhead_s: float = 0.0,
                 cores: Mapping[str, float] | None = None) -> None:
        if not workers:
            raise ValueError("at least one simulated worker is needed")
        self.workers = list(workers)
        self.overhead_s = max(0.0, overhead_s)
        self.cores = dict(cores or {})

    def run(self, published: Sequence[float], runtime: Sequence[float], route: Router,
            on_complete: CompletionHook | None = None) -> Outcome:
        """Simulate every task to completion; ``published`` must be sorted."""
        state = _Run(self, published, runtime, route)
        heap, n = state.heap, len(published)
        pop, arrive, finished, stale = heapq.heappop, state.arrive, state.finished, state.stale
        started = state.out.started
        i = 0
        now = last = published[0] if n else 0.0
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= published[i]):
                now, seq, w, done = pop(heap)
                if done < 0:
                    state.woken(w, now)
                    continue
                if stale(w, done, seq):
                    continue
                if on_complete is not None:
                    on_complete(done, started[done], now)
                finished(w, done, now)
                last = now
            else:
                now = last = published[i]
                arrive(i, now)
                i += 1
        out = state.out
        out.makespan_s = last - published[0] if n else 0.0
        return out
