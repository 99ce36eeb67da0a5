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
])
def test_the_aitp_run_always_has_its_cold_warm_up(modes, runs):
    from benchmarks.placement import learned_runs

    assert learned_runs(modes) == runs
