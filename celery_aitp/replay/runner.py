"""One replay: the trace under each policy, under plain FIFO and under the oracle.

Every run sees the same arrivals and runtimes. Tasks are grouped by the tier the first
policy gives them, in every run, so a tier's row compares the same tasks across runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.predict.history import HistorySink
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.replay.engine import Engine, KeptProcesses, Outcome, SimWorker
from celery_aitp.replay.feed import SourceFeed, StoreFactory, WorkerSide
from celery_aitp.replay.metrics import (
    TAU_S,
    RunStats,
    Target,
    cold_start_target,
    run_stats,
    short_mask,
    size_targets,
    targets,
)
from celery_aitp.replay.routers import (
    Declarations,
    FifoRouter,
    OraclePredictStage,
    PipelineRouter,
    fifo_workers,
    policy_workers,
    recorded_declarations,
    with_express,
)
from celery_aitp.replay.trace import Trace
from celery_aitp.replay.trainer import SimTrainer, TrainerSettings
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker import reserve, tier_cycle
from celery_aitp.worker.ledger import RunLedger
from celery_aitp.worker.observe import record_run

#: Slot time each run costs beyond its measured runtime (ack, result, next BRPOP), when
#: the trace cannot tell (see estimate_overhead).
DEFAULT_OVERHEAD_S = 0.002
#: A run that waited at least this long started as soon as a slot freed up.
WAITED_S = 0.05
#: Shortest publishing span (seconds) ``--load`` sizes slots from.
MIN_LOAD_SPAN_S = 1.0
#: Largest mean gap :func:`estimate_overhead` takes for a worker's overhead (seconds).
MAX_OVERHEAD_S = 1.0


class SimClock:
    """The simulated time, for stages and sources that take a ``clock`` callable."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


#: clock -> a fresh Pipeline (stages keep per-run state such as fair-share charges)
PipelineFactory = Callable[[Callable[[], float]], Pipeline]


@dataclass(frozen=True)
class PolicyUnderTest:
    """A named policy and how to build the pipeline that decides for it."""

    name: str
    policy: Policy
    build: PipelineFactory
    #: the private stores its sources read (e.g. one without a model: a cold start);
    #: None: the config's
    stores: StoreFactory | None = None
    #: 'policy', or 'cold' for the cold-start run the targets compare with FIFO only
    kind: str = "policy"


@dataclass
class SimRun:
    name: str
    kind: str  # 'policy', 'fifo' or 'oracle'
    outcome: Outcome
    stats: RunStats
    reasons: dict[str, int] = field(default_factory=dict)
    predictions: dict[str, int] = field(default_factory=dict)
    models_promoted: int = 0  # by the simulated trainer (ReplayConfig.trainer)


@dataclass
class ReplayResult:
    trace: Trace
    slots: dict[str, int]
    runs: list[SimRun]
    targets: list[Target]
    tier_order: tuple[str, ...]
    sla: dict[str, float]

    def run(self, name: str) -> SimRun:
        return next(r for r in self.runs if r.name == name)


@dataclass
class ReplayConfig:
    slots: Mapping[str, int]
    default_queue: str = "celery"
    overhead_s: float = DEFAULT_OVERHEAD_S
    #: per accelerator class, overriding ``overhead_s`` (e.g. measured by estimate_overhead)
    class_overhead_s: Mapping[str, float] = field(default_factory=dict)
    strategy: str = "policy"  # as the workers would read: the policy's tier_order
    declarations: Declarations = recorded_declarations
    store_factory: StoreFactory | None = None
    refresh_interval_s: float = 1.0
    count_from: float | None = None  # publish time before which runs are simulated, not counted
    tau_s: float = TAU_S  # runtime floor of the bounded slowdown
    #: targets on short/long tasks by true runtime (issue 17) instead of the tiers'
    size_targets: bool = False
    #: retrain the runtime model as ``celery aitp trainer`` would, in the policies' runs
    #: (not the cold start's, nor the oracle's); None: the model stays as it started
    trainer: TrainerSettings | None = None
    #: workers keep the policy's reserve for their higher tiers, as AITP workers on Redis
    #: do (worker/reserve.py); False: every process reads every tier
    reserve: bool = True
    #: processes of an express worker (``--aitp-express``) beside each class's worker in
    #: the policies' runs, sharing its cores (its slots); its reserve then stands aside
    #: (keeps no process, still ages the lowest tier), as on real workers
    express: int = 0


