"""Spill with real worker processes on real Redis (and RabbitMQ): a saturated hi tier
sends tasks to an idle standard worker, every task runs once, and routing resumes once
the backlog is gone.

The test judges where tasks ran and what the decisions say, never how long they took.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from celery_aitp.scheduling.spill import NO_CAPACITY, SPILL_SOURCE
from tests.conftest import TEST_POLICY
from tests.support.live import wait_for, wait_live

pytestmark = [pytest.mark.redis, pytest.mark.slow]

HI = "aitp.acme.cpu.hi"
POLICY: dict[str, Any] = {**TEST_POLICY, "spill": {"max_fraction": 1.0,
                                                   "report_interval_s": 0.2}}


def capacity(proj: Any) -> Any:
    return proj.app.aitp.live.current().sources.get(SPILL_SOURCE, NO_CAPACITY)

#: Tasks published before the backlog is seen: enough to keep it for seconds.
FIRST = 12


def delivered_from(broker: str, logical: str) -> str:
    """The broker queue a task routed to ``logical`` is delivered from."""
    return logical if broker == "redis" else logical.rsplit(".", 1)[0]


@pytest.mark.parametrize("broker", [pytest.param("redis", marks=pytest.mark.redis),
                                    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_a_saturated_hi_tier_spills_to_an_idle_standard_worker(deployment, request, broker):
    values = {"AITP_TEST_POLICY": json.dumps(POLICY)}
    deployment.update(values)
    os.environ.update(values)
    proj = request.getfixturevalue("proj")
    start_worker = request.getfixturevalue("start_worker")
    start_worker("tier", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    start_worker("std", concurrency=2)  # a plain Celery worker on the default queue
    wait_live(proj, HI)
    default_queue = proj.app.conf.task_default_queue
    headers = {"aitp_tenant": "acme"}
    # 0.4 s each on one process: twelve waiting are 4.8 s of wait, past hi's 1 s SLA (and
    # long enough for the workers' reports and the producer's refresh to see it, under load)
    first = [proj.busy_hi.apply_async((i,), headers=headers) for i in range(FIRST)]
    found = wait_for(lambda: HI in capacity(proj).backlog and capacity(proj), 15,
                     "the producer to see the hi queue saturated")
    assert found.spill_class == "cpu" and found.idle_slots >= 1
    later = [proj.busy_hi.apply_async((100 + i,), headers=headers) for i in range(6)]
    runs = [r.get(timeout=60) for r in first + later]
    assert sorted(r["x"] for r in runs) == [*range(FIRST), *range(100, 106)]  # none lost
    assert {r["queue"] for r in runs[:FIRST]} == {delivered_from(broker, HI)}  # routed
    spilled = [r for r in runs[FIRST:] if r["queue"] == default_queue]
    assert spilled, [r["queue"] for r in runs[FIRST:]]
    assert all(r["hostname"].startswith("std-") for r in spilled)
    assert all(r["aitp"]["reason"] == "spill" and r["aitp"]["tier"] == "hi" for r in spilled)
    proj.app.aitp.live.flush()
    record = proj.app.aitp.decision_log.find(later[runs[FIRST:].index(spilled[0])].id)
    assert record is not None and record["reason"] == "spill"
    assert record["tier_steps"]["spill"]["expected_wait_s"] > record["tier_steps"]["spill"][
        "sla_s"]
    counts = proj.app.aitp.store.counts()
    assert counts.get("decisions:takeover:acme:hi:cpu:spill", 0) == len(spilled)
    # the backlog is gone: the queue stops spilling and tasks are routed again
    wait_for(lambda: capacity(proj) is NO_CAPACITY or not capacity(proj).backlog, 15,
             "the hi queue to stop spilling")
    again = proj.busy_hi.apply_async((200, 0.0), headers=headers).get(timeout=30)
    assert again["queue"] == delivered_from(broker, HI)


def test_a_saturated_cpu_tier_spills_to_an_idle_gpu_queue_it_may_run_on(deployment, request):
    policy = {**POLICY, "spill": {**POLICY["spill"], "alternatives": {"cpu": ["gpu"]}}}
    values = {"AITP_TEST_POLICY": json.dumps(policy)}
    deployment.update(values)
    os.environ.update(values)
    proj = request.getfixturevalue("proj")
    start_worker = request.getfixturevalue("start_worker")
    start_worker("cpu", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    start_worker("gpu", "--aitp-tenant", "acme", "--aitp-accelerator", "gpu",
                 "--aitp-no-default-queue")  # no standard worker at all
    gpu_hi = "aitp.acme.gpu.hi"
    wait_live(proj, HI)
    wait_live(proj, gpu_hi)
    headers = {"aitp_tenant": "acme"}
    first = [proj.busy_hi.apply_async((i,), headers=headers) for i in range(FIRST)]
    found = wait_for(lambda: HI in capacity(proj).backlog and capacity(proj), 15,
                     "the producer to see the cpu hi queue saturated")
    assert found.spill_class is None and gpu_hi in found.open_queues
    later = [proj.busy_hi.apply_async((100 + i,), headers=headers) for i in range(6)]
    runs = [r.get(timeout=60) for r in first + later]
    assert sorted(r["x"] for r in runs) == [*range(FIRST), *range(100, 106)]  # none lost
    moved = [r for r in runs[FIRST:] if r["queue"] == gpu_hi]
    assert moved, [r["queue"] for r in runs[FIRST:]]
    assert all(r["hostname"].startswith("gpu-") and r["aitp"]["reason"] == "spill_class"
               and r["aitp"]["accelerator"] == "cpu" for r in moved)  # placed as cpu
    assert {r["queue"] for r in runs} <= {HI, gpu_hi}  # no default queue: nobody reads it
