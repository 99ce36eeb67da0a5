"""Fair share: decaying usage in the store, who is demoted, and the fairness metrics."""

from __future__ import annotations

import pytest

from celery_aitp.errors import StoreError
from celery_aitp.fairness import jain_index, max_min_fair, served_fairness, tier_entropy
from celery_aitp.policy import parse_policy
from celery_aitp.scheduling.usage import UsageSource, demoted_tenants, read_usage
from celery_aitp.store import Keys, RedisStore, connect
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker.ledger import RunLedger

POLICY = parse_policy({
    "tenants": {"a": {}, "b": {}, "c": {"weight": 2}, "default": {}},
    "fair_share": {"half_life_s": 60, "tolerance": 0.1},
})


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all():
    assert jain_index([3, 3, 3]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([]) is None and jain_index([0, 0]) is None


def test_max_min_fair_gives_small_demands_in_full_and_splits_the_rest_by_weight():
    alloc = max_min_fair({"quiet": 1, "flood": 100, "big": 100}, 21, {"big": 2})
    assert alloc["quiet"] == pytest.approx(1)
    assert alloc["flood"] == pytest.approx(20 / 3) and alloc["big"] == pytest.approx(40 / 3)
    assert max_min_fair({"a": 1, "b": 2}, 100) == {"a": 1.0, "b": 2.0}


def test_served_fairness_is_high_when_the_quiet_tenant_got_what_it_asked():
    # quiet asked 10 and got 10; the flood asked 1000 and got the other 90 of capacity 100
    assert served_fairness({"quiet": 10, "flood": 90}, {"quiet": 10, "flood": 1000}) == \
        pytest.approx(1.0)
    # raw Jain over served work would call that unfair
    assert jain_index([10, 90]) < 0.7
    # the quiet tenant starved: it got 2 of the 10 it asked
    starved = served_fairness({"quiet": 2, "flood": 98}, {"quiet": 10, "flood": 1000})
    assert starved < 0.7


def test_tier_entropy_is_zero_for_one_tier_and_one_for_even_use():
    assert tier_entropy({"hi": 5}, ["hi", "mid", "lo"]) == 0
    assert tier_entropy({"hi": 5, "mid": 5, "lo": 5}, ["hi", "mid", "lo"]) == pytest.approx(1)
    assert tier_entropy({}, ["hi", "lo"]) is None


def test_only_active_tenants_above_their_weighted_share_are_demoted():
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    over, fair = demoted_tenants({"a": 90, "b": 10}, weights, 0.1, 0.01)
    assert over == {"a"} and fair == {"a": 0.5, "b": 0.5}
    alone, _ = demoted_tenants({"a": 90}, weights, 0.1, 0.01)
    assert alone == frozenset()  # the only active tenant is at its share, whatever it uses
    weighted, _ = demoted_tenants({"a": 35, "c": 65}, weights, 0.1, 0.01)
    assert weighted == frozenset()  # c's share is 2/3
    tiny, _ = demoted_tenants({"a": 999.5, "b": 0.5}, weights, 0.1, 0.01)
    assert tiny == frozenset()  # b is below min_active_share: a counts as alone


def test_among_a_thousand_small_tenants_only_one_above_min_active_share_is_demoted():
    # 999 customers sent one short task (0.03 s), 100 of them also a long one (1 s):
    # several times their 0.1% share, but each far below min_active_share (1%)
    usage = {f"t{i}": 0.03 + (1.0 if i < 100 else 0.0) for i in range(999)}
    usage["big"] = 60.0  # a large customer: about 40% of all usage
    weights = dict.fromkeys(usage, 1.0)
    over, fair = demoted_tenants(usage, weights, 0.5, 0.01)
    assert over == {"big"}
    assert len(fair) == 1000  # the small ones still count for the shares


def test_usage_is_batched_decays_with_the_half_life_and_demotes_the_flooder(store):
    clock = [1000.0]
    source = UsageSource(POLICY, clock=lambda: clock[0])
    for _ in range(100):
        source.pending.append(("a", "hi", 1.0))
    for _ in range(10):
        source.pending.append(("b", "hi", 1.0))
    snap = source.fetch(store, source.initial)
    assert snap.predicted == {"a": 100.0, "b": 10.0} and snap.published["a"] == 100
    assert snap.demoted == {"a"} and snap.tiers == {"hi": 110.0}
    clock[0] += 60  # one half-life later, nothing new
    later = source.fetch(store, snap)
    assert later.predicted["a"] == pytest.approx(50.0)
    assert later.demoted == {"a"}  # still 10x b: the ratio does not decay
    for _ in range(200):
        source.pending.append(("b", "lo", 1.0))
    third = source.fetch(store, later)
    assert third.demoted == {"b"}
    assert 0 < third.entropy < 1
    assert read_usage(store, POLICY, clock[0]).demoted == {"b"}


def test_observed_runtime_from_workers_counts_as_usage(store):
    ledger = RunLedger(POLICY, Counters(), clock=lambda: 1000.0)
    for _ in range(5):
        ledger.add({"task": "t", "tenant": "a", "runtime_s": 10.0, "cpu_s": 1.0})
    ledger.add({"task": "t", "tenant": "nobody", "runtime_s": 99.0})  # not a policy tenant
    ledger.flush(store)
    snap = read_usage(store, POLICY, 1000.0)
    assert snap.observed == {"a": 50.0} and snap.runs == {"a": 5.0}
    assert snap.usage == {"a": 50.0}


def test_workers_measure_each_tiers_mean_run_for_the_read_charges(store):
    ledger = RunLedger(POLICY, Counters(), clock=lambda: 1000.0)
    for runtime in (1.0, 3.0):
        ledger.add({"task": "t", "tenant": "a", "runtime_s": runtime, "accelerator": "cpu",
                    "tier": "hi"})
    ledger.add({"task": "t", "tenant": "nobody", "runtime_s": 40.0, "accelerator": "cpu",
                "tier": "lo"})  # any tenant's run tells the tier's size
    for odd in ({"accelerator": "cpu", "tier": "gold"}, {"accelerator": "tpu", "tier": "hi"},
                {"tier": "hi"}, {"accelerator": "cpu", "tier": "hi", "runtime_s": -1.0}):
        ledger.add({"task": "t", "tenant": "a", "runtime_s": 5.0, **odd})  # not kept
    ledger.flush(store)
    snap = read_usage(store, POLICY, 1000.0)
    assert snap.tier_runtime == {"cpu.hi": 2.0, "cpu.lo": 40.0}
    assert snap.as_dict()["tier_runtime_s"] == {"cpu.hi": 2.0, "cpu.lo": 40.0}


def test_a_failed_batch_is_sent_with_the_next_round(store):
    dead = RedisStore(connect("redis://127.0.0.1:1/0", 0.05), Keys("dead"))
    source = UsageSource(POLICY, clock=lambda: 1000.0)
    source.pending.append(("a", "hi", 2.0))
    with pytest.raises(StoreError):
        source.fetch(dead, source.initial)
    source.pending.append(("a", "hi", 3.0))
    assert source.fetch(store, source.initial).predicted == {"a": 5.0}
    ledger = RunLedger(POLICY, Counters(), clock=lambda: 1000.0)
    ledger.add({"task": "t", "tenant": "a", "runtime_s": 1.0})
    with pytest.raises(StoreError):
        ledger.flush(dead)
    ledger.flush(store)
    assert read_usage(store, POLICY, 1000.0).observed == {"a": 1.0}


def test_the_snapshot_serialises_for_readers(store):
    source = UsageSource(POLICY, clock=lambda: 5.0)
    source.pending.append(("a", "lo", 1.0))
    data = source.fetch(store, source.initial).as_dict()
    assert data["usage_s"] == {"a": 1.0} and data["tiers"] == {"lo": 1.0}
    assert set(data) >= {"jain", "entropy", "fair_share", "demoted"}


def test_the_default_tolerance_leaves_equal_tenants_alone_and_demotes_a_flood():
    # Two equal tenants whose recent usage differs by chance (one drew the longer tasks)
    # are not demoted by the defaults; one sending four times the other's is.
    defaults = parse_policy({"tenants": {"a": {}, "b": {}, "default": {}}}).fair_share
    weights = {"a": 1.0, "b": 1.0}
    demoted, _ = demoted_tenants({"a": 60.0, "b": 40.0}, weights, defaults.tolerance,
                                 defaults.min_active_share)
    assert demoted == frozenset()
    demoted, _ = demoted_tenants({"a": 80.0, "b": 20.0}, weights, defaults.tolerance,
                                 defaults.min_active_share)
    assert demoted == {"a"}
