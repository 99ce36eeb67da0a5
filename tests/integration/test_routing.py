"""Routing, tier order, fallback and evacuation with real workers, on Redis and RabbitMQ.

On RabbitMQ the broker is the test vhost and Redis the store; tier queues are laid out
as one priority queue per tenant and accelerator (``celery_aitp.layout``), so a task's
delivery routing key is ``aitp.<tenant>.<accelerator>`` while its header names the
logical queue ``aitp.<tenant>.<accelerator>.<tier>``.
"""

from __future__ import annotations

import time

import pytest

from tests.support.live import wait_live

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("broker", [pytest.param("redis", marks=pytest.mark.redis),
                                       pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]),
]


def delivered_from(broker: str, logical: str) -> str:
    """The broker queue a task routed to ``logical`` is delivered from."""
    return logical if broker == "redis" else logical.rsplit(".", 1)[0]


def test_tenant_tasks_reach_the_aitp_worker_and_others_fall_back(proj, start_worker, broker):
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-accelerator", "cpu",
                 "--aitp-no-default-queue")
    start_worker("plain")
    wait_live(proj, "aitp.acme.cpu.hi")

    routed = proj.where.apply_async((1,), headers={"aitp_tenant": "acme"}).get(timeout=20)
    urgent = proj.where_hi.apply_async((1,), headers={"aitp_tenant": "acme"}).get(timeout=20)
    other = proj.where.apply_async((2,), headers={"aitp_tenant": "globex"}).get(timeout=20)
    gpu = proj.gpu.apply_async((3,), headers={"aitp_tenant": "acme"}).get(timeout=20)

    assert routed["queue"] == delivered_from(broker, "aitp.acme.cpu.lo")
    assert routed["hostname"].startswith("acme-")
    assert routed["aitp"]["routed"] is True and routed["aitp"]["tenant"] == "acme"
    assert routed["aitp"]["queue"] == "aitp.acme.cpu.lo"  # logical name in the header
    assert urgent["queue"] == delivered_from(broker, "aitp.acme.cpu.hi")
    if broker == "rabbitmq":  # the tier is the message priority, highest tier highest
        assert urgent["priority"] > routed["priority"]
    assert other["queue"] == proj.app.conf.task_default_queue
    assert other["aitp"]["reason"] == "no_live_worker"
    assert other["hostname"].startswith("plain-")
    assert gpu["x"] == 3  # no gpu worker: ran on the plain worker


def test_high_tier_runs_before_a_low_tier_backlog(proj, start_worker, broker):
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    wait_live(proj, "aitp.acme.cpu.hi")
    headers = {"aitp_tenant": "acme"}
    first = proj.lo.apply_async((0, 0.5), headers=headers)  # occupies the single process
    time.sleep(0.2)
    backlog = [proj.lo.apply_async((i, 0.05), headers=headers) for i in range(1, 8)]
    urgent = proj.hi.apply_async((99,), headers=headers)
    finished_urgent = urgent.get(timeout=30)["at"]
    finished_backlog = [r.get(timeout=30)["at"] for r in backlog]
    first.get(timeout=30)
    assert all(finished_urgent < t for t in finished_backlog)


def test_killed_worker_queue_is_evacuated_to_the_plain_worker(proj, start_worker, broker):
    aitp_worker = start_worker("acme", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    wait_live(proj, "aitp.acme.cpu.lo")
    headers = {"aitp_tenant": "acme"}
    blocker = proj.lo.apply_async((0, 3.0), headers=headers)
    time.sleep(0.5)
    queued = [proj.lo.apply_async((i,), headers=headers) for i in range(1, 11)]
    queued += [proj.hi.apply_async((i,), headers=headers) for i in range(11, 14)]
    aitp_worker.kill()
    start_worker("plain")
    later = [proj.where.apply_async((i,), headers=headers) for i in range(20, 25)]
    results = [r.get(timeout=60) for r in queued]
    assert sorted(r["x"] for r in results) == list(range(1, 14))
    assert all(r.get(timeout=30)["queue"] == proj.app.conf.task_default_queue for r in later)
    if broker == "rabbitmq":  # the broker requeued the unacknowledged run at once
        assert blocker.get(timeout=30)["x"] == 0


def test_celery_aitp_evacuate_drains_an_orphaned_tier_queue(proj, start_worker, broker):
    """``celery -A proj aitp evacuate``: tasks routed to a worker that vanished run on a plain
    worker, once each."""
    import os
    import subprocess
    import sys

    from tests.support.workers import ROOT

    store = proj.app.aitp.store
    store.advertise("ghost@test", ["aitp.acme.cpu.lo", "aitp.acme.cpu.hi"], {}, ttl_s=60)
    proj.app.aitp.live.refresh()
    headers = {"aitp_tenant": "acme"}
    queued = [proj.where.apply_async((i,), headers=headers) for i in range(6)]
    queued.append(proj.where_hi.apply_async((6,), headers=headers))
    store.withdraw("ghost@test")  # its advertisement is gone: the queue is orphaned
    evacuate = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.proj", "aitp", "evacuate"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT), capture_output=True,
        text=True, timeout=60)
    assert evacuate.returncode == 0, evacuate.stderr
    assert f"moved 7 message(s) to {proj.app.conf.task_default_queue}" in evacuate.stdout
    start_worker("plain")
    results = [r.get(timeout=30) for r in queued]
    assert sorted(r["x"] for r in results) == list(range(7))
    assert all(r["queue"] == proj.app.conf.task_default_queue for r in results)
    assert all(r["aitp"]["routed"] is True for r in results)  # they had been routed
