"""Replays decide with the product's real pipeline; FIFO and the oracle on the same trace."""

from __future__ import annotations

import math

import pytest

from celery_aitp.core.request import Request
from celery_aitp.policy import parse_policy
from celery_aitp.publish.pipeline import Pipeline, default_stages
from celery_aitp.replay.routers import ORACLE_HEADER, OraclePredictStage, policy_workers
from celery_aitp.replay.runner import (
    PolicyUnderTest,
    Replay,
    ReplayConfig,
    infer_slots,
    kept_processes,
    parse_slots,
)
from celery_aitp.replay.trace import from_records
from tests.conftest import TEST_POLICY

POLICY = parse_policy(TEST_POLICY)


def rec(task: str, tenant: str | None, at: float, runtime: float, tier: str = "hi",
        accelerator: str = "cpu", **extra):
    return {"task": task, "tenant": tenant, "published_at": 1000.0 + at, "runtime_s": runtime,
            "tier": tier, "accelerator": accelerator, "args": [], "kwargs": {}, **extra}


def replay(records, slots=None, tests=None, **config):
    trace = from_records(records)
    tests = tests or [PolicyUnderTest("p", POLICY, lambda clock: Pipeline(default_stages(POLICY)))]
    return Replay(trace, ReplayConfig(slots=slots or {"cpu": 1}, overhead_s=0.0, **config)
                  ).run(tests)


def waits(result, run):
    out = result.run(run).outcome
    return [out.started[i] - result.trace.published[i] for i in range(len(result.trace))]


def test_policy_serves_the_top_tier_first_where_fifo_does_not():
    # one slot; a long lo task runs, then lo and hi tasks queue behind it
    records = [rec("batch", "globex", 0.0, 10.0, tier="lo"),
               rec("batch", "globex", 1.0, 1.0, tier="lo"),
               rec("urgent", "acme", 2.0, 1.0, tier="hi")]
    result = replay(records)
    assert waits(result, "p") == [0.0, 10.0, 8.0]     # hi jumps the queue
    assert waits(result, "fifo") == [0.0, 9.0, 9.0]   # FIFO: in arrival order
    assert result.run("p").reasons == {"routed": 3}
    assert [g.tasks for g in result.run("fifo").stats.groups if g.kind == "tier"] == [1, 2]


def test_the_tenant_cap_of_the_policy_applies_in_replay():
    # globex may use at most 'mid': its declared 'hi' task is decided 'mid' by the pipeline
    records = [rec("t", "globex", 0.0, 1.0, tier="hi"), rec("t", "nobody", 0.0, 1.0)]
    result = replay(records)
    out = result.run("p").outcome
    assert [out.label_of(0), out.label_of(1)] == ["mid", "lo"]  # unknown tenant -> default
    assert out.queues == ["aitp.globex.cpu.mid", "aitp.default.cpu.lo"]


def test_a_swapped_stage_is_followed():
    class Everything:
        """A priority stage that puts every task in the lowest tier."""

        name = "priority"

        def __call__(self, request, decision, view):
            decision.tier = "lo"

    pipeline = Pipeline(default_stages(POLICY)).replace("priority", Everything())
    records = [rec("t", "acme", 0.0, 1.0, tier="hi")]
    result = replay(records, tests=[PolicyUnderTest("p", POLICY, lambda clock: pipeline)])
    assert result.run("p").outcome.queues == ["aitp.acme.cpu.lo"]


def test_accelerator_tasks_go_to_their_class_and_unserved_classes_fall_back():
    records = [rec("render", "acme", 0.0, 1.0, accelerator="gpu"),
               rec("plain", "acme", 0.0, 1.0)]
    result = replay(records, slots={"cpu": 1, "gpu": 1})
    assert result.run("p").outcome.queues == ["aitp.acme.gpu.hi", "aitp.acme.cpu.hi"]
    cpu_only = replay(records, slots={"cpu": 1})
    out = cpu_only.run("p").outcome
    assert out.queues[0] == "celery"  # no live gpu worker: Celery's default queue
    assert cpu_only.run("p").reasons == {"no_live_worker": 1, "routed": 1}
    assert cpu_only.run("fifo").stats.lost == 1  # plain FIFO strands it: no gpu queue reader


def test_oracle_stage_reads_the_true_runtime_and_ignores_bad_values():
    stage = OraclePredictStage()
    for value, expected in ((2.5, 2.5), ("2", None), (math.nan, None), (-1, None),
                            (True, None)):
        from celery_aitp.core.request import Decision

        decision = Decision("takeover", 0.0)
        stage(Request("t", "id", headers={ORACLE_HEADER: value}), decision, None)  # type: ignore[arg-type]
        assert decision.predicted_runtime_s == expected
        assert decision.prediction_source == ("oracle" if expected is not None else None)


