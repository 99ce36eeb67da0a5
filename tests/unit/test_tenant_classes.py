"""Tenant classes: tenants sharing a bounded set of tier queues, and tenants the policy does
not list getting an identity of their own (fair share, usage) under a class's defaults."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from celery_aitp.core.request import Request
from celery_aitp.core.view import View
from celery_aitp.errors import PolicyError
from celery_aitp.policy import SplitSettings, Stage, TenantNames, parse_policy
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.scheduling.size_classes import SizeClasses
from celery_aitp.scheduling.usage import UsageSnapshot
from celery_aitp.worker.bootstep import WorkerPlan, refuse_express_on_amqp
from celery_aitp.worker.observe import checked_header
from celery_aitp.worker.tier_cycle import WeightPlan
from tests.conftest import TEST_POLICY

#: acme has queues of its own; globex and every unlisted tenant share class 'std'.
POLICY = parse_policy({
    **TEST_POLICY,
    "tenants": {"acme": {"max_tier": "hi", "weight": 2},
                "globex": {"max_tier": "mid", "tenant_class": "std"},
                "default": {"max_tier": "lo"}},
    "tenant_classes": {"std": {"max_tier": "mid", "weight": 1, "queue_weight": 3},
                       "closed": {"trusted_header": False}},
    "unlisted_tenants": "std",
})


def live_view(live: frozenset[str], demoted: frozenset[str] = frozenset()) -> View:
    sources = {"usage": UsageSnapshot(demoted=demoted), "sizes": SizeClasses()}
    return View(live, Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType(sources))


def decide(policy: Any, tenant: Any, declared: dict[str, Any] | None = None,
           live: frozenset[str] | None = None) -> Any:
    request = Request("t", "id", (), {}, {"aitp_tenant": tenant}, declared or {}, None,
                      1000.0, 0)
    queues = live if live is not None else frozenset(
        WorkerPlan(policy, "*", None, None, False).queue_names())
    return Pipeline(default_stages(policy)).decide(request, live_view(queues), 1000.0)


def test_classes_are_validated_by_path() -> None:
    bad = {**TEST_POLICY,
           "tenants": {"default": {}, "std": {}, "a": {"tenant_class": "nope"}},
           "tenant_classes": {"std": {"max_tier": "gold"}}, "unlisted_tenants": "gone"}
    with pytest.raises(PolicyError) as err:
        parse_policy(bad)
    text = str(err.value)
    for problem in ("tenant_classes.std.max_tier: unknown tier 'gold'",
                    "tenant_classes.std: a tenant has this name",
                    "tenants.a.tenant_class: unknown class 'nope'",
                    "unlisted_tenants: unknown class 'gone'"):
        assert problem in text


def test_a_classed_or_unlisted_tenant_routes_to_its_class_queue_under_its_own_name() -> None:
    own = decide(POLICY, "acme")
    assert (own.tenant, own.queue, own.routed) == ("acme", "aitp.acme.cpu.lo", True)
    listed = decide(POLICY, "globex")
    assert (listed.tenant, listed.queue, listed.routed) == ("globex", "aitp.std.cpu.lo", True)
    new = decide(POLICY, "newco")
    assert (new.tenant, new.queue, new.routed) == ("newco", "aitp.std.cpu.lo", True)
    assert new.notes == []


def test_an_unlisted_tenant_is_capped_at_its_class_max_tier() -> None:
    new = decide(POLICY, "newco", declared={"tier": "hi"})
    assert new.tier == "mid" and new.queue == "aitp.std.cpu.mid"


def test_without_unlisted_tenants_or_with_an_untrusted_class_they_get_the_default() -> None:
    closed = parse_policy({**TEST_POLICY, "tenant_classes": {"c": {"trusted_header": False}},
                           "unlisted_tenants": "c"})
    refused = decide(closed, "newco")
    assert (refused.tenant, refused.notes) == ("default", ["tenant_refused"])
    today = decide(parse_policy(TEST_POLICY), "newco")
    assert (today.tenant, today.notes) == ("default", ["tenant_unknown"])
    invalid = decide(POLICY, "Not A Name")  # not queue-name safe: never an identity
    assert (invalid.tenant, invalid.notes) == ("default", ["tenant_unknown"])


def test_a_name_with_a_trailing_newline_is_no_tenant_and_no_policy_name() -> None:
    """``$`` also matches before a final newline: ``acme\\n`` became a look-alike tenant of
    its own beside ``acme`` (records, labels, inherited by sub-tasks)."""
    for name in ("acme\n", "newco\n", "default\n"):
        found = decide(POLICY, name)
        assert (found.tenant, found.notes) == ("default", ["tenant_unknown"])
    with pytest.raises(PolicyError, match="'acme\\\\n' is not a valid name"):
        parse_policy({**TEST_POLICY, "tenants": {"default": {}, "acme\n": {}}})


def test_without_a_live_worker_for_the_class_the_task_falls_back() -> None:
    alone = decide(POLICY, "newco", live=frozenset({"aitp.acme.cpu.lo"}))
    assert not alone.routed and alone.reason == "no_live_worker"


def test_workers_serve_owners_of_queues_and_refuse_a_tenant_that_shares_them() -> None:
    everything = WorkerPlan(POLICY, "*", None, "lo", False)
    assert everything.queue_names() == ["aitp.acme.cpu.lo", "aitp.default.cpu.lo",
                                        "aitp.std.cpu.lo", "aitp.closed.cpu.lo",
                                        "aitp.std~over.cpu.lo", "aitp.closed~over.cpu.lo"]
    assert WorkerPlan(POLICY, "std", None, "lo", False).queue_names() == [
        "aitp.std.cpu.lo", "aitp.std~over.cpu.lo"]  # and the class's over-share lane
    # a lane per tier: a worker reads the lanes of the tiers it serves, after the queues
    assert WorkerPlan(POLICY, "std", None, "hi,mid", False).queue_names() == [
        "aitp.std.cpu.hi", "aitp.std.cpu.mid", "aitp.std~over.cpu.hi",
        "aitp.std~over.cpu.mid"]
    assert WorkerPlan(POLICY, "acme", None, None, False).queue_names() == [
        "aitp.acme.cpu.hi", "aitp.acme.cpu.mid", "aitp.acme.cpu.lo"]  # no lane of its own
    with pytest.raises(PolicyError, match="globex \\(shares the queues of class 'std'"):
        WorkerPlan(POLICY, "globex", None, None, False)
    with pytest.raises(PolicyError, match="unknown tenant"):
        WorkerPlan(POLICY, "newco", None, None, False)


def test_an_express_worker_serves_only_the_top_tier_and_not_the_default_queue() -> None:
    express = WorkerPlan(POLICY, "*", None, None, False, express=True)
    assert express.tiers == ["hi"]
    assert express.no_default_queue
    assert express.queue_names() == ["aitp.acme.cpu.hi", "aitp.default.cpu.hi",
                                     "aitp.std.cpu.hi", "aitp.closed.cpu.hi",
                                     "aitp.std~over.cpu.hi", "aitp.closed~over.cpu.hi"]
    assert WorkerPlan(POLICY, "acme", "cpu", None, False, express=True).queue_names() == [
        "aitp.acme.cpu.hi"]
    with pytest.raises(PolicyError, match="--aitp-express serves the top tier only"):
        WorkerPlan(POLICY, "*", None, "mid", False, express=True)
    with pytest.raises(PolicyError, match="--aitp-express needs --aitp-tenant"):
        WorkerPlan(POLICY, (), None, None, False, express=True)
    refuse_express_on_amqp(express, "redis")
    refuse_express_on_amqp(WorkerPlan(POLICY, "*", None, None, False), "amqp")
    with pytest.raises(PolicyError, match="--aitp-express on RabbitMQ: a tenant's tiers share"):
        refuse_express_on_amqp(express, "amqp")


def test_a_class_queue_reads_with_the_class_queue_weight() -> None:
    plan = WeightPlan(POLICY, ["aitp.acme.cpu.lo", "aitp.std.cpu.lo"])
    assert plan.weights == {"aitp.acme.cpu.lo": 2.0, "aitp.std.cpu.lo": 3.0}


def test_unlisted_tenants_have_their_own_fair_share() -> None:
    values = {"p:acme": 10.0, "p:newco": 80.0, "p:other-co": 10.0}
    snap = UsageSnapshot.from_values(values, 0.0, POLICY)
    assert set(snap.usage) == {"acme", "newco", "other-co"}
    assert snap.demoted == {"newco"}
    closed = UsageSnapshot.from_values(values, 0.0, parse_policy(TEST_POLICY))
    assert set(closed.usage) == {"acme"}  # the others are not tenants of that policy


def test_records_keep_an_unlisted_tenant_only_when_the_policy_takes_them() -> None:
    header, bad = checked_header({"tenant": "newco"}, TenantNames(POLICY))
    assert header == {"tenant": "newco"} and bad == []
    header, bad = checked_header({"tenant": "newco"}, TenantNames(parse_policy(TEST_POLICY)))
    assert "tenant" not in header and bad == ["tenant"]


def test_metrics_labels_and_tenant_rows_stay_bounded_with_many_tenants() -> None:
    from celery_aitp.dashboard import pages
    from celery_aitp.dashboard.fleet import Snapshot
    from celery_aitp.dashboard.labels import MAX_TENANT_LABELS, OTHER, Bounds

    many = parse_policy({**TEST_POLICY, "tenants": {f"t{i}": {} for i in range(200)}
                         | {"default": {}}})
    bounds = Bounds(many)
    labels = {bounds.tenant(f"t{i}") for i in range(200)}
    assert len(labels) == MAX_TENANT_LABELS and OTHER in labels
    assert bounds.tenant("t0") == "t0" and bounds.tenant("t199") == OTHER  # sticky
    assert Bounds(POLICY).tenant("newco") == "newco"  # unlisted, under the bound
    # a class and its lane own queues and counters: their own label, even past the bound
    classed = parse_policy({**TEST_POLICY, "tenants": {f"t{i}": {} for i in range(200)}
                            | {"default": {}}, "tenant_classes": {"std": {}}})
    full = Bounds(classed)
    for i in range(200):
        full.tenant(f"t{i}")
    assert full.tenant("std") == "std" and full.tenant("std~over") == "std~over"
    runs = [{"tenant": f"t{i}", "runtime_s": float(i), "wait_s": 0.1, "tier": "lo"}
            for i in range(200)]
    page = pages.tenants(Snapshot(at=0.0, observations=runs), many, 300.0)
    rows = page["tenants"]
    assert len(rows) == pages.MAX_TENANT_ROWS
    assert rows[-1]["tenant"] == pages.OTHER_TENANTS and rows[-1]["tenants"] == 201 - 49
    assert {r["tenant"] for r in rows[:-1]} == {f"t{i}" for i in range(151, 200)}  # busiest
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-9  # nothing dropped
    assert rows[-1]["wait"]["lo"]["n"] == 151  # the rest's waits pooled (it had none)


def test_queue_rows_stay_bounded_and_the_rest_is_summed() -> None:
    from celery_aitp.dashboard import pages

    rows = [{"queue": "celery", "kind": "default", "depth": 1, "orphaned": False}]
    rows += [{"queue": f"aitp.t{i}.cpu.lo", "kind": "tier", "depth": i % 7,
              "oldest_age_s": float(i), "orphaned": i == 5} for i in range(300)]
    shown, other = pages.top_queues(rows)
    assert len(shown) + 1 == pages.MAX_QUEUE_ROWS and other is not None
    assert [q["queue"] for q in shown[:2]] == ["celery", "aitp.t5.cpu.lo"]
    assert sum(q["depth"] for q in shown) + other["depth"] == sum(q["depth"] for q in rows)
    assert other["queues"] == 301 - len(shown) and other["oldest_age_s"] is not None
    assert pages.top_queues(rows[:10]) == (rows[:10], None)


def test_usage_rereads_keep_to_their_budget_and_batches_still_ship(store) -> None:
    from celery_aitp.scheduling.usage import UsageSource, read_usage

    source = UsageSource(POLICY, clock=lambda: 1000.0, read_budget=1e-9)  # one read only
    source.pending.append(("newco", "lo", 5.0))
    first = source.fetch(store, source.initial)
    assert first.predicted == {"newco": 5.0}
    source.pending.append(("acme", "lo", 7.0))
    second = source.fetch(store, first)
    assert second is first  # not re-read within the budget ...
    assert read_usage(store, POLICY, 1000.0).predicted == {"newco": 5.0, "acme": 7.0}  # sent


def test_workers_charge_observed_usage_to_unlisted_tenants(store) -> None:
    from celery_aitp.scheduling.usage import read_usage
    from celery_aitp.telemetry.counters import Counters
    from celery_aitp.worker.ledger import RunLedger

    ledger = RunLedger(POLICY, Counters(), clock=lambda: 1000.0)
    ledger.add({"task": "t", "tenant": "newco", "runtime_s": 3.0})
    ledger.add({"task": "t", "tenant": "Bad Name", "runtime_s": 9.0})
    ledger.flush(store)
    assert read_usage(store, POLICY, 1000.0).observed == {"newco": 3.0}


def test_fair_share_at_a_thousand_tenants_of_one_class_demotes_only_the_flooder() -> None:
    values = {f"p:c{i}": 1.0 for i in range(1000)} | {"p:c7": 400.0}
    snap = UsageSnapshot.from_values(values, 0.0, POLICY)
    assert snap.demoted == {"c7"}
    flooded = decide_with_usage(POLICY, "c7", snap)
    quiet = decide_with_usage(POLICY, "c8", snap)
    # the flooder's tasks wait in the class's over-share lane, not ahead of the others
    assert (flooded.queue, quiet.queue) == ("aitp.std~over.cpu.lo", "aitp.std.cpu.mid")
    assert flooded.routed and quiet.routed


def decide_with_usage(policy: Any, tenant: str, snap: UsageSnapshot,
                      live: frozenset[str] | None = None) -> Any:
    request = Request("t", "id", (), {}, {"aitp_tenant": tenant}, {"tier": "mid"}, None,
                      1000.0, 0)
    queues = live if live is not None else frozenset(
        WorkerPlan(policy, "*", None, None, False).queue_names())
    view = View(queues, Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType({"usage": snap, "sizes": SizeClasses()}))
    return Pipeline(default_stages(policy)).decide(request, view, 1000.0)


def test_scrapes_between_two_snapshots_reuse_the_window_figures(store, monkeypatch) -> None:
    from prometheus_client.exposition import generate_latest

    from celery_aitp.dashboard import pages
    from celery_aitp.dashboard.fleet import Fleet
    from celery_aitp.dashboard.metrics import registry_for
    from celery_aitp.stubs import MemoryQueueOps

    ops = MemoryQueueOps()
    fleet = Fleet(store, POLICY, "celery", lambda: ops, 10.0, refresh_s=3600, window_s=300)
    calls = []
    real = pages.predictions
    monkeypatch.setattr(pages, "predictions", lambda snap: calls.append(1) or real(snap))
    registry = registry_for(fleet)
    first = generate_latest(registry)
    assert generate_latest(registry) == first and len(calls) == 1
    fleet.snapshot(max_age_s=0)  # a new snapshot: the window is read again
    generate_latest(registry)
    assert len(calls) == 2


def test_tenants_of_a_class_are_counted_under_their_class() -> None:
    new = decide(POLICY, "newco")
    listed = decide(POLICY, "globex")
    own = decide(POLICY, "acme")
    assert new.counter() == "decisions:takeover:std:lo:cpu:routed"
    assert listed.counter() == "decisions:takeover:std:lo:cpu:routed"
    assert own.counter() == "decisions:takeover:acme:lo:cpu:routed"
    assert (new.tenant, listed.tenant) == ("newco", "globex")  # their own names elsewhere


def test_a_tenant_that_joined_a_class_leaves_nothing_in_its_former_queues(store) -> None:
    from types import SimpleNamespace

    from celery_aitp.layout import PerTierLayout
    from celery_aitp.migration.control import stage_doc
    from celery_aitp.stubs import MemoryQueueOps
    from celery_aitp.telemetry.counters import Counters
    from celery_aitp.worker.janitor import Janitor

    ops = MemoryQueueOps()
    ops.queues["aitp.globex.cpu.lo"].extend([(0.0, "a"), (1.0, "b")])  # before the class
    middleware = SimpleNamespace(policy=POLICY, layout=PerTierLayout(), store=store,
                                 default_queue="celery", counters=Counters())
    store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    store.advertise("w", WorkerPlan(POLICY, "*", None, None, False).queue_names(), {}, 60)
    janitor = Janitor(middleware, ops=ops)
    assert "aitp.globex.cpu.lo" not in janitor.known_queues()  # not a queue of the policy
    assert janitor.sweep() == {"aitp.globex.cpu.lo": 2}  # the first pass looks anyway
    ops.queues["aitp.globex.cpu.lo"].append((2.0, "c"))
    assert janitor.sweep() == {}  # later passes do not pay for thousands of tenants
    assert [m for _, m in ops.queues["celery"]] == ["a", "b"]


def test_former_queues_are_looked_at_a_batch_per_pass(store) -> None:
    """Thousands of classed tenants: no burst of broker calls at start, and every former
    queue is still looked at once."""
    from types import SimpleNamespace

    from celery_aitp.layout import PerTierLayout
    from celery_aitp.migration.control import stage_doc
    from celery_aitp.stubs import MemoryQueueOps
    from celery_aitp.telemetry.counters import Counters
    from celery_aitp.worker.janitor import Janitor

    class Counting(MemoryQueueOps):
        def __init__(self) -> None:
            super().__init__()
            self.looked: list[str] = []

        def depths(self, queues):  # type: ignore[no-untyped-def]
            self.looked.extend(queues)
            return super().depths(queues)

    ops = Counting()
    middleware = SimpleNamespace(policy=POLICY, layout=PerTierLayout(), store=store,
                                 default_queue="celery", counters=Counters())
    store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    store.advertise("w", WorkerPlan(POLICY, "*", None, None, False).queue_names(), {}, 60)
    janitor = Janitor(middleware, ops=ops)
    janitor.FORMER_PER_PASS = 2
    former = janitor.former_queues()
    assert len(former) > 2
    ops.queues[former[-1]].append((0.0, "late"))
    passes = 0
    while not ops.queues["celery"]:
        janitor.sweep()
        passes += 1
        assert passes <= len(former)
    assert passes == -(-len(former) // 2)  # a batch of two per pass, the last one last
    assert set(former) <= set(ops.looked)
    before = len(ops.looked)
    janitor.sweep()
    assert not set(ops.looked[before:]) & set(former)  # each looked at once


# --- the over-share lane ------------------------------------------------------------

def test_a_demoted_tenant_of_a_class_goes_to_the_lane_and_the_others_to_the_class() -> None:
    snap = UsageSnapshot(demoted=frozenset({"newco", "acme"}))
    demoted = decide_with_usage(POLICY, "newco", snap)  # unlisted, class std
    assert (demoted.tenant, demoted.queue, demoted.routed) == (
        "newco", "aitp.std~over.cpu.lo", True)
    listed = decide_with_usage(POLICY, "globex", UsageSnapshot(demoted=frozenset({"globex"})))
    assert listed.queue == "aitp.std~over.cpu.lo"
    other = decide_with_usage(POLICY, "other", snap)  # same class, not demoted
    assert (other.queue, other.routed) == ("aitp.std.cpu.mid", True)
    own = decide_with_usage(POLICY, "acme", snap)  # dedicated: today's demotion, own queue
    assert own.queue == "aitp.acme.cpu.lo"


def test_without_a_live_worker_for_the_lane_a_demoted_task_falls_back() -> None:
    """Older workers do not advertise the lane: the task keeps Celery's route."""
    snap = UsageSnapshot(demoted=frozenset({"newco"}))
    old = frozenset(q for q in WorkerPlan(POLICY, "*", None, None, False).queue_names()
                    if "~" not in q)
    fell = decide_with_usage(POLICY, "newco", snap, live=old)
    assert (fell.queue, fell.routed, fell.reason) == (
        "aitp.std~over.cpu.lo", False, "no_live_worker")


