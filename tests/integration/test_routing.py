"""Routing, tier order, fallback and evacuation with real workers on real Redis."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def wait_live(proj, queue: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if queue in proj.app.aitp.store.live_queues():
            proj.app.aitp.live.refresh()
            return
        time.sleep(0.1)
    raise AssertionError(f"{queue} never advertised")


def test_tenant_tasks_reach_the_aitp_worker_and_others_fall_back(proj, start_worker):
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-accelerator", "cpu",
                 "--aitp-no-default-queue")
    start_worker("plain")
    wait_live(proj, "aitp.acme.cpu.hi")

    routed = proj.where.apply_async((1,), headers={"aitp_tenant": "acme"}).get(timeout=20)
    other = proj.where.apply_async((2,), headers={"aitp_tenant": "globex"}).get(timeout=20)
    gpu = proj.gpu.apply_async((3,), headers={"aitp_tenant": "acme"}).get(timeout=20)

    assert routed["queue"] == "aitp.acme.cpu.lo"
    assert routed["aitp"]["routed"] is True and routed["aitp"]["tenant"] == "acme"
    assert other["queue"] == proj.app.conf.task_default_queue
    assert other["aitp"]["reason"] == "no_live_worker"
    assert gpu["x"] == 3  # no gpu worker: ran on the plain worker


def test_high_tier_runs_before_a_low_tier_backlog(proj, start_worker):
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


def test_killed_worker_queue_is_evacuated_to_the_plain_worker(proj, start_worker):
    aitp_worker = start_worker("acme", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    wait_live(proj, "aitp.acme.cpu.lo")
    headers = {"aitp_tenant": "acme"}
    blocker = proj.lo.apply_async((0, 3.0), headers=headers)
    time.sleep(0.5)
    queued = [proj.lo.apply_async((i,), headers=headers) for i in range(1, 11)]
    aitp_worker.kill()
    start_worker("plain")
    later = [proj.where.apply_async((i,), headers=headers) for i in range(20, 25)]
    results = [r.get(timeout=60) for r in queued]
    assert sorted(r["x"] for r in results) == list(range(1, 11))
    assert all(r.get(timeout=30)["queue"] == proj.app.conf.task_default_queue for r in later)
    del blocker  # killed mid-run without acks_late redelivery on Redis before the timeout