def test_the_oracle_run_gets_true_runtimes():
    seen = []

    class Spy:
        name = "priority"

        def __call__(self, request, decision, view):
            seen.append(decision.predicted_runtime_s)
            decision.tier = "hi"

    pipeline = Pipeline(default_stages(POLICY)).replace("priority", Spy())
    replay([rec("t", "acme", 0.0, 1.5), rec("t", "acme", 1.0, 0.5)],
           tests=[PolicyUnderTest("p", POLICY, lambda clock: pipeline)])
    assert seen == [None, None, 1.5, 0.5]  # the policy run, then the oracle run


def test_slots_are_parsed_or_inferred():
    assert parse_slots("cpu=4, gpu=1") == {"cpu": 4, "gpu": 1}
    for bad in ("cpu", "cpu=0", "cpu=x", "=2", ""):
        with pytest.raises(ValueError, match="--workers"):
            parse_slots(bad)
    trace = from_records([rec("t", "a", 0, 2.0, started_at=1000.0),
                          rec("t", "a", 0, 2.0, started_at=1001.0),
                          rec("t", "a", 0, 1.0, started_at=1003.5),
                          rec("t", "a", 0, 1.0, accelerator="gpu", started_at=1000.0)])
    assert infer_slots(trace) == {"cpu": 2, "gpu": 1}
    with pytest.raises(ValueError, match="started_at"):
        infer_slots(from_records([rec("t", "a", 0, 1.0)]))


def test_overhead_is_measured_from_the_trace():
    from celery_aitp.replay.runner import estimate_overhead

    # one slot, a backlog: each run starts 3 ms after the previous one ended
    records, start = [], 1000.0
    for _ in range(30):
        records.append(rec("t", "acme", 0.0, 0.5, started_at=start))
        start += 0.5 + 0.003
    estimate = estimate_overhead(from_records(records))
    assert set(estimate) == {"cpu"} and estimate["cpu"] == pytest.approx(0.003)
    assert estimate_overhead(from_records(records[:10])) == {}  # too few samples
    assert estimate_overhead(from_records([rec("t", "a", 0, 1.0)])) == {}  # no started_at
    # a batch system's log: runs start minutes after a slot freed (its scheduler, not a
    # worker's ack and fetch), which the replay would have added to every run
    batch, start = [], 1000.0
    for _ in range(30):
        batch.append(rec("t", "acme", 0.0, 3600.0, started_at=start))
        start += 3600.0 + 120.0
    assert estimate_overhead(from_records(batch)) == {}


def test_replay_is_deterministic():
    import random

    rng = random.Random(5)
    records = [rec(rng.choice(["a", "b"]), rng.choice(["acme", "globex", None]),
                   rng.uniform(0, 30), rng.expovariate(4), tier=rng.choice(["hi", "mid", "lo"]))
               for _ in range(500)]
    first, second = replay(records, slots={"cpu": 2}), replay(records, slots={"cpu": 2})
    for a, b in zip(first.runs, second.runs, strict=True):
        assert a.outcome.started == b.outcome.started
        assert a.stats == b.stats


def test_stages_on_the_simulated_clock_see_simulated_time():
    seen = []

    class Clocked:
        name = "priority"

        def __init__(self, clock):
            self.clock = clock

        def __call__(self, request, decision, view):
            seen.append((self.clock(), decision.decided_at))
            decision.tier = "hi"

    def build(clock):
        return Pipeline(default_stages(POLICY)).replace("priority", Clocked(clock))

    replay([rec("t", "acme", 0.0, 5.0), rec("t", "acme", 2.0, 1.0)],
           tests=[PolicyUnderTest("p", POLICY, build)])
    assert seen == [(1000.0, 1000.0), (1002.0, 1002.0)] * 2  # policy run, then oracle run


def test_the_apps_swapped_stages_are_replayed(app):
    from celery_aitp.replay.app import app_pipeline_factory

    class AllLow:
        name = "priority"

        def __call__(self, request, decision, view):
            decision.tier = "lo"

    swapped = AllLow()
    app.aitp.use_stage("priority", swapped)
    build = app_pipeline_factory(app.aitp)
    first, second = build(None), build(None)
    assert swapped in first.stages and swapped in second.stages
    tenant = next(s for s in first.stages if s.name == "tenant")
    assert tenant is not next(s for s in second.stages if s.name == "tenant")  # fresh