def test_without_fair_share_nobody_goes_to_the_lane() -> None:
    off = parse_policy({**POLICY.model_dump(mode="json"), "fair_share": {"enabled": False}})
    decision = decide_with_usage(off, "newco", UsageSnapshot(demoted=frozenset({"newco"})))
    assert decision.queue == "aitp.std.cpu.mid"


def test_a_lane_is_read_with_the_demoted_weight_of_the_lowest_tier() -> None:
    queues = WorkerPlan(POLICY, "std", None, None, False).queue_names()
    plan = WeightPlan(POLICY, queues)
    lo = POLICY.tier_weights()["lo"]
    assert plan.weights["aitp.std.cpu.lo"] == lo * 3  # the class's queue_weight
    assert plan.weights["aitp.std~over.cpu.lo"] == lo / 8 * 3
    assert plan.demoted["aitp.std~over.cpu.lo"] == lo / 8 * 3
    assert "aitp.std~over.cpu.lo" not in plan.tenants  # no tenant to demote further


def test_the_janitor_drains_a_lane_without_a_live_consumer(store) -> None:
    from types import SimpleNamespace

    from celery_aitp.layout import PerTierLayout
    from celery_aitp.migration.control import stage_doc
    from celery_aitp.stubs import MemoryQueueOps
    from celery_aitp.telemetry.counters import Counters
    from celery_aitp.worker.janitor import Janitor

    ops = MemoryQueueOps()
    ops.queues["aitp.std~over.cpu.lo"].extend([(0.0, "a"), (1.0, "b")])
    middleware = SimpleNamespace(policy=POLICY, layout=PerTierLayout(), store=store,
                                 default_queue="celery", counters=Counters())
    store.write_stage(stage_doc(Stage.TAKEOVER, SplitSettings()), "me")
    janitor = Janitor(middleware, ops=ops)
    janitor._former_next = None  # former queues are another test's
    known = janitor.known_queues()
    assert {"aitp.std~over.cpu.lo", "aitp.closed~over.cpu.lo"} <= set(known)
    accelerators, tiers = len(POLICY.accelerators), len(POLICY.tier_names)
    # (dedicated + classes) x accelerators x tiers, and a lane per class, accelerator
    # and tier
    assert len(known) == (2 + 2) * accelerators * tiers + 2 * accelerators * tiers
    store.advertise("w", WorkerPlan(POLICY, "std", None, None, False).queue_names(), {}, 60)
    assert janitor.sweep() == {}  # served: the lane stays
    assert len(ops.queues["aitp.std~over.cpu.lo"]) == 2
    store.withdraw("w")  # an older worker of the class: its queues, no lane
    store.advertise("old", ["aitp.std.cpu.hi", "aitp.std.cpu.mid", "aitp.std.cpu.lo"], {}, 60)
    assert janitor.sweep() == {"aitp.std~over.cpu.lo": 2}
    assert [m for _, m in ops.queues["celery"]] == ["a", "b"]


