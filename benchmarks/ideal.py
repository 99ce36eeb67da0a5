"""An ideal non-preemptive worker: the bound any queue order could reach on given arrivals.

``slots`` processes, no overhead, exact runtimes, and a task once started runs to its end.
Waiting tasks are served in increasing ``key``, ties by position: the publish time gives
first come first served, the true runtime shortest job first, and a prediction shortest
job first as that predictor sees it. The placement and trace-bound benchmarks compare
real orders with these.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def ideal_starts(published: Sequence[float], runtime: Sequence[float], key: Sequence[float],
                 slots: int) -> list[float]:
    """When each task starts (same positions as ``published``)."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    events: list[tuple[float, int, int]] = [(at, 0, i) for i, at in enumerate(published)]
    heapq.heapify(events)  # arrivals (0) before ends (1) at the same moment
    waiting: list[tuple[float, int]] = []
    free, started = slots, [math.nan] * len(published)
    while events:
        now, kind, index = heapq.heappop(events)
        if kind == 0:
            heapq.heappush(waiting, (key[index], index))
        else:
            free += 1
        while free and waiting:
            _, chosen = heapq.heappop(waiting)
            started[chosen] = now
            free -= 1
            heapq.heappush(events, (now + runtime[chosen], 1, chosen))
    return started
