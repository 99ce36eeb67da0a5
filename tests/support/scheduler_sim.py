"""A deterministic scheduling simulation on a virtual clock, with the real parts.

Producers publish through the real pipeline stages (tenant, profile, priority, route,
gate) with the real background sources (profiles, fair-share usage) fetched every
``refresh_s`` of virtual time from a fakeredis store; workers read their queues with
the real :class:`WeightedTierCycle` (as kombu's BRPOP would: the first non-empty queue
in the strategy's order; demoted tenants' queues read one tier lower, as the worker's
live view makes them), and every finished run goes through the real
:class:`RunLedger` into the store. Only time is simulated, so results do not depend on
the machine's load.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.policy import Policy, Stage
from celery_aitp.publish.gate_stage import GateStage
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.publish.priority_stage import PriorityStage
from celery_aitp.publish.profile_stage import ProfileStage
from celery_aitp.publish.route_stage import RouteStage
from celery_aitp.publish.tenant_stage import TenantStage
from celery_aitp.queues import served_queues
from celery_aitp.store import RedisStore
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker import tier_cycle
from celery_aitp.worker.ledger import RunLedger
from celery_aitp.worker.tier_cycle import WeightedTierCycle, WeightPlan

DEFAULT_QUEUE = "celery"


@dataclass
class Job:
    """One published task."""

    task: str
    tenant: str
    runtime_s: float
    declared: dict[str, Any]
    published_at: float
    id: str = ""
    queue: str = ""
    tier: str = ""
    accelerator: str = ""
    started_at: float | None = None
    worker: str = ""
    ahead: int = 0  # messages ahead of it in its queue when it arrived


@dataclass
class SimWorker:
    """A worker: the tier queues it serves (tier order) and its pool processes."""

    name: str
    tenants: list[str]
    accelerator: str
    processes: int = 1
    default_queue: bool = False
    #: what the accelerator probe says a job used: a class, 'none', or None (cannot tell)
    probe: Callable[[Job], str | None] = lambda job: None
    busy: int = 0
    cycle: WeightedTierCycle = field(default_factory=WeightedTierCycle)
    queues: list[str] = field(default_factory=list)


class _OraclePredict:
    """A ``predict`` stage that knows the true runtime (or nothing, with ``None``)."""

    name = "predict"

    def __init__(self, runtimes: dict[str, float]) -> None:
        self.runtimes = runtimes

    def __call__(self, request: Request, decision: Any, view: View) -> None:
        runtime = self.runtimes.get(request.task_id)
        decision.predicted_runtime_s = decision.predicted_p90_s = runtime


class Simulation:
    """Publish jobs at given times, run them on simulated workers, record what happened."""

    def __init__(self, policy: Policy, store: RedisStore, workers: list[SimWorker],
                 refresh_s: float = 1.0, profile_refresh_s: float = 5.0,
                 predict: bool = True, follow_usage: bool = True) -> None:
        self.policy = policy
        self.follow_usage = follow_usage
        self.store = store
        self.now = 0.0
        clock = self._clock
        self.profile_stage = ProfileStage(policy, profile_refresh_s, clock)
        self.priority_stage = PriorityStage(policy, clock)
        self.runtimes: dict[str, float] = {}
        stages: dict[str, Any] = {
            "tenant": TenantStage(policy), "profile": self.profile_stage,
            "priority": self.priority_stage, "route": RouteStage(), "gate": GateStage(),
        }
        if predict:
            stages["predict"] = _OraclePredict(self.runtimes)
        self.pipeline = Pipeline(stages)
        self.sources = [self.profile_stage.source, *self.priority_stage.sources]
        self.values: dict[str, Any] = {s.name: s.initial for s in self.sources}
        self.ledger = RunLedger(policy, Counters(), clock)
        self.refresh_s = refresh_s
        self.workers = workers
        self.queues: dict[str, deque[Job]] = {DEFAULT_QUEUE: deque()}
        live: set[str] = set()
        for w in workers:
            w.queues = served_queues(w.tenants, policy.tenant_classes, w.accelerator,
                                     policy.tier_names)
            live.update(w.queues)
            if w.default_queue:
                w.queues.append(DEFAULT_QUEUE)
            for q in w.queues:
                self.queues.setdefault(q, deque())
        plan = WeightPlan(policy, [q for w in workers for q in w.queues])
        tier_cycle.configure(plan)
        self.plan = plan  # groups and weights: what the documented bound is of
        self.weights = plan.weights
        for w in workers:
            w.cycle = WeightedTierCycle(w.queues)
        self.live = frozenset(live)
        self.done: list[Job] = []
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self._next_refresh = 0.0

    def _clock(self) -> float:
        return self.now

    # --- scheduling events ------------------------------------------------------------

    def publish_at(self, at: float, task: str, tenant: str, runtime_s: float,
                   declared: dict[str, Any] | None = None) -> None:
        job = Job(task, tenant, runtime_s, declared or {}, at)
        heapq.heappush(self.events, (at, next(self._seq), "publish", job))

    def run(self, until: float | None = None) -> list[Job]:
        """Process events until none are left (or ``until``); returns finished jobs."""
        while self.events:
            at, _, kind, payload = self.events[0]
            if until is not None and at > until:
                break
            self._refresh_until(at)
            heapq.heappop(self.events)
            self.now = at
            if kind == "publish":
                self._publish(payload)
            else:
                self._finish(*payload)
            self._dispatch()
        return self.done

    def _refresh_until(self, at: float) -> None:
        while self._next_refresh <= at:
            self.now = self._next_refresh
            self.ledger.flush(self.store)
            for source in self.sources:
                self.values[source.name] = source.fetch(self.store, self.values[source.name])
            if self.follow_usage:
                tier_cycle.follow_usage(self._view())  # what the worker's live view does
            self._next_refresh += self.refresh_s

    def _view(self) -> View:
        return View(self.live, Stage.TAKEOVER, self.policy.split, True,
                    sources=MappingProxyType(dict(self.values)))

    def _publish(self, job: Job) -> None:
        job.id = f"job-{next(self._ids)}"
        self.runtimes[job.id] = job.runtime_s
        request = Request(job.task, job.id, (), {}, {"aitp_tenant": job.tenant}, job.declared,
                          None, self.now, 0)
        decision = self.pipeline.decide(request, self._view(), self.now)
        job.tier, job.accelerator = decision.tier, decision.accelerator
        job.queue = decision.queue if decision.routed and decision.queue else DEFAULT_QUEUE
        queue = self.queues.setdefault(job.queue, deque())
        job.ahead = len(queue)
        queue.append(job)

    def _dispatch(self) -> None:
        for worker in self.workers:
            while worker.busy < worker.processes:
                job = self._read(worker)
                if job is None:
                    break
                worker.busy += 1
                job.started_at, job.worker = self.now, worker.name
                heapq.heappush(self.events, (self.now + job.runtime_s, next(self._seq),
                                             "finish", (worker, job)))

    def _read(self, worker: SimWorker) -> Job | None:
        """One BRPOP: the first non-empty queue in the strategy's order."""
        for name in worker.cycle.consume(len(worker.queues)):
            if self.queues[name]:
                worker.cycle.rotate(name)
                return self.queues[name].popleft()
        return None

    def _finish(self, worker: SimWorker, job: Job) -> None:
        worker.busy -= 1
        self.done.append(job)
        self.ledger.add({"task": job.task, "tenant": job.tenant, "runtime_s": job.runtime_s,
                         "cpu_s": job.runtime_s * 0.9, "used_accelerator": worker.probe(job)})


def waits_within_bound(sim: Simulation, done: list[Job], jobs: list[Job],
                       processes: int) -> list[float]:
    """Assert each of ``jobs`` started within the weighted tier order's documented bound
    (``tier_cycle.longest_wait_s``, with the longest runtime of ``done``); their waits."""
    max_runtime = max(j.runtime_s for j in done)
    waits = []
    for job in jobs:
        bound = tier_cycle.longest_wait_s(sim.plan, job.queue, job.ahead, processes,
                                          max_runtime)
        waits.append(job.started_at - job.published_at)
        assert waits[-1] <= bound, (job, bound)
    return waits
