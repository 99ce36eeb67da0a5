"""Cost of the gate stage (migration stages) and of the whole decision, per stage.

    python benchmarks/gate_stage.py

Prints p50/p99 nanoseconds per call for the gate alone in coexistence, split (plain
percentage, and with every selector), takeover, the split decided the naive way (glob
matching each pattern on every publish, for comparison), and the full in-process
decision (all pipeline stages) per stage. Each sample is the mean of a batch of calls,
so timer overhead is amortised; "net" subtracts the harness (loop, resetting the
decision the gate changes).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from fnmatch import fnmatchcase

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.publish.gate_stage import GateStage
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.split import split_bucket

POLICY = parse_policy({
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi"}, "globex": {}, "default": {}},
})
LIVE = frozenset({"aitp.acme.cpu.hi", "aitp.acme.cpu.lo", "aitp.default.cpu.lo"})
SELECTORS = SplitSettings(percent=30, tenants=("acme", "globex"),
                          tasks=("billing.*", "reports.*", "proj.*"), tiers=("hi", "lo"),
                          max_uncertainty=2.0)
BATCH, SAMPLES = 200, 1500


def measure(call: Callable[[int], object], n_inputs: int) -> tuple[float, float]:
    """p50 and p99 of per-call nanoseconds over SAMPLES batches of BATCH calls."""
    per_call = []
    for s in range(SAMPLES):
        base = (s * BATCH) % n_inputs
        start = time.perf_counter_ns()
        for i in range(base, base + BATCH):
            call(i % n_inputs)
        per_call.append((time.perf_counter_ns() - start) / BATCH)
    per_call.sort()
    return statistics.median(per_call), per_call[int(len(per_call) * 0.99)]


def naive_split(split: SplitSettings, request: Request, decision: Decision) -> bool:
    """The split decided without a compiled rule: one fnmatch per pattern per publish."""
    if split.tenants and decision.tenant not in split.tenants:
        return False
    if split.tiers and decision.tier not in split.tiers:
        return False
    if split.tasks and not any(fnmatchcase(request.task, p) for p in split.tasks):
        return False
    return split_bucket(request.task_id) < split.percent


def main() -> None:
    ids = [str(uuid.uuid4()) for _ in range(4096)]
    requests = [Request("proj.score", i, headers={"aitp_tenant": "acme"},
                        declared={"tier": "hi"}) for i in ids]
    views = {
        "coexistence": View(LIVE, Stage.COEXISTENCE, SplitSettings(), True),
        "split 30%": View(LIVE, Stage.SPLIT, SplitSettings(percent=30), True),
        "split 30% + selectors": View(LIVE, Stage.SPLIT, SELECTORS, True),
        "takeover": View(LIVE, Stage.TAKEOVER, SplitSettings(), True),
    }
    pipeline = Pipeline(default_stages(POLICY))
    decided = []
    for r in requests:
        d = pipeline.decide(r, views["takeover"], 0.0)
        d.predicted_runtime_s, d.predicted_p90_s = 1.0, 1.5
        decided.append(d)
    def harness(i: int) -> None:
        d = decided[i]
        d.routed, d.reason = True, "routed"

    base, _ = measure(harness, len(ids))
    print(f"{'what':45} {'p50 ns':>8} {'p99 ns':>8} {'p50 net':>8}")
    print(f"{'(harness: the loop and resetting a decision)':45} {base:8.0f}")
    for name, view in views.items():
        gate = GateStage()

        def call(i: int, gate: GateStage = gate, view: View = view) -> None:
            d = decided[i]
            d.routed, d.reason = True, "routed"
            gate(requests[i], d, view)

        p50, p99 = measure(call, len(ids))
        print(f"{'gate, ' + name:45} {p50:8.0f} {p99:8.0f} {p50 - base:8.0f}")
    p50, p99 = measure(lambda i: naive_split(SELECTORS, requests[i], decided[i]), len(ids))
    print(f"{'naive split + selectors (fnmatch per call)':45} {p50:8.0f} {p99:8.0f}")
    print("(p99 includes scheduler noise: other processes share the cores)")
    for name, view in views.items():
        p50, p99 = measure(lambda i, view=view: pipeline.decide(requests[i], view, 0.0),
                           len(ids))
        print(f"{'whole decision, ' + name:45} {p50:8.0f} {p99:8.0f}")


if __name__ == "__main__":
    main()
