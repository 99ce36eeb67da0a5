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

Everything is plain lists, tuples and ``heapq``: no object per event. Ties are broken
by sequence numbers, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect
from collections import deque
from collections.abc import Callable, Sequence

from kombu.utils.scheduling import cycle_by_name, priority_cycle

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


class SimWorker:
    """One simulated worker: the queues it reads, in order, and its concurrency."""

    __slots__ = ("name", "accelerator", "queues", "slots", "strategy", "overhead_s")

    def __init__(self, name: str, accelerator: str, queues: Sequence[str], slots: int,
                 strategy: str = "priority", overhead_s: float | None = None) -> None:
        if slots < 1:
            raise ValueError(f"worker {name}: slots must be at least 1, got {slots}")
        self.name = name
        self.accelerator = accelerator
        self.queues = list(queues)
        self.slots = slots
        self.strategy = strategy
        self.overhead_s = overhead_s  # None: the engine's


class Outcome:
    """What one simulation produced, per task (by trace index) and over time."""

    __slots__ = ("started", "worker", "labels", "label_names", "queues", "stranded",
                 "makespan_s")

    def __init__(self, n: int) -> None:
        self.started: list[float] = [math.nan] * n
        self.worker: list[int] = [-1] * n  # index of the simulated worker that ran it
        self.labels: list[int] = [0] * n  # index into label_names (tier decided)
        self.label_names: list[str] = []
        self.queues: list[str] = [""] * n
        self.stranded: list[int] = []  # routed to a queue no simulated worker reads
        self.makespan_s = 0.0

    def label_of(self, i: int) -> str:
        return self.label_names[self.labels[i]]


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
        self.orders = [self._order(w) for w in range(len(self.workers))]
        self.free = [w.slots for w in self.workers]
        self.blocked_since = [0.0] * len(self.workers)
        self.label_index: dict[str, int] = {}
        self.heap: list[tuple[float, int, int, int]] = []  # (finish, seq, worker, task)
        self.seq = 0

    def _deque(self, queue: str, step: int) -> deque[int]:
        found = self.deques.get((queue, step))
        if found is None:
            found = self.deques[(queue, step)] = deque()
            self.queue_of[id(found)] = queue
        return found

    def _order(self, w: int) -> list[deque[int]]:
        cycle = self.cycles[w]
        names = cycle.consume(len(cycle.items))
        return [self._deque(q, s) for s in self.steps for q in names]

    def _label(self, label: str) -> int:
        li = self.label_index.get(label)
        if li is None:
            li = self.label_index[label] = len(self.out.label_names)
            self.out.label_names.append(label)
        return li

    def arrive(self, task: int, now: float) -> None:
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
            if free[r] and (w < 0 or blocked[r] < blocked[w]):
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

    def _rotated(self, w: int, queue: str) -> None:
        if not self.static[w]:
            self.cycles[w].rotate(queue)
            self.orders[w] = self._order(w)

    def slot_freed(self, w: int, now: float) -> None:
        self.free[w] += 1
        if self.free[w] == 1 and not self.static[w]:
            self.orders[w] = self._order(w)  # no read was pending: a new BRPOP, a new order
        for dq in self.orders[w]:
            if dq:
                task = dq.popleft()
                self._rotated(w, self.queue_of[id(dq)])
                self.start(task, w, now)
                return
        if self.free[w] == 1:
            self.blocked_since[w] = now  # its BRPOP starts waiting now

    def start(self, task: int, w: int, now: float) -> None:
        self.out.started[task] = now
        self.out.worker[task] = w
        self.free[w] -= 1
        if self.free[w]:
            self.blocked_since[w] = now  # it issues its next BRPOP right away
        self.seq += 1
        finish = now + self.runtime[task] + self.overheads[w]
        heapq.heappush(self.heap, (finish, self.seq, w, task))


class Engine:
    """Runs one simulation of ``published``/``runtime`` under ``route`` on ``workers``."""

    def __init__(self, workers: Sequence[SimWorker], overhead_s: float = 0.0) -> None:
        if not workers:
            raise ValueError("at least one simulated worker is needed")
        self.workers = list(workers)
        self.overhead_s = max(0.0, overhead_s)

    def run(self, published: Sequence[float], runtime: Sequence[float], route: Router,
            on_complete: CompletionHook | None = None) -> Outcome:
        """Simulate every task to completion; ``published`` must be sorted."""
        state = _Run(self, published, runtime, route)
        heap, n = state.heap, len(published)
        pop, arrive, freed = heapq.heappop, state.arrive, state.slot_freed
        started = state.out.started
        i = 0
        now = published[0] if n else 0.0
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= published[i]):
                now, _, w, done = pop(heap)
                if on_complete is not None:
                    on_complete(done, started[done], now)
                freed(w, now)
            else:
                now = published[i]
                arrive(i, now)
                i += 1
        out = state.out
        out.makespan_s = now - published[0] if n else 0.0
        return out