def _backlog(tier_order: str):
    """One slot; a long run, then 20 hi tasks and one lo task queue up behind it."""
    policy = parse_policy({**TEST_POLICY, "tier_order": tier_order})
    records = [rec("long", "acme", 0.0, 5.0, tier="hi")]
    records += [rec("urgent", "acme", 0.1 + i * 0.01, 1.0, tier="hi") for i in range(20)]
    records.append(rec("batch", "default", 0.5, 1.0, tier="lo"))
    result = replay(records, tests=[PolicyUnderTest("p", policy, lambda clock: Pipeline(
        default_stages(policy, clock=clock)))])
    return result.run("p").outcome.started[-1] - result.trace.published[-1]


def test_consumption_follows_the_policys_tier_order():
    # strict: the lo task waits for every hi task; weighted: it gets its guaranteed share
    assert _backlog("strict") == pytest.approx(4.5 + 20.0)
    assert _backlog("weighted") < 4.5 + 10.0


def test_fair_share_state_flows_through_the_real_sources_and_ledger():
    import fakeredis

    from celery_aitp.replay.app import pipeline_factory
    from celery_aitp.store import Keys, RedisStore

    policy = parse_policy({**TEST_POLICY, "tenants": {"acme": {}, "globex": {},
                                                      "default": {}}})
    stores = []

    def factory():
        stores.append(RedisStore(fakeredis.FakeRedis(), Keys(f"sim{len(stores)}")))
        return stores[-1]

    # globex floods; from t=30 acme sends one task a second (enough to count as active,
    # at least 1% of the usage): globex is then above its share
    records = [rec("flood", "globex", i * 0.2, 2.0, tier="mid", cpu_s=1.0) for i in range(300)]
    records += [rec("quiet", "acme", 30.0 + i, 1.0, tier="mid", cpu_s=0.5) for i in range(20)]
    result = replay(records, slots={"cpu": 2}, store_factory=factory,
                    tests=[PolicyUnderTest("p", policy, pipeline_factory(policy))])
    out = result.run("p").outcome
    late_flood = {out.label_of(i) for i, r in enumerate(result.trace.records)
                  if r["tenant"] == "globex" and r["published_at"] > 1035}
    early_flood = {out.label_of(i) for i, r in enumerate(result.trace.records)
                   if r["tenant"] == "globex" and r["published_at"] < 1030}
    quiet = {out.label_of(i) for i, r in enumerate(result.trace.records)
             if r["tenant"] == "acme"}
    assert early_flood == {"mid"}  # alone, a tenant is never above its share
    # then the flooder is demoted one tier; the quiet tenant's shorter tasks may climb
    # above their floor by size
    assert late_flood == {"lo"} and "mid" in quiet and quiet <= {"hi", "mid"}
    usage = stores[0].client.hgetall(stores[0].keys.any("usage"))
    assert any(k.startswith(b"o:globex") for k in usage)  # observed usage from the ledger
    assert stores[0].client.xlen(stores[0].keys.observations) == len(records)
    # the workers' history summary feeds the cold-start predictions of later decisions
    fields = stores[0].client.hkeys(stores[0].keys.any("history"))
    assert sorted(fields) == [b"acme|", b"acme|quiet", b"globex|", b"globex|flood"]
    predicted = result.run("p").predictions
    from_history = predicted.get("history", 0) + predicted.get("call_history", 0)
    assert from_history > 250 and sum(predicted.values()) == len(records)
    assert result.run("oracle").predictions == {"oracle": len(records)}


def test_runs_are_recorded_under_the_tenant_the_pipeline_resolved():
    """A worker records the tenant of the task's header: a claimed name the policy does
    not take is recorded as the default tenant, and the history the later decisions read
    is the default tenant's (before, it was kept under the claimed name and never read)."""
    import fakeredis

    from celery_aitp.replay.app import as_recorded, pipeline_factory
    from celery_aitp.store import Keys, RedisStore

    stores = []

    def factory():
        stores.append(RedisStore(fakeredis.FakeRedis(), Keys(f"sim{len(stores)}")))
        return stores[-1]

    # each call its own (no repeated call to size it): the pair's history must do it
    records = [rec("job", f"user{i % 3}", i * 2.0, 1.0, args=[i]) for i in range(40)]
    result = replay(records, store_factory=factory,
                    tests=[PolicyUnderTest("p", POLICY, pipeline_factory(POLICY))])
    fields = stores[0].client.hkeys(stores[0].keys.any("history"))
    assert sorted(fields) == [b"default|", b"default|job"]
    assert result.run("p").predictions.get("history", 0) > 30
    # a model trained for the replay learns from the same names
    assert {r["tenant"] for r in as_recorded(records, POLICY)} == {"default"}
    claimed = [rec("job", "acme", 0.0, 1.0), rec("job", "user9", 0.0, 1.0)]
    assert [r["tenant"] for r in as_recorded(claimed, POLICY)] == ["acme", "default"]
    assert records[0]["tenant"] == "user0"  # the trace itself is left as it was