def _observation(router: PipelineRouter, i: int, started: float) -> dict[str, Any]:
    """The recorded run as the simulated worker records it: its measures, the new route,
    and the tenant the pipeline resolved (a real worker records the tenant of the task's
    header, never the name the caller claimed)."""
    record = dict(router.records[i])
    record.update(tenant=router.tenants[i], tier=router.tiers[i],
                  accelerator=router.accelerators[i], queue=router.queues[i], started_at=started,
                  wait_s=started - record["published_at"],
                  outcome=record.get("outcome") or "SUCCESS")
    return record


class WorkerRuns:
    """The simulated workers' side of each finished run, with the workers' own parts."""

    def __init__(self, policy: Policy, clock: Callable[[], float]) -> None:
        counters = Counters()
        self.ledger = RunLedger(policy, counters, clock)
        self.history = HistorySink(counters)

    def add(self, record: Mapping[str, Any]) -> None:
        record_run(self.ledger, self.history, record)

    def flush(self, store: RedisStore) -> None:
        self.ledger.flush(store)
        self.history.flush(store)


def _promoted(router: PipelineRouter | None) -> int:
    """Models the run's simulated trainer promoted (0 without one)."""
    if router is None:
        return 0
    return sum(part.promoted for part in router.feed.worker_side
               if isinstance(part, SimTrainer))


def kept_processes(policy: Policy, queues: Sequence[str], slots: int,
                   express: bool = False) -> KeptProcesses | None:
    """The reserve a real AITP worker reading ``queues`` with ``slots`` processes keeps
    (``express``: beside an express worker, which makes it stand aside)."""
    lowest = reserve.reserved_queues(policy, queues, slots)
    if not lowest:
        return None
    return KeptProcesses(frozenset(lowest), policy.reserve.processes,
                         policy.reserve.max_wait_runs, express)


def consumption(policy: Policy, queues: Sequence[str], requested: str) -> tuple[str, bool]:
    """(kombu strategy, follows usage): ``policy`` means as the policy's workers read."""
    if requested == "policy":
        return tier_cycle.strategy_for(policy, queues)
    if requested == tier_cycle.STRATEGY:
        tier_cycle.configure(tier_cycle.WeightPlan(policy, queues))
        return requested, True
    return requested, False


