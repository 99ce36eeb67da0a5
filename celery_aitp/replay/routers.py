"""Where each replayed task goes: the product's real pipeline, plain FIFO, or the oracle.

:class:`PipelineRouter` builds the same :class:`~celery_aitp.core.request.Request`
the publish hook builds and runs the same :class:`~celery_aitp.publish.pipeline.Pipeline`
over a simulated :class:`~celery_aitp.core.view.View` (every queue a simulated
worker reads is live; the stage is takeover), so the replay follows whatever stages the
product has. The oracle is that pipeline with its ``predict`` stage swapped for
:class:`OraclePredictStage`, which reads the true runtime from a header.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.numbers import finite_number
from celery_aitp.policy import Policy, Stage
from celery_aitp.publish.pipeline import Pipeline
from celery_aitp.queues import parse_tier_queue, queues_of_tier, served_queues
from celery_aitp.replay.engine import SimWorker
from celery_aitp.replay.feed import SourceFeed
from celery_aitp.replay.trace import Trace

#: Header the oracle reads: the task's true runtime in seconds (benchmarks and replay only).
ORACLE_HEADER = "aitp_oracle_runtime_s"

#: declared(task name, record) -> the task's ``aitp={...}`` declaration
Declarations = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]


class OraclePredictStage:
    """A ``predict`` stage that knows the future: the runtime the task will really take.

    For measuring how much better scheduling could be with perfect predictions; never
    install it in production (any caller could set the header).
    """

    name = "predict"

    def __init__(self, header: str = ORACLE_HEADER) -> None:
        self.header = header

    def __call__(self, request: Request, decision: Decision, view: View) -> None:
        value = finite_number(request.headers.get(self.header))
        if value is not None and value >= 0:
            decision.predicted_runtime_s = value
            decision.predicted_p90_s = value
            decision.prediction_source = "oracle"


_RECORDED: dict[tuple[str, Any, Any], Mapping[str, Any]] = {}


def recorded_declarations(task: str, record: Mapping[str, Any]) -> Mapping[str, Any]:
    """Without an app the declarations are unknown: use what the record ran with.

    The same object for the same values, as an app's declaration is (stages cache on it).
    """
    key = (task, record.get("accelerator"), record.get("tier"))
    found = _RECORDED.get(key)
    if found is None:
        if len(_RECORDED) > 10_000:
            _RECORDED.clear()
        found = _RECORDED[key] = MappingProxyType(
            {k: record[k] for k in ("accelerator", "tier") if record.get(k)})
    return found


def policy_workers(policy: Policy, slots: Mapping[str, int], default_queue: str,
                   strategy: str = "priority") -> list[SimWorker]:
    """One worker per accelerator class, flagged ``--aitp-tenant '*'``: every tenant's tier
    queues highest tier first (as ``WorkerPlan.queue_names``); the default class's worker
    also reads the default queue (fallbacks)."""
    workers = []
    for accelerator, n in slots.items():
        queues = served_queues(policy.queue_owners(), policy.tenant_classes, accelerator,
                               policy.tier_names)
        if accelerator == policy.default_accelerator:
            queues.append(default_queue)
        workers.append(SimWorker(accelerator, accelerator, queues, n, strategy))
    return workers


def with_express(policy: Policy, workers: list[SimWorker], processes: int) -> list[SimWorker]:
    """``workers``, each with an express worker of ``processes`` beside it on its machine
    (its slots are the cores), reading its top-tier queues (``--aitp-express``)."""
    if processes <= 0:
        return workers
    found = []
    for worker in workers:
        worker.machine = worker.name
        queues = queues_of_tier(worker.queues, policy.tier_names[0])
        found += [worker, SimWorker(f"{worker.name}-express", worker.accelerator, queues,
                                    processes, machine=worker.name)]
    return found


def fifo_workers(slots: Mapping[str, int]) -> list[SimWorker]:
    """Plain Celery: one FIFO queue per accelerator class (hand-written ``task_routes``)."""
    return [SimWorker(a, a, [fifo_queue(a)], n, "priority") for a, n in slots.items()]


def fifo_queue(accelerator: str) -> str:
    return f"celery.{accelerator}"


class PipelineRouter:
    """Routes replayed tasks with a real Pipeline; remembers each task's tier and class."""

    def __init__(self, trace: Trace, pipeline: Pipeline, policy: Policy,
                 workers: Sequence[SimWorker], default_queue: str,
                 declarations: Declarations = recorded_declarations, oracle: bool = False,
                 feed: SourceFeed | None = None, clock: Any = None) -> None:
        self.records = trace.records
        self.runtime = trace.runtime
        self.pipeline = pipeline
        self.policy = policy
        self.default_queue = default_queue
        self.declarations = declarations
        self.oracle = oracle
        self.clock = clock  # a SimClock the pipeline's stages read, set to each decision's time
        live = frozenset(q for w in workers for q in w.queues if parse_tier_queue(q))
        self.feed = feed if feed is not None else SourceFeed(pipeline.sources())
        self._view = View(live, Stage.TAKEOVER, policy.split, True,
                          sources=self.feed.values)
        n = len(trace)
        self.tiers: list[str] = [""] * n
        self.accelerators: list[str] = [""] * n
        self.queues: list[str] = [""] * n
        self.tenants: list[str] = [""] * n  # as the header the worker reads names it
        self.reasons: dict[str, int] = {}
        self.predictions: dict[str, int] = {}  # decisions per prediction source

    def view(self, now: float) -> View:
        """The simulated snapshot, with sources refreshed on the simulated clock."""
        if self.feed.due(now):
            self.refresh(now)
        return self._view

    def refresh(self, now: float) -> None:
        """One refresh round at ``now``: ship runs, fetch sources, tell the workers."""
        self.feed.refresh(now)
        v = self._view
        self._view = View(v.live_queues, v.stage, v.split, True, v.model_version, now,
                          self.feed.values)
        self.feed.notify(self._view)

    def request(self, i: int, now: float) -> Request:
        record = self.records[i]
        task = record["task"]
        declared = self.declarations(task, record)
        headers: dict[str, Any] = {}
        if record["tenant"]:
            headers["aitp_tenant"] = record["tenant"]
        if self.oracle:
            headers[ORACLE_HEADER] = self.runtime[i]
        return Request(task, record["task_id"] or f"replay-{i}", record["args"],
                       record["kwargs"], headers, declared, None, now,
                       int(record.get("retries") or 0))

    def __call__(self, i: int, now: float) -> tuple[str, int, str]:
        if self.clock is not None:
            self.clock.now = now
        decision = self.pipeline.decide(self.request(i, now), self.view(now), now)
        self.tiers[i] = decision.tier
        self.tenants[i] = decision.tenant
        self.accelerators[i] = decision.accelerator or self.policy.default_accelerator
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        source = decision.prediction_source or "none"
        self.predictions[source] = self.predictions.get(source, 0) + 1
        queue = decision.queue if decision.routed and decision.queue else self.default_queue
        self.queues[i] = queue
        return queue, 0, decision.tier  # the middleware publishes routed tasks at priority 0


class FifoRouter:
    """Plain Celery: each task joins its accelerator class's single FIFO queue."""

    def __init__(self, accelerators: Sequence[str], tiers: Sequence[str]) -> None:
        self.accelerators = accelerators
        self.tiers = tiers

    def __call__(self, i: int, now: float) -> tuple[str, int, str]:
        return fifo_queue(self.accelerators[i]), 0, self.tiers[i]
