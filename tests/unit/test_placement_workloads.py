"""The placement benchmark's workloads spread over N tenants (benchmarks/placement_workloads.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.placement_workloads import CROWD_POLICY, TENANTS, WORKLOADS, tenant_names
from celery_aitp.policy import load_policy


def test_two_tenants_is_the_workload_as_before() -> None:
    items = WORKLOADS["bimodal"].schedule(20.0, seed=1)
    assert items == WORKLOADS["bimodal"].schedule(20.0, seed=1, tenants=2)
    assert {i.tenant for i in items} == set(TENANTS)


def test_n_tenants_keep_the_arrivals_and_sizes_and_are_deterministic() -> None:
    two = WORKLOADS["bimodal"].schedule(60.0, seed=1)
    many = WORKLOADS["bimodal"].schedule(60.0, seed=1, tenants=1000)
    assert [(i.at, i.units, i.runtime_s) for i in many] == \
        [(i.at, i.units, i.runtime_s) for i in two]
    assert many == WORKLOADS["bimodal"].schedule(60.0, seed=1, tenants=1000)
    counts = Counter(i.tenant for i in many)
    assert set(counts) <= set(tenant_names(1000))
    assert len(counts) > 500  # spread, not a handful of tenants
    assert max(counts.values()) < 0.02 * len(many)


def test_a_skewed_workload_keeps_one_heavy_tenant() -> None:
    two = WORKLOADS["skewed"].schedule(60.0, seed=3)
    many = WORKLOADS["skewed"].schedule(60.0, seed=3, tenants=1000)
    heavy = tenant_names(1000)[0]
    assert [i.tenant == heavy for i in many] == [i.tenant == TENANTS[0] for i in two]
    light = Counter(i.tenant for i in many if i.tenant != heavy)
    assert max(light.values()) < 0.02 * len(many)


def test_fewer_than_two_tenants_is_refused() -> None:
    with pytest.raises(ValueError):
        WORKLOADS["bimodal"].schedule(5.0, seed=1, tenants=1)


def test_the_crowd_policy_takes_every_tenant_into_one_class() -> None:
    policy = load_policy({"stage": "takeover", **CROWD_POLICY})
    assert all(policy.queue_owner(name) == "standard" for name in tenant_names(1000))


@pytest.mark.parametrize("modes, runs", [
    (["fifo", "aitp"], ["cold", "aitp"]),  # the warm-up runs even when not reported
    (["fifo", "cold", "aitp"], ["cold", "aitp"]),
    (["cold"], ["cold"]),
    (["fifo", "oracle"], []),
    (["fifo", "express"], ["cold", "aitp", "express"]),  # the express run uses aitp's model
])
def test_the_aitp_run_always_has_its_cold_warm_up(modes, runs):
    from benchmarks.placement import learned_runs

    assert learned_runs(modes) == runs


def test_time_lost_to_a_shared_core_counts_as_waiting_not_running() -> None:
    from benchmarks.placement import figures
    from benchmarks.placement_workloads import Item

    items = [Item(i, 0.0, "acme", 20, 0.02) for i in range(4)]
    items.append(Item(4, 0.0, "acme", 500, 0.5))
    zero, ends = [0.0] * 5, [0.02] * 4 + [0.6]
    # the long task started at once but ran 0.1 s longer, slowed by a neighbour
    alone = figures("x", items, zero, zero, ends, [None] * 5)
    shared = figures("x", items, zero, zero, ends, [None] * 5, [0.0] * 4 + [0.1])
    assert alone.long_max_wait_s == 0.0
    assert shared.long_max_wait_s == pytest.approx(0.1)
    assert shared.mean_slowdown == pytest.approx((4 * 0.02 / 0.1 + 0.6 / 0.5) / 5)
    assert shared.overrun_ms == pytest.approx(0.0, abs=1e-9)
    assert alone.overrun_ms == pytest.approx(100.0 / 5)  # unexplained: a machine's stall


def test_a_task_alone_on_its_core_sleeps_and_loses_nothing() -> None:
    import fakeredis

    from benchmarks.placement_app import work

    client = fakeredis.FakeRedis()
    assert work(client, "run:running", 0.0, None) == 0.0
    assert work(client, "run:running", 0.001, 4) >= 0.0
    assert int(client.get("run:running") or 0) == 0  # every task takes itself off


def test_a_fifth_task_on_four_cores_loses_a_fifth_of_its_time() -> None:
    import fakeredis

    from benchmarks.placement_app import work

    client = fakeredis.FakeRedis()
    client.set("run:running", 4)  # four others running
    lost = work(client, "run:running", 0.02, 4)
    # rate 4/5: 0.025 s to do 0.02 s of work, 0.005 s of it lost (sleep overruns add to
    # both, so only the lower bound is exact)
    assert lost >= 0.2 * 0.025 * 0.99
    assert int(client.get("run:running")) == 4