class Replay:
    """Runs the simulations of one trace and gathers their figures."""

    def __init__(self, trace: Trace, config: ReplayConfig) -> None:
        if not len(trace):
            raise ValueError("the trace has no replayable records")
        self.trace = trace
        self.config = config

    def _with_overheads(self, workers: list[SimWorker]) -> list[SimWorker]:
        for worker in workers:
            worker.overhead_s = self.config.class_overhead_s.get(worker.accelerator)
        return workers

    def _simulate(self, workers: Sequence[SimWorker], router: Any,
                  feed: SourceFeed | None = None, clock: SimClock | None = None) -> Outcome:
        cores = {w.name: w.slots for w in workers if w.machine == w.name}
        engine = Engine(workers, self.config.overhead_s, cores)
        hook = None
        if feed is not None and feed.active:
            clock = clock or SimClock()

            def hook(i: int, started: float, finished: float) -> None:
                clock.now = finished
                feed.observe(_observation(router, i, started))
                if feed.due(finished):
                    router.refresh(finished)

        outcome = engine.run(self.trace.published, self.trace.runtime, router, hook)
        if hook is not None and clock is not None:
            router.refresh(clock.now)  # ship the last runs, as a worker does at shutdown
        return outcome

    def policy_run(self, test: PolicyUnderTest, oracle: bool = False
                   ) -> tuple[Outcome, PipelineRouter]:
        cfg = self.config
        clock = SimClock(self.trace.published[0])
        pipeline = test.build(clock)
        if oracle:
            pipeline = pipeline.replace("predict", OraclePredictStage())
        workers = self._with_overheads(
            with_express(test.policy, policy_workers(test.policy, cfg.slots, cfg.default_queue),
                         cfg.express))
        strategy, follows = consumption(test.policy, [q for w in workers for q in w.queues],
                                        cfg.strategy)
        for worker in workers:
            worker.strategy = strategy
            if cfg.reserve and strategy == tier_cycle.STRATEGY:
                worker.reserve = kept_processes(test.policy, worker.queues, worker.slots,
                                                express=cfg.express > 0)
        stores = test.stores or cfg.store_factory
        worker_side: list[WorkerSide] = [WorkerRuns(test.policy, clock)]
        if cfg.trainer is not None and test.kind == "policy" and not oracle:
            worker_side.append(SimTrainer(cfg.trainer, clock))
        feed = SourceFeed(pipeline.sources(), stores, cfg.refresh_interval_s,
                          worker_side=worker_side,
                          listeners=[tier_cycle.follow_usage] if follows else [])
        router = PipelineRouter(self.trace, pipeline, test.policy, workers, cfg.default_queue,
                                cfg.declarations, oracle=oracle, feed=feed, clock=clock)
        return self._simulate(workers, router, feed, clock), router

    def run(self, tests: Sequence[PolicyUnderTest]) -> ReplayResult:
        if not tests:
            raise ValueError("at least one policy is needed")
        primary = tests[0].policy
        order = primary.tier_names
        self._short = short_mask(self._counted_runtimes())
        sla = {t.name: t.sla_s for t in primary.tiers}
        raw: list[tuple[str, str, Outcome, PipelineRouter | None]] = []
        labels: list[str] = []
        accelerators: list[str] = []
        for k, test in enumerate(tests):
            outcome, router = self.policy_run(test)
            if k == 0:
                labels, accelerators = router.tiers, router.accelerators
            raw.append((test.name, test.kind, outcome, router))
        fifo = self._simulate(self._with_overheads(fifo_workers(self.config.slots)),
                              FifoRouter(accelerators, labels))
        raw.append(("fifo", "fifo", fifo, None))
        oracle, router = self.policy_run(tests[0], oracle=True)
        raw.append(("oracle", "oracle", oracle, router))
        runs = [SimRun(name, kind, out, self._stats(name, out, labels, sla, order),
                       r.reasons if r else {}, r.predictions if r else {},
                       _promoted(r))
                for name, kind, out, r in raw]
        by_kind = {r.kind: r for r in reversed(runs)}
        fifo_stats, oracle_stats = by_kind["fifo"].stats, by_kind["oracle"].stats
        if self.config.size_targets:
            found = size_targets(fifo_stats, runs[0].stats, oracle_stats)
        else:
            found = targets(fifo_stats, runs[0].stats, oracle_stats, order)
        if "cold" in by_kind and (cold := cold_start_target(
                fifo_stats, by_kind["cold"].stats)) is not None:
            found.append(cold)
        return ReplayResult(self.trace, dict(self.config.slots), runs, found, order, sla)

    def _counted(self, i: int) -> bool:
        start = self.config.count_from
        return start is None or self.trace.published[i] >= start

    def _counted_runtimes(self) -> list[float]:
        return [r for i, r in enumerate(self.trace.runtime) if self._counted(i)]

    def _stats(self, name: str, out: Outcome, labels: Sequence[str], sla: Mapping[str, float],
               order: Sequence[str]) -> RunStats:
        published, runtime = self.trace.published, self.trace.runtime
        start = self.config.count_from
        counted = [i for i in range(len(published)) if self._counted(i)]
        short_of = dict(zip(counted, self._short, strict=True))
        done = [i for i in counted if not math.isnan(out.started[i])]
        tenants = [self.trace.records[i]["tenant"] or "(none)" for i in done]
        return run_stats(name, [out.started[i] - published[i] + out.lost[i] for i in done],
                         [runtime[i] for i in done], [labels[i] for i in done], tenants,
                         sla, order, lost=sum(1 for i in out.stranded
                                             if start is None or published[i] >= start),
                         tau_s=self.config.tau_s,
                         short=[short_of[i] for i in done] if self.config.size_targets
                         else None)