def test_on_rabbitmq_a_lane_is_the_level_below_the_lowest_tier_in_its_class_queue() -> None:
    from celery_aitp.layout import PerTenantLayout, physical_groups
    from celery_aitp.worker.aging import AgingPlan, Selector

    layout = PerTenantLayout(POLICY.tier_names)
    lane = "aitp.std~over.cpu.lo"
    assert layout.physical(lane) == "aitp.std.cpu"
    assert layout.priority(lane) == 0 < layout.priority("aitp.std.cpu.lo")
    # every tier's lane: the same level (one FIFO below the class's tiers)
    assert layout.physical("aitp.std~over.cpu.hi") == "aitp.std.cpu"
    assert layout.priority("aitp.std~over.cpu.hi") == 0
    queues = WorkerPlan(POLICY, "std", None, None, False).queue_names()
    assert list(physical_groups(layout, queues)) == ["aitp.std.cpu"]  # one consumer
    # aging raises a lane message as it does the lowest tier's (no starvation)
    target, ages = AgingPlan(POLICY, layout).selectors["aitp.std.cpu"]
    lowest_age = ages[layout.priority("aitp.std.cpu.lo")]

    def header(published_at: float) -> dict[str, Any]:
        return {"aitp": {"decided_at": published_at}}

    assert Selector(ages, target, now=1000.0).decide(0, header(1000.0 - lowest_age + 1)) \
        is None  # younger than the lowest tier's promotion age: stays
    assert Selector(ages, target, now=1000.0).decide(0, header(1000.0 - lowest_age - 1)) \
        == target  # older: raised to the class's top priority


def test_a_class_name_is_never_taken_for_an_unlisted_tenant() -> None:
    """Its queues, counters and metric labels are the class's: a header naming it, or a
    split selecting it, would have mixed a tenant into them."""
    names = TenantNames(POLICY)
    assert "newco" in names and "std" not in names and "closed" not in names


def test_a_header_naming_a_class_is_said_to_name_a_class(caplog) -> None:
    """With unlisted_tenants set, the log advised setting it."""
    with caplog.at_level("WARNING", logger="celery_aitp.publish.tenant_stage"):
        found = decide(POLICY, "std")
    assert (found.tenant, found.notes) == ("default", ["tenant_unknown"])
    assert "names a tenant class" in caplog.text and "set unlisted_tenants" not in caplog.text
