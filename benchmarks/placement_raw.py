"""Where a placement run's time went, from the benchmark's ``--raw`` rows.

    python benchmarks/placement.py --runs fifo,cold --raw rows.jsonl ...
    python benchmarks/placement_raw.py rows.jsonl

For every (workload, run) it prints:

* **idle while waiting**: process-seconds during which fewer than ``SLOTS`` tasks ran
  while published tasks waited, and the longest such stretch (a worker-side stall shows
  as a long stretch);
* **handoff**: for a task that was already waiting when a process finished, the time
  from that finish to its start (what a process costs between two runs);
* **free arrival**: the wait of a task published while a process was free and nothing
  waited (the read path's latency with no queue in front);
* **simulated**: the run's arrivals replayed on an ideal worker with a fixed cost per
  start, in arrival order and read per tenant in turn, which shows how much of a mean
  slowdown difference the handoff cost alone explains at this load.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import heapq
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SLOTS = 4
SLOWDOWN_BOUND_S = 0.1


def idle_while_waiting(rows: list[dict[str, Any]], slots: int = SLOTS) -> tuple[float, float]:
    """(process-seconds idle while tasks waited, longest stretch in seconds)."""
    events: list[tuple[float, int, int, int]] = []
    for r in rows:
        events += [(r["published"], 0, 1, 0), (r["started"], 1, -1, 1),
                   (r["finished"], 2, 0, -1)]
    events.sort()
    waiting = running = 0
    last = events[0][0] if events else 0.0
    idle = longest = stretch = 0.0
    for at, _, d_wait, d_run in events:
        if running < slots and waiting > 0:
            idle += (at - last) * (slots - running)
            stretch += at - last
        else:
            longest, stretch = max(longest, stretch), 0.0
        waiting += d_wait
        running += d_run
        last = at
    return idle, max(longest, stretch)


def handoffs(rows: list[dict[str, Any]]) -> list[float]:
    """Finish-to-start gaps of tasks that were waiting when the latest run before their
    start finished."""
    finishes = sorted(r["finished"] for r in rows)
    gaps = []
    for r in rows:
        i = bisect.bisect_right(finishes, r["started"]) - 1
        if i >= 0 and r["published"] < finishes[i]:
            gaps.append(r["started"] - finishes[i])
    return gaps


def free_arrival_waits(rows: list[dict[str, Any]], slots: int = SLOTS) -> list[float]:
    """Waits of tasks published while a process was free and no task waited."""
    out = []
    for r in rows:
        at = r["published"]
        running = sum(1 for x in rows if x is not r and x["started"] <= at < x["finished"])
        queued = sum(1 for x in rows if x["published"] < at <= x["started"])
        if running < slots and not queued:
            out.append(r["started"] - at)
    return out


def simulate(rows: Iterable[dict[str, Any]], cost_s: float, per_tenant: bool,
             slots: int = SLOTS) -> float:
    """Mean slowdown of the rows' arrivals on ``slots`` ideal processes where every start
    costs ``cost_s``; ``per_tenant``: each tenant's queue in arrival order, the tenants
    read in turn (the AITP worker's weighted cycle with equal weights), else one FIFO."""
    items = sorted((r["published"], r["runtime_s"], r["tenant"]) for r in rows)
    queues: dict[str, collections.deque[tuple[float, float, str]]] = \
        collections.defaultdict(collections.deque)
    turn: dict[str, int] = collections.defaultdict(int)
    ends: list[float] = []
    free, i, reads, slowdowns = slots, 0, 0, []
    while i < len(items) or ends:
        if i < len(items) and (not ends or items[i][0] <= ends[0]):
            now, item = items[i][0], items[i]
            queues[item[2] if per_tenant else ""].append(item)
            i += 1
        else:
            now = heapq.heappop(ends)
            free += 1
        while free:
            ready = [q for q in queues if queues[q]]
            if not ready:
                break
            queue = min(ready, key=lambda q: (turn[q], q))
            for other in queues:  # an idle queue saves no turns
                if not queues[other]:
                    turn[other] = max(turn[other], turn[queue])
            turn[queue] += 1
            reads += 1
            at, runtime, _ = queues[queue].popleft()
            start = now + cost_s
            free -= 1
            slowdowns.append((start - at + runtime) / max(runtime, SLOWDOWN_BOUND_S))
            heapq.heappush(ends, start + runtime)
    return statistics.fmean(slowdowns) if slowdowns else float("nan")


def _quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    pick = lambda p: ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000  # noqa: E731
    return (f"p50 {pick(0.5):.1f} p95 {pick(0.95):.1f} max {ordered[-1] * 1000:.1f} "
            f"mean {statistics.fmean(ordered) * 1000:.1f} ms")


def report(path: Path, costs: list[float]) -> str:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["started"] == row["started"]:  # NaN: the task never ran
            runs[(row["workload"], row["run"])].append(row)
    lines = []
    for (workload, run), rows in runs.items():
        idle, longest = idle_while_waiting(rows)
        lines.append(f"{workload} {run}: {len(rows)} tasks; idle while waiting {idle:.2f} "
                     f"process-s, longest {longest:.2f} s")
        lines.append(f"  handoff      {_quantiles(handoffs(rows))}")
        lines.append(f"  free arrival {_quantiles(free_arrival_waits(rows))}")
        sims = ", ".join(f"{c * 1000:g} ms: FIFO {simulate(rows, c, False):.2f} / per tenant "
                         f"{simulate(rows, c, True):.2f}" for c in costs)
        lines.append(f"  simulated mean slowdown at a cost per start of {sims}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", type=Path, help="the --raw file of placement.py")
    parser.add_argument("--costs-ms", default="1,3,5",
                        help="costs per start to simulate (comma-separated ms)")
    args = parser.parse_args()
    print(report(args.raw, [float(c) / 1000 for c in args.costs_ms.split(",")]))


if __name__ == "__main__":
    main()