def infer_slots(trace: Trace, default_accelerator: str = "cpu") -> dict[str, int]:
    """Concurrent runs per accelerator class as recorded (the most that overlapped)."""
    events: dict[str, list[tuple[float, int]]] = {}
    for record in trace.records:
        start = record.get("started_at")
        if start is None:
            raise ValueError("the trace has no started_at: give the workers (cpu=4,gpu=1)")
        accel = record.get("accelerator") or default_accelerator
        marks = events.setdefault(accel, [])
        marks.append((start, 1))
        marks.append((start + record["runtime_s"], -1))
    slots = {}
    for accel, marks in sorted(events.items()):
        marks.sort()
        level = peak = 0
        for _t, step in marks:
            level += step
            peak = max(peak, level)
        slots[accel] = peak
    return slots


def estimate_overhead(trace: Trace, default_accelerator: str = "cpu",
                      min_samples: int = 20) -> dict[str, float]:
    """Slot time beyond the runtime, per accelerator class, as recorded.

    For each run that waited (at least ``WAITED_S``), a slot had to free up for it: the gap
    from the latest end of a run of its class before its start is the time the worker took
    to ack, fetch and start it. The mean of those gaps (the largest 5% left out: another
    slot freed it) is what the simulator adds to every run. Classes with fewer than
    ``min_samples`` such runs, or traces without ``started_at``, get no estimate; nor
    does a mean above :data:`MAX_OVERHEAD_S`: that is not a worker's ack and fetch but a
    batch system's scheduling (an imported job log: 97 to 242 s per job on KTH and LANL
    slices, which the replay then added to every run).
    """
    import bisect

    by_class: dict[str, list[dict[str, Any]]] = {}
    for record in trace.records:
        if record.get("started_at") is not None:
            by_class.setdefault(record.get("accelerator") or default_accelerator,
                                []).append(record)
    out: dict[str, float] = {}
    for accel, records in by_class.items():
        ends = sorted(r["started_at"] + r["runtime_s"] for r in records)
        gaps = []
        for r in records:
            if r["started_at"] - r["published_at"] >= WAITED_S:
                k = bisect.bisect_right(ends, r["started_at"]) - 1
                if k >= 0:
                    gaps.append(r["started_at"] - ends[k])
        if len(gaps) >= min_samples:
            gaps.sort()
            kept = gaps[: max(1, int(len(gaps) * 0.95))]
            mean = sum(kept) / len(kept)
            if mean <= MAX_OVERHEAD_S:
                out[accel] = mean
    return out


def slots_for_load(trace: Trace, load: float, default_accelerator: str = "cpu"
                   ) -> dict[str, int]:
    """Slots per accelerator class that make the trace's offered load about ``load``:
    the work of each class over the trace's span, over the load, rounded (at least 1)."""
    if not 0 < load < 1:
        raise ValueError(f"--load: must be between 0 and 1 (exclusive), got {load:g}")
    if not trace.span_s >= MIN_LOAD_SPAN_S:
        raise ValueError(f"--load: the trace's tasks are published within "
                         f"{trace.span_s:g} s, too short a time to size slots by their "
                         "rate (it gave billions); give --workers")
    span = trace.span_s
    return {accel: max(1, round(w / (span * load)))
            for accel, w in sorted(_work(trace, default_accelerator).items())}


def offered_load(trace: Trace, slots: Mapping[str, int], default_accelerator: str = "cpu"
                 ) -> dict[str, float]:
    """Work over capacity per accelerator class (the load the slots are offered)."""
    span = max(trace.span_s, 1e-9)
    work = _work(trace, default_accelerator)
    return {a: work.get(a, 0.0) / (span * n) for a, n in slots.items()}


def _work(trace: Trace, default_accelerator: str) -> dict[str, float]:
    """Seconds of runtime per accelerator class."""
    work: dict[str, float] = {}
    for record in trace.records:
        accel = record.get("accelerator") or default_accelerator
        work[accel] = work.get(accel, 0.0) + record["runtime_s"]
    return work


def parse_slots(text: str) -> dict[str, int]:
    """``cpu=4,gpu=1`` -> {'cpu': 4, 'gpu': 1}; a clear error naming the bad part."""
    slots: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"--workers: {part!r} is not CLASS=SLOTS with SLOTS >= 1 "
                             "(e.g. cpu=4,gpu=1)")
        slots[name.strip()] = int(count)
    if not slots:
        raise ValueError("--workers: no worker class given (e.g. cpu=4,gpu=1)")
    return slots
