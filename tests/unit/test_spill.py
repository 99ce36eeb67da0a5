"""Spill: saturated tier queues send tasks to idle standard workers (fakes only)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest

from celery_aitp.core.request import Decision, Request
from celery_aitp.core.view import View
from celery_aitp.explain import tier_story
from celery_aitp.migration.analysis import ArmStats
from celery_aitp.policy import SplitSettings, Stage, parse_policy
from celery_aitp.priority_policy import SpillSettings
from celery_aitp.publish.memo import view_fingerprint
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.publish.spill_stage import SPILL_REASON, SpillStage
from celery_aitp.scheduling.spill import (
    NO_CAPACITY,
    SPILL_SOURCE,
    Capacity,
    SpillSource,
    capacity_of,
    occupancy_key,
)
from celery_aitp.store import RedisStore
from celery_aitp.worker.occupancy import OccupancyReporter
from tests.conftest import TEST_POLICY

NOW = 1_700_000_000.0
HI = "aitp.acme.cpu.hi"
SETTINGS = SpillSettings()
POLICY = parse_policy(TEST_POLICY)


def report(queues: list[str] | None = None, depths: dict[str, Any] | None = None,
           slots: Any = 4, busy: Any = 4, default_queue: bool = False,
           accelerator: str = "cpu", at: float = NOW) -> dict[str, Any]:
    return {"at": at, "slots": slots, "busy": busy, "accelerator": accelerator,
            "default_queue": default_queue, "queues": queues or [], "depths": depths or {}}


def tier_worker(depth: int, slots: int = 2) -> dict[str, Any]:
    return report([HI], {HI: depth}, slots=slots, busy=slots)


def standard(idle: int = 2, accelerator: str = "cpu") -> dict[str, Any]:
    return report(slots=idle + 1, busy=1, default_queue=True, accelerator=accelerator)


# --- capacity: saturation, hysteresis, idle standard slots -----------------------------

def test_a_queue_spills_from_min_backlog_and_stops_only_below_the_release_level() -> None:
    idle = standard()
    below = capacity_of([tier_worker(1), idle], NOW, SETTINGS)  # 0.5 per slot
    assert below is NO_CAPACITY
    on = capacity_of([tier_worker(2), idle], NOW, SETTINGS)  # 1.0 per slot
    assert on.backlog == {HI: 1.0} and on.spill_class == "cpu" and on.idle_slots == 2
    # 0.75 per slot: below the start, above the release level: still spilling...
    hovering = capacity_of([tier_worker(3, slots=4), idle], NOW, SETTINGS, on)
    assert hovering.backlog == {HI: 0.8}
    # ... while a queue that was not spilling does not start at that level
    assert capacity_of([tier_worker(3, slots=4), idle], NOW, SETTINGS) is NO_CAPACITY
    off = capacity_of([tier_worker(2, slots=4), idle], NOW, SETTINGS, hovering)  # 0.5
    assert off is NO_CAPACITY


def test_unchanged_capacity_keeps_the_same_object() -> None:
    first = capacity_of([tier_worker(4), standard()], NOW, SETTINGS)
    again = capacity_of([tier_worker(4), standard()], NOW + 1, SETTINGS, first)
    assert again is first


def test_nothing_spills_without_idle_standard_slots_or_with_mixed_classes() -> None:
    busy = report(slots=2, busy=2, default_queue=True)
    assert capacity_of([tier_worker(8), busy], NOW, SETTINGS).spill_class is None
    mixed = [tier_worker(8), standard(accelerator="cpu"), standard(accelerator="gpu")]
    assert capacity_of(mixed, NOW, SETTINGS).spill_class is None
    wanted = SpillSettings(min_idle_slots=3)
    assert capacity_of([tier_worker(8), standard(idle=2)], NOW, wanted).spill_class is None
    assert capacity_of([tier_worker(8), standard(idle=3)], NOW, wanted).spill_class == "cpu"


def test_stale_and_malformed_reports_are_ignored() -> None:
    stale = standard() | {"at": NOW - SETTINGS.max_report_age_s - 1}
    assert capacity_of([tier_worker(8), stale], NOW, SETTINGS).spill_class is None
    hostile = [None, "x", {"at": "soon"}, report(slots=float("nan")),
               report([HI, 7, "celery"], {HI: -3, "celery": 5, "aitp.x": True}, slots=True),
               report([HI], {HI: 1e30})]
    assert capacity_of(hostile + [standard()], NOW, SETTINGS) is NO_CAPACITY
    # a depth with no serving slots is no backlog (the route falls back: no_live_worker)
    assert capacity_of([report(depths={HI: 50}), standard()], NOW, SETTINGS) is NO_CAPACITY


# --- the stage --------------------------------------------------------------------------

def view_with(capacity: Capacity) -> View:
    return View(frozenset({HI}), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType({SPILL_SOURCE: capacity}))


def routed(p50: float | None = 0.5, accelerator: str = "cpu", tenant: str = "acme",
           tier: str = "hi", task_id: str = "t1") -> tuple[Request, Decision]:
    decision = Decision("takeover", NOW, "proj.job", task_id)
    decision.tenant, decision.tier, decision.accelerator = tenant, tier, accelerator
    decision.predicted_runtime_s = p50
    decision.queue, decision.routed, decision.reason = HI, True, "routed"
    decision.tier_steps = {"size": tier}
    return Request("proj.job", task_id), decision


def spill_all() -> SpillStage:
    return SpillStage(parse_policy({**TEST_POLICY, "spill": {"max_fraction": 1.0}}))


SATURATED = Capacity({HI: 4.0}, "cpu", 3)  # 4 waiting per slot; acme's hi SLA is 1 s


def test_a_task_that_would_miss_its_sla_spills_and_says_why() -> None:
    request, decision = routed(p50=0.5)  # expected wait 4 x 0.5 = 2 s > 1 s
    spill_all()(request, decision, view_with(SATURATED))
    assert (decision.routed, decision.reason) == (False, SPILL_REASON)
    assert decision.tier == "hi" and decision.queue == HI  # where it would have gone
    assert decision.counter() == "decisions:takeover:acme:hi:cpu:spill"
    spill = decision.tier_steps["spill"]  # type: ignore[index]
    assert spill["expected_wait_s"] == pytest.approx(2.0) and spill["sla_s"] == 1
    story = tier_story(decision.tier_steps, decision.tier)
    assert "spilled to the default queue: expected wait 2 s" in story
    assert "SLA 1 s, 3 standard slot(s) idle" in story


@pytest.mark.parametrize("case", ["fits_sla", "no_prediction", "other_class", "other_queue",
                                  "not_routed", "no_capacity", "no_standard"])
def test_a_task_stays_where_spilling_would_not_help_or_is_not_allowed(case: str) -> None:
    capacity = SATURATED
    request, decision = routed(p50=0.2 if case == "fits_sla" else 0.5)  # 0.8 s <= 1 s
    if case == "no_prediction":
        decision.predicted_runtime_s = None
    elif case == "other_class":
        decision.accelerator = "gpu"  # the standard workers are CPU workers
    elif case == "other_queue":
        decision.queue = "aitp.acme.cpu.mid"
    elif case == "not_routed":
        decision.fall_back("split_standard_arm")
    elif case == "no_capacity":
        capacity = NO_CAPACITY
    elif case == "no_standard":
        capacity = Capacity({HI: 4.0}, None)
    reason = decision.reason
    spill_all()(request, decision, view_with(capacity))
    assert decision.reason == reason and "spill" not in (decision.tier_steps or {})


def test_at_most_max_fraction_of_a_saturated_queue_spills() -> None:
    stage = SpillStage(parse_policy({**TEST_POLICY, "spill": {"max_fraction": 0.25}}))
    view = view_with(SATURATED)
    spilled = 0
    for i in range(2000):
        request, decision = routed(task_id=f"task-{i}")
        stage(request, decision, view)
        spilled += decision.reason == SPILL_REASON
        assert stage.memo_key(request, decision, view) == (stage.in_share(request),)
    assert 400 <= spilled <= 600  # about a quarter, never all


def test_memo_key_and_fingerprint_follow_the_capacity() -> None:
    stage = spill_all()
    request, decision = routed()
    assert stage.memo_key(request, decision, view_with(NO_CAPACITY)) == ()
    pipeline = Pipeline(default_stages(POLICY))
    assert SPILL_SOURCE in pipeline.tail_view_sources()  # a new capacity is a new view
    sources = pipeline.tail_view_sources()
    assert view_fingerprint(view_with(SATURATED), sources) != \
        view_fingerprint(view_with(Capacity({HI: 5.0}, "cpu", 3)), sources)
    assert view_fingerprint(view_with(SATURATED), sources) == \
        view_fingerprint(view_with(SATURATED), sources)


def test_the_policy_switch_removes_the_stage() -> None:
    off = parse_policy({**TEST_POLICY, "spill": {"enabled": False}})
    assert "spill" not in {s.name for s in Pipeline(default_stages(off)).stages}
    assert "spill" in {s.name for s in Pipeline(default_stages(POLICY)).stages}


def test_a_spill_is_not_counted_as_a_routed_arm_fallback() -> None:
    arm = ArmStats()
    arm.add({"arm": "routed", "routed": False, "reason": SPILL_REASON, "wait_s": 0.1}, 1.0)
    arm.add({"arm": "routed", "routed": False, "reason": "no_live_worker"}, 1.0)
    assert (arm.n, arm.fell_back) == (2, 1)


# --- reports: worker to store to producer ----------------------------------------------

class FakeOps:
    def __init__(self, depths: dict[str, int]) -> None:
        self.asked: list[list[str]] = []
        self._depths = depths

    def depths(self, queues: list[str]) -> dict[str, int]:
        self.asked.append(list(queues))
        return {q: self._depths.get(q, 0) for q in queues}


class FakeMiddleware:
    def __init__(self, store: RedisStore) -> None:
        from celery_aitp.layout import layout_for

        self.store = store
        self.policy = POLICY
        self.layout = layout_for("redis", POLICY.tier_names)


def test_reports_from_workers_become_the_producers_capacity(store: RedisStore) -> None:
    mw = FakeMiddleware(store)
    tier = OccupancyReporter(mw, "tier@h", 2, "cpu", [HI], lambda: False, busy=lambda: 2,
                             ops=FakeOps({HI: 6}))
    plain = OccupancyReporter(mw, "std@h", 4, "cpu", [], lambda: True, busy=lambda: 1,
                              ops=FakeOps({}))
    tier.publish()
    plain.publish()
    doc = json.loads(store.client.hget(occupancy_key(store), "tier@h"))
    assert (doc["slots"], doc["busy"], doc["depths"], doc["default_queue"]) == \
        (2, 2, {HI: 6}, False)
    source = SpillSource(SETTINGS)
    capacity = source.fetch(store, source.initial)
    assert capacity.backlog == {HI: 3.0} and capacity.spill_class == "cpu"
    assert capacity.idle_slots == 3
    plain.withdraw()  # the standard worker stops: nothing may spill
    assert source.fetch(store, capacity).spill_class is None


def test_a_reports_age_is_judged_by_the_stores_clock(store: RedisStore,
                                                      monkeypatch: Any) -> None:
    """Reports were stamped with the worker's clock and aged by the producer's: a worker
    60 s behind was never counted (nothing spilled), one ahead looked alive 60 s after
    it was killed."""
    import time
    from types import SimpleNamespace

    from celery_aitp.worker import occupancy

    behind = SimpleNamespace(time=lambda: time.time() - 60.0)
    monkeypatch.setattr(occupancy, "time", behind)  # the worker's clock
    mw = FakeMiddleware(store)
    OccupancyReporter(mw, "tier@h", 2, "cpu", [HI], lambda: False, busy=lambda: 2,
                      ops=FakeOps({HI: 6})).publish()
    OccupancyReporter(mw, "std@h", 4, "cpu", [], lambda: True, busy=lambda: 1,
                      ops=FakeOps({})).publish()
    doc = json.loads(store.client.hget(occupancy_key(store), "tier@h"))
    assert abs(doc["at"] - time.time()) < 1  # the server's time (fakeredis: the real one)
    source = SpillSource(SETTINGS)
    capacity = source.fetch(store, source.initial)
    assert capacity.backlog == {HI: 3.0} and capacity.spill_class == "cpu"


def test_reports_of_workers_gone_for_an_hour_are_deleted(store: RedisStore) -> None:
    """A worker killed without withdrawing its report left it in the hash for good, read
    by every producer in every refresh."""
    import time

    key = occupancy_key(store)
    now = time.time()
    store.client.hset(key, "killed@h", json.dumps(tier_worker(6) | {"at": now - 3700}))
    store.client.hset(key, "recent@h", json.dumps(tier_worker(6) | {"at": now - 60}))
    store.client.hset(key, "std@h", json.dumps(standard(idle=2) | {"at": now}))
    store.client.hset(key, "garbage", b"{not json")
    store.client.hset(key, "no-time", json.dumps(standard(idle=2)))
    source = SpillSource(SETTINGS)
    assert source.fetch(store, source.initial) == NO_CAPACITY  # none fresh serves HI
    assert sorted(store.client.hkeys(key)) == [b"recent@h", b"std@h"]  # ignored, kept


def test_placement_command_shows_the_saturated_queues(store: RedisStore) -> None:
    import time

    from celery import Celery
    from click.testing import CliRunner

    import celery_aitp
    from celery_aitp.cli.celery_command import aitp

    app = Celery("spill-cli", broker="memory://")
    celery_aitp.install(app, policy=TEST_POLICY)
    app.aitp.store = store
    ctx = type("Ctx", (), {"app": app})()
    quiet = CliRunner().invoke(aitp, ["placement"], obj=ctx)
    assert quiet.exit_code == 0 and "no tier queue is saturated" in quiet.output
    now = time.time()
    for name, doc in {"tier": tier_worker(6) | {"at": now},
                      "std": standard(idle=2) | {"at": now}}.items():
        store.client.hset(occupancy_key(store), name, json.dumps(doc))
    data = json.loads(CliRunner().invoke(aitp, ["placement", "--json"], obj=ctx).output)
    assert data["spill"] == {"backlog_per_slot": {HI: 3.0}, "spill_class": "cpu",
                             "idle_slots": 2, "open_queues": []}
    text = CliRunner().invoke(aitp, ["placement"], obj=ctx).output
    assert "spilling to idle cpu standard workers (2 slots)" in text and HI in text
    app.aitp.close()


# --- another accelerator class ----------------------------------------------------------

GPU_HI = "aitp.acme.gpu.hi"


def test_open_queues_are_empty_tier_queues_with_an_idle_worker() -> None:
    idle_gpu = report([GPU_HI], {GPU_HI: 0}, slots=2, busy=1, accelerator="gpu")
    busy_gpu = report(["aitp.acme.gpu.mid"], {"aitp.acme.gpu.mid": 0}, slots=2, busy=2,
                      accelerator="gpu")
    waiting = report(["aitp.acme.gpu.lo"], {"aitp.acme.gpu.lo": 1}, slots=2, busy=0,
                     accelerator="gpu")
    found = capacity_of([tier_worker(8), idle_gpu, busy_gpu, waiting], NOW, SETTINGS)
    assert found.open_queues == {GPU_HI} and found.spill_class is None


def test_alternatives_must_name_known_classes() -> None:
    from celery_aitp.errors import PolicyError

    with pytest.raises(PolicyError, match="spill.alternatives.cpu: unknown accelerator "
                                          "class 'tpu'"):
        parse_policy({**TEST_POLICY, "spill": {"alternatives": {"cpu": ["tpu"]}}})


def test_a_task_spills_to_an_open_queue_of_a_class_it_can_run_on_first() -> None:
    stage = SpillStage(parse_policy({**TEST_POLICY, "spill": {
        "max_fraction": 1.0, "alternatives": {"cpu": ["gpu"]}}}))
    view = View(frozenset({HI, GPU_HI}), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType({SPILL_SOURCE: Capacity(
                    {HI: 4.0}, "cpu", 3, open_queues=[GPU_HI])}))
    request, decision = routed(p50=0.5)
    stage(request, decision, view)
    assert (decision.routed, decision.reason, decision.queue, decision.accelerator) == \
        (True, "spill_class", GPU_HI, "cpu")  # placed as cpu work, runs on gpu
    assert decision.counter() == "decisions:takeover:acme:hi:cpu:spill_class"
    assert decision.tier_steps["spill"]["to_accelerator"] == "gpu"  # type: ignore[index]
    story = tier_story(decision.tier_steps, decision.tier)
    assert f"spilled to {GPU_HI} (class gpu instead of cpu): expected wait 2 s" in story
    # not live (its worker's advertisement expired): the default queue instead
    request, decision = routed(p50=0.5)
    stage(request, decision, view_with(view.sources[SPILL_SOURCE]))
    assert (decision.routed, decision.reason) == (False, SPILL_REASON)
    # no alternative listed for gpu tasks, and the standard workers are cpu: stays
    request, decision = routed(p50=0.5, accelerator="gpu")
    decision.queue = GPU_HI
    stage(request, decision, View(view.live_queues, Stage.TAKEOVER, SplitSettings(), True,
                                  sources=MappingProxyType({SPILL_SOURCE: Capacity(
                                      {GPU_HI: 4.0}, "cpu", 3, open_queues=[HI])})))
    assert decision.reason == "routed" and decision.queue == GPU_HI


def test_on_rabbitmq_each_tier_gets_its_broker_queues_depth(store: RedisStore) -> None:
    from celery_aitp.layout import layout_for

    mw = FakeMiddleware(store)
    mw.layout = layout_for("amqp", POLICY.tier_names)
    mid = "aitp.acme.cpu.mid"
    physical = mw.layout.physical(HI)
    assert physical == mw.layout.physical(mid) != HI  # one broker queue per tenant and class
    ops = FakeOps({physical: 7})
    reporter = OccupancyReporter(mw, "w@h", 1, "cpu", [HI, mid], lambda: False, ops=ops)
    assert reporter.depths() == {HI: 7, mid: 7} and ops.asked == [[physical]]
    standard_worker = OccupancyReporter(mw, "s@h", 1, "cpu", [], lambda: True, ops=ops)
    assert standard_worker.depths() == {} and len(ops.asked) == 1  # no broker round trip


def test_an_unlisted_tenant_spills_by_its_class_sla_and_stays_in_its_class_queues() -> None:
    """A tenant the policy does not list has its class's SLA, and its alternative queue is
    the class's on the other accelerator, not one named after the tenant."""
    policy = parse_policy({**TEST_POLICY,
                           "tenant_classes": {"small": {"max_tier": "hi", "sla_s": 0.5}},
                           "unlisted_tenants": "small",
                           "spill": {"max_fraction": 1.0, "alternatives": {"cpu": ["gpu"]}}})
    class_hi, class_gpu_hi = "aitp.small.cpu.hi", "aitp.small.gpu.hi"
    stage = SpillStage(policy)
    view = View(frozenset({class_hi, class_gpu_hi}), Stage.TAKEOVER, SplitSettings(), True,
                sources=MappingProxyType({SPILL_SOURCE: Capacity(
                    {class_hi: 2.0}, None, 0, open_queues=[class_gpu_hi])}))
    # waits 2 x 0.3 = 0.6 s: within hi's 1 s, past the class's 0.5 s
    request, decision = routed(p50=0.3, tenant="newcomer")
    decision.queue = class_hi
    stage(request, decision, view)
    assert (decision.reason, decision.queue) == ("spill_class", class_gpu_hi)
    assert decision.tier_steps["spill"]["sla_s"] == 0.5  # type: ignore[index]


@pytest.mark.parametrize("hint", [True, "2", -1, 0, float("inf"), float("nan"), None])
def test_only_a_positive_finite_runtime_hint_counts(hint: Any) -> None:
    from celery_aitp.core.request import runtime_hint

    assert runtime_hint({"runtime_hint_s": hint}) is None
    assert runtime_hint({"runtime_hint_s": 2}) == 2.0