def test_the_simulated_trainer_runs_when_due_with_enough_new_runs(synthetic_records):
    """As ``celery aitp trainer``: a round per ``every_s``, skipped with fewer than
    ``min_new`` new runs; the model is promoted by the trainers' rule, so a second round
    on the same runs does not replace the one in use."""
    import fakeredis

    from celery_aitp.predict.model_store import ModelStore
    from celery_aitp.replay.trainer import SimTrainer, TrainerSettings
    from celery_aitp.store import Keys, RedisStore

    store = RedisStore(fakeredis.FakeRedis(), Keys("simtrain"))
    models = ModelStore(store)
    now = [0.0]
    trainer = SimTrainer(TrainerSettings(every_s=600.0, min_new=100), lambda: now[0])
    store.append_records(store.keys.observations, synthetic_records[:1500], 10_000)
    for record in synthetic_records[:50]:
        trainer.add(record)
    trainer.flush(store)  # due, but only 50 new runs: skipped
    assert models.version() is None
    for record in synthetic_records[50:150]:
        trainer.add(record)
    now[0] = 300.0
    trainer.flush(store)  # 150 new runs, but the next round is due at 600
    assert models.version() is None
    now[0] = 600.0
    trainer.flush(store)
    first = models.version()
    assert first is not None and trainer.promoted == 1
    for record in synthetic_records[150:250]:
        trainer.add(record)
    now[0] = 1200.0
    trainer.flush(store)  # the same runs again: not better than the model in use
    assert models.version() == first and trainer.promoted == 1


def test_policy_workers_keep_the_reserve_a_real_worker_keeps():
    queues = policy_workers(POLICY, {"cpu": 4}, "celery")[0].queues
    plan = kept_processes(POLICY, queues, 4)
    assert plan is not None and plan.kept == POLICY.reserve.processes
    assert plan.lowest and all(q.endswith("." + POLICY.tier_names[-1]) for q in plan.lowest)
    assert kept_processes(POLICY, queues, 2) is None  # fewer than kept + 2 processes
    off = parse_policy({**TEST_POLICY, "reserve": {"processes": 0}})
    assert kept_processes(off, queues, 4) is None
    beside = kept_processes(POLICY, queues, 4, express=True)
    assert beside is not None and beside.express  # it stands aside, and still ages


def test_a_replayed_worker_keeps_a_process_for_the_short_task():
    # three processes; three long lo tasks arrive once a lo run was timed and hi was read
    records = [rec("batch", "globex", 0.0, 1.0, tier="lo"),
               rec("urgent", "acme", 1.0, 0.05),
               *[rec("batch", "globex", 1.1, 10.0, tier="lo") for _ in range(3)],
               rec("urgent", "acme", 1.5, 0.05)]
    kept = waits(replay(records, slots={"cpu": 3}), "p")
    assert kept[5] == 0.0  # a process was kept: the short task does not wait
    assert 1.0 < kept[4] < 2.0  # the third long task waited at most the longest wait
    shared = waits(replay(records, slots={"cpu": 3}, reserve=False), "p")
    assert shared[4] == 0.0 and shared[5] > 9.0


def test_a_replayed_express_worker_runs_the_short_task_beside_the_long_ones():
    # the same arrivals: with an express process on the same three cores, no process is
    # kept (the third long task starts at once) and the short task starts at once too,
    # the four runs sharing three cores while it runs
    records = [rec("batch", "globex", 0.0, 1.0, tier="lo"),
               rec("urgent", "acme", 1.0, 0.05),
               *[rec("batch", "globex", 1.1, 10.0, tier="lo") for _ in range(3)],
               rec("urgent", "acme", 1.5, 0.05)]
    result = replay(records, slots={"cpu": 3}, express=1)
    out = result.run("p").outcome
    assert waits(result, "p")[4] == 0.0 and waits(result, "p")[5] == 0.0
    assert out.worker[5] == 1  # the express worker (beside the class's worker 0)
    assert out.lost[5] == pytest.approx(0.05 / 3)  # at 3/4 speed: a third longer
    assert out.lost[2] == pytest.approx(0.05 / 3)  # and so was each long run meanwhile
    (group,) = [g for g in result.run("p").stats.groups if g.kind == "all"]
    assert group.wait_max_s == pytest.approx(0.05 / 3)  # time lost counts as waiting
    assert result.run("fifo").outcome.lost == [0.0] * 6  # FIFO: no express worker
