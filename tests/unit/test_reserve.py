"""The reserve: the lowest tier never holds every process while higher tiers have work."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

import celery_aitp
from celery_aitp.policy import parse_policy
from celery_aitp.stubs import MemoryQueueOps
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker import tier_cycle
from celery_aitp.worker.bootstep import AitpWorkerStep
from celery_aitp.worker.reserve import (
    SAMPLE_S,
    Reserve,
    ReserveSampler,
    express_covers,
    lowest_tier_queues,
)
from celery_aitp.worker.tier_cycle import WeightedTierCycle
from tests.conftest import TEST_POLICY
from tests.support.queue_order import brpop

HI, LO = "aitp.a.cpu.hi", "aitp.a.cpu.lo"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(queue: str) -> SimpleNamespace:
    return SimpleNamespace(delivery_info={"routing_key": queue})


@pytest.fixture
def setup():
    """A 4-process worker keeping one process, with the requests it holds in a list."""
    clock = Clock()
    held: list[SimpleNamespace] = []
    reserve = Reserve([LO], processes=4, kept=1, max_wait_runs=1.5,
                      requests=lambda: list(held), clock=clock, counters=Counters())
    tier_cycle.configure({HI: 64.0, LO: 1.0}, 1.0)
    tier_cycle.set_reserve(reserve)
    yield reserve, held, clock
    tier_cycle.set_reserve(None)
    tier_cycle.configure({}, 1.0)


def capped(reserve: Reserve, held: list, clock: Clock, run_s: float) -> None:
    """Time one lowest-tier run of ``run_s``, then fill all but the kept process with
    lowest-tier runs while a higher tier is in use: the reserve holds."""
    time_one_lowest_run(reserve, held, clock, run_s)
    held.extend(request(LO) for _ in range(3))
    reserve.read(HI)
    assert reserve.holds()


def counted(reserve: Reserve) -> dict[str, int]:
    """The reserve's events this worker counted so far."""
    assert reserve.counters is not None
    return {k: n for k, n in reserve.counters.totals.items() if k.startswith("reserve:")}


def time_one_lowest_run(reserve: Reserve, held: list, clock: Clock, seconds: float) -> None:
    """Let the reserve time one lowest-tier run of ``seconds``."""
    run = request(LO)
    held.append(run)
    reserve.holds()
    clock.now += seconds
    held.remove(run)
    reserve.holds()


def test_until_a_lowest_tier_run_was_timed_the_reserve_never_holds(setup):
    reserve, held, clock = setup
    held.extend(request(LO) for _ in range(3))
    reserve.read(HI)
    assert reserve.max_wait_s == math.inf
    assert not reserve.holds()


def test_with_three_long_runs_of_four_processes_a_read_leaves_the_lowest_tier_out(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    assert reserve.max_wait_s == pytest.approx(1.5)
    reserve.read(HI)
    held.extend(request(LO) for _ in range(2))
    cycle = WeightedTierCycle([HI, LO])
    queues = {HI: deque(), LO: deque(range(5))}
    assert brpop(cycle, queues) == LO  # two of four run long tasks: a third may start
    held.append(request(LO))
    assert cycle.consume(2) == [HI]  # three of four: the last process is kept
    assert brpop(cycle, queues) is None
    queues[HI].append("short")
    assert brpop(cycle, queues) == HI
    held.pop()  # one long run ended: the lowest tier is read again
    assert brpop(cycle, queues) == LO


def test_the_reserve_lets_go_when_no_higher_tier_was_read_lately(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 1.0)
    clock.now += 1.6  # more than 1.5 mean runs without a higher-tier read (cold start)
    assert not reserve.holds()
    reserve.read(LO)  # reading the lowest tier does not count
    assert not reserve.holds()


def test_a_lowest_tier_task_that_waited_max_wait_runs_takes_a_kept_process(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 2.0)
    ops = MemoryQueueOps()
    sampler = ReserveSampler(None, reserve, ops)
    ops.queues[LO].append((time.time() - 2.8, "task"))
    sampler.sample()
    assert reserve.holds()  # waited 2.8 s < 1.5 x 2 s
    ops.queues[LO].appendleft((time.time() - 3.1, "older task"))
    sampler.sample()
    assert not reserve.holds()
    assert reserve.capped  # still capped: the sampler keeps reading while it lets go


def test_the_reserve_lets_go_while_more_lowest_tier_tasks_wait_than_the_tier_may_run(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 2.0)
    held.extend(request(LO) for _ in range(3))
    reserve.read(HI)
    ops = MemoryQueueOps()
    sampler = ReserveSampler(None, reserve, ops)
    ops.queues[LO].extend((time.time(), i) for i in range(3))
    assert reserve.holds()
    sampler.sample()
    assert reserve.waiting == 3 and reserve.holds()  # three wait, three may run: kept
    ops.queues[LO].append((time.time(), 3))
    sampler.sample()
    assert not reserve.holds()  # a backlog the capped tier cannot drain: let go


def test_a_lowest_tier_task_that_waited_max_wait_runs_is_read_first(setup):
    # aging on Redis: under a higher tiers' backlog the weighted order alone reads the
    # lowest tier once in 65 reads (pareto: long tasks waited 2.6x FIFO's longest)
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)  # max wait 1.5 s
    reserve.read(HI)
    ops = MemoryQueueOps()
    sampler = ReserveSampler(None, reserve, ops)
    cycle = WeightedTierCycle([HI, LO])
    queues = {HI: deque(range(100)), LO: deque(["first", "long"])}
    assert [brpop(cycle, queues) for _ in range(2)] == [HI, LO]  # now 64 HI reads to one LO
    clock.now += 0.8
    ops.queues[LO].append((time.time() - 1.0, "long"))
    assert brpop(cycle, queues) == HI and reserve.watching  # not read for half a max wait
    sampler.sample()
    assert not reserve.overdue() and brpop(cycle, queues) == HI  # waited 1 s of 1.5
    ops.queues[LO][0] = (time.time() - 1.6, "long")
    sampler.sample()
    assert reserve.overdue() and brpop(cycle, queues) == LO
    assert not reserve.overdue() and brpop(cycle, queues) == HI  # read: the next sample tells
    assert counted(reserve) == {"reserve:read_first": 1}


def test_a_kept_process_a_lowest_tier_task_takes_is_counted_with_the_reason(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 2.0)  # three long runs of four processes, max wait 3 s
    reserve.sampled(2.9)
    assert reserve.holds()
    reserve.read(HI)  # a higher tier's read is never counted
    reserve.sampled(3.1)  # the oldest lowest-tier task waited the longest wait
    assert not reserve.holds()
    reserve.read(LO)
    reserve.sampled(0.0, waiting=4)  # more wait than the tier's three processes may take
    assert not reserve.holds()
    reserve.read(LO)
    reserve.sampled(math.inf)  # its queues could not be read
    assert not reserve.holds()
    reserve.read(LO)
    assert counted(reserve) == {"reserve:let_go_age": 1, "reserve:let_go_backlog": 1,
                                "reserve:let_go_unread": 1}


def test_a_lowest_tier_read_while_a_long_run_may_start_is_not_counted(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    reserve.read(HI)
    held.extend(request(LO) for _ in range(2))  # two long runs: a third may start
    assert not reserve.holds() and not reserve.capped and not reserve.overdue()
    reserve.read(LO)
    assert counted(reserve) == {}


def test_a_lowest_tier_at_its_share_of_processes_is_not_read_first(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 1.0)
    ops = MemoryQueueOps()
    ops.queues[LO].append((time.time() - 2.0, "long"))
    ReserveSampler(None, reserve, ops).sample()
    assert not reserve.holds()  # the reserve lets go: the kept process may take it...
    assert not reserve.overdue()  # ...but the tier does not go before the short work


def test_the_sampler_reads_the_oldest_task_only_of_queues_that_hold_one(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 1.0)
    ops = MemoryQueueOps()
    asked = []
    read = ops.oldest_ages
    ops.oldest_ages = lambda queues, now: asked.append(list(queues)) or read(queues, now)
    sampler = ReserveSampler(None, reserve, ops)
    sampler.queues = [LO, "aitp.b.cpu.lo"]
    sampler.sample()
    assert asked == [] and reserve.oldest_wait_s == 0.0  # every queue empty: one call
    ops.queues[LO].append((time.time() - 2.0, "long"))
    sampler.sample()
    assert asked == [[LO]] and reserve.oldest_wait_s >= 2.0


def test_a_broker_that_cannot_be_read_puts_no_tier_first(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    reserve.sampled(math.inf)
    assert not reserve.overdue()


def test_an_idle_worker_does_not_watch_the_lowest_tier(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    reserve.read(HI)
    clock.now += 1.6  # no higher-tier read for more than a max wait
    reserve.holds()
    assert not reserve.watching


def test_the_sampler_reads_nothing_while_the_reserve_does_not_hold(setup):
    reserve, held, clock = setup

    class Refusing:
        def depths(self, queues):
            raise AssertionError("read while not watching")

    reserve.sampled(9.0)
    ReserveSampler(None, reserve, Refusing()).sample()
    assert reserve.oldest_wait_s == 0.0


def test_a_broker_that_cannot_be_read_makes_the_reserve_let_go_with_one_warning(setup, caplog):
    reserve, held, clock = setup
    capped(reserve, held, clock, 2.0)

    class Down:
        def depths(self, queues):
            raise ConnectionError("redis is down")

    sampler = ReserveSampler(None, reserve, Down())
    with caplog.at_level(logging.WARNING, logger="celery_aitp.worker.reserve"):
        sampler.tick()
        sampler.tick()
    assert not reserve.holds() and reserve.capped
    assert [r.getMessage() for r in caplog.records].count(
        "aitp: reserve lets go until the lowest tier's queues can be read again: "
        "ConnectionError('redis is down')") == 1
    sampler._ops = MemoryQueueOps()  # the broker is back: the next sample holds again
    sampler.tick()
    assert reserve.holds() and not sampler.failing


def test_the_mean_lowest_tier_run_follows_recent_runs(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    for _ in range(50):
        time_one_lowest_run(reserve, held, clock, 0.2)
    assert reserve.mean_runtime_s == pytest.approx(0.2, abs=0.01)


def test_the_first_lowest_tier_runs_weigh_alike(setup):
    """One long first run does not set the starvation bound for the next twenty (placement
    benchmark, pareto: a worker's first lowest-tier run of 1.8 s, then runs of 0.5 s)."""
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.8)
    assert reserve.max_wait_s == pytest.approx(1.5 * 1.8)
    time_one_lowest_run(reserve, held, clock, 0.6)
    time_one_lowest_run(reserve, held, clock, 0.6)
    assert reserve.mean_runtime_s == pytest.approx(1.0)  # an exponential average: 1.6


def test_a_new_worker_bounds_the_wait_by_the_fleets_mean_run_until_it_timed_its_own(setup):
    """A new worker has timed no lowest-tier run: the fleet's mean (the usage source's
    ``tier_runtime``) counts until it has, so it keeps a process and ages the lowest
    tier from its first read; its own runs then replace it."""
    reserve, held, clock = setup
    held.extend(request(LO) for _ in range(3))
    reserve.read(HI)
    assert reserve.max_wait_s == math.inf and not reserve.holds()  # nothing known
    reserve.follow_fleet({"cpu.lo": 2.0, "cpu.hi": 0.1, "gpu.lo": 9.0},
                         {LO: "cpu.lo", HI: "cpu.hi"})
    assert reserve.max_wait_s == pytest.approx(1.5 * 2.0)
    assert reserve.holds()  # three long runs: the fourth process is kept at once
    reserve.sampled(3.1, 1)
    assert not reserve.holds()  # the fleet's bound lets the oldest one go
    clock.now += 0.4
    held.clear()
    reserve.holds()
    assert reserve.max_wait_s == pytest.approx(1.5 * 0.4)  # its own runs win
    reserve.follow_fleet({}, {LO: "cpu.lo"})
    assert reserve.fleet_runtime_s is None and reserve.max_wait_s == pytest.approx(0.6)
    for bad in (math.inf, math.nan, -1.0, 0.0):  # written by anyone who can write the store
        reserve.follow_fleet({"cpu.lo": bad}, {LO: "cpu.lo"})
        assert reserve.fleet_runtime_s is None, bad


def test_a_run_is_timed_from_celerys_start_time_when_the_request_has_one(setup):
    reserve, held, clock = setup
    run = SimpleNamespace(delivery_info={"routing_key": LO}, time_start=time.time() - 0.5)
    held.append(run)
    reserve.holds()  # first seen half a second after it started
    clock.now += 1.0
    held.remove(run)
    reserve.holds()
    assert reserve.mean_runtime_s == pytest.approx(1.5, abs=0.05)


def test_other_queues_runs_are_not_counted_as_lowest_tier_runs(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    reserve.read(HI)
    held.extend([request(LO), request(LO), request(HI), request("celery")])
    assert not reserve.holds()


def test_a_higher_tier_run_as_long_as_the_mean_lowest_tier_run_counts_as_long_work(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)
    reserve.read(HI)
    mispredicted = request(HI)
    held.extend([request(LO), request(LO), mispredicted])
    assert not reserve.holds()  # two long runs and a fresh short one: a third may start
    clock.now += 0.9
    reserve.read(HI)
    assert not reserve.holds()  # still shorter than the mean lowest-tier run
    clock.now += 0.2
    reserve.read(HI)
    assert reserve.holds()  # it has run as long as long work: the last process is kept
    held.remove(mispredicted)
    assert not reserve.holds()
    assert reserve.mean_runtime_s == pytest.approx(1.0)  # only lowest-tier runs time it


def test_the_reserve_lets_go_by_time_at_the_longest_wait_or_the_last_higher_read(setup):
    reserve, held, clock = setup
    assert reserve.lets_go_at(0.0) == math.inf  # no lowest-tier run timed yet
    capped(reserve, held, clock, 1.0)  # longest wait 1.5 s; hi read now
    read_at = clock.now
    assert reserve.lets_go_at(1.0) == pytest.approx(read_at + 0.5)  # the oldest task
    assert reserve.lets_go_at(0.0) == pytest.approx(read_at + 1.5)  # the last hi read
    clock.now = read_at + 1.5 + 1e-6
    assert not reserve.holds()


def test_lowest_tier_queues_include_the_lowest_tiers_lane():
    policy = parse_policy({"tenants": {"default": {}}, "tenant_classes": {"std": {}}})
    queues = ["aitp.std.cpu.hi", "aitp.std.cpu.lo", "aitp.std~over.cpu.mid",
              "aitp.std~over.cpu.lo", "celery"]
    assert lowest_tier_queues(policy, queues) == ["aitp.std.cpu.lo", "aitp.std~over.cpu.lo"]


def test_the_reserve_is_on_by_default_and_can_be_turned_off():
    assert parse_policy({"tenants": {"default": {}}}).reserve.processes == 1
    off = parse_policy({"tenants": {"default": {}}, "reserve": {"processes": 0}})
    assert off.reserve.processes == 0
    with pytest.raises(Exception, match="max_wait_runs"):
        parse_policy({"tenants": {"default": {}}, "reserve": {"max_wait_runs": 0}})


def worker_step(concurrency: int, strict: bool = True, store: Any = None,
                **policy: Any) -> tuple[Any, Any]:
    """An AITP worker step for tenant acme on a Redis broker (nothing connects)."""
    app = Celery("reserve", broker="redis://127.0.0.1:1/0")
    celery_aitp.install(app, policy={**TEST_POLICY, **policy},
                        store_url="redis://127.0.0.1:1/0", store=store)
    worker = SimpleNamespace(app=app, hostname="w@test", prefetch_multiplier=1,
                             concurrency=concurrency)
    step = AitpWorkerStep(worker, aitp_tenant=("acme",), aitp_strict=strict)
    return app, step


@pytest.fixture
def no_reserve_after():
    yield
    tier_cycle.set_reserve(None)
    tier_cycle.configure({}, 1.0)


def test_a_strict_redis_worker_with_four_processes_keeps_one(no_reserve_after):
    app, step = worker_step(4)
    reserve = tier_cycle._reserve
    assert reserve is step._reserve is not None
    assert reserve.counters is step.middleware.counters  # shipped with the worker's own
    assert reserve.limit == 3
    assert reserve.lowest == {"aitp.acme.cpu.lo"}
    assert app.conf.broker_transport_options["polling_interval"] == SAMPLE_S


@pytest.mark.parametrize("concurrency, strict, policy", [
    (2, True, {}),  # too few processes: one kept would halve the lowest tier's
    (4, False, {}),  # not strict: a reserved message already waits in each process
    (4, True, {"reserve": {"processes": 0}}),
    (4, True, {"tier_order": "strict"}),
])
def test_no_reserve_where_it_cannot_pay_off(no_reserve_after, concurrency, strict, policy):
    app, step = worker_step(concurrency, strict, **policy)
    assert tier_cycle._reserve is None and step._reserve is None
    assert "polling_interval" not in app.conf.broker_transport_options


def test_while_an_express_worker_runs_short_tasks_the_reserve_keeps_no_process(setup):
    reserve, held, clock = setup
    capped(reserve, held, clock, 1.0)
    assert reserve.holds()
    reserve.express_live = True
    assert not reserve.holds() and not reserve.capped
    assert counted(reserve) == {}  # nothing was kept, so nothing was let go
    reserve.express_live = False  # the express worker is gone: the process is kept again
    assert reserve.holds()


def test_beside_an_express_worker_the_lowest_tier_still_ages(setup):
    reserve, held, clock = setup
    time_one_lowest_run(reserve, held, clock, 1.0)  # max wait 1.5 s
    reserve.express_live = True
    held.append(request(LO))
    clock.now += 1.0
    reserve.read(HI)  # higher tiers are read; the lowest tier was not for a while
    assert not reserve.holds() and reserve.watching
    reserve.sampled(1.6)  # its oldest task waited past the longest wait
    assert not reserve.holds() and reserve.overdue()  # the next read offers it first


EXPRESS = {"express": True, "heartbeat": 1000.0, "queues": ["aitp.acme.cpu.hi",
                                                           "aitp.globex.cpu.hi"]}


@pytest.mark.parametrize("workers, covered", [
    ([EXPRESS], True),
    ([{**EXPRESS, "heartbeat": 900.0}], False),  # its advertisement expired
    ([{**EXPRESS, "express": False}], False),  # a regular worker reads the top tier too
    ([{**EXPRESS, "queues": ["aitp.globex.cpu.hi"]}], False),  # not this worker's tenants
    ([{**EXPRESS, "queues": ["aitp.globex.cpu.hi"]},
      {**EXPRESS, "queues": ["aitp.acme.cpu.hi"]}], True),  # two express workers together
    ([{**EXPRESS, "queues": "aitp.acme.cpu.hi"}, {"heartbeat": "x"}], False),  # malformed
])
def test_express_workers_cover_a_top_tier_only_live_and_whole(workers, covered):
    assert express_covers(workers, ["aitp.acme.cpu.hi"], now=1010.0, ttl_s=30.0) is covered
    assert not express_covers(workers, [], now=1010.0, ttl_s=30.0)


def test_a_worker_sees_an_express_worker_come_and_go(no_reserve_after, store, caplog):
    app, step = worker_step(4, store=store)
    assert step._reserve is not None and not step.plan.express
    step._follow_express()
    assert not step._reserve.express_live
    store.advertise("express@test", ["aitp.acme.cpu.hi"],
                    {"express": True, "tiers": ["hi"]}, 60)
    with caplog.at_level(logging.INFO, logger="celery_aitp.worker.bootstep"):
        step._follow_express()
    assert step._reserve.express_live
    assert "the reserve stands aside" in caplog.text
    store.withdraw("express@test")
    step._follow_express()
    assert not step._reserve.express_live


def test_a_worker_ahead_of_the_store_still_sees_a_live_express_worker(
        no_reserve_after, store, monkeypatch):
    """Heartbeats are the store server's time and judged by it: a worker whose clock ran
    60 s ahead saw every express worker as gone (its reserve never stood aside)."""
    from celery_aitp.store import redis_store
    from celery_aitp.worker import bootstep

    app, step = worker_step(4, store=store)
    store.advertise("express@test", ["aitp.acme.cpu.hi"],
                    {"express": True, "tiers": ["hi"]}, 60)
    ahead = SimpleNamespace(time=lambda: time.time() + 60.0, monotonic=time.monotonic)
    monkeypatch.setattr(bootstep, "time", ahead, raising=False)  # this process's clock
    monkeypatch.setattr(redis_store, "time", ahead)
    step._follow_express()
    assert step._reserve.express_live


def test_an_express_worker_says_so_when_it_advertises(no_reserve_after, store):
    app = Celery("reserve", broker="redis://127.0.0.1:1/0")
    celery_aitp.install(app, policy=TEST_POLICY, store_url="redis://127.0.0.1:1/0",
                        store=store)
    worker = SimpleNamespace(app=app, hostname="x@test", prefetch_multiplier=1, concurrency=1)
    step = AitpWorkerStep(worker, aitp_tenant=("acme",), aitp_express=True)
    assert step._reserve is None  # one tier: nothing below to keep a process from
    step.advertise()
    (doc,) = store.workers()
    assert doc["express"] is True and doc["tiers"] == ["hi"] and not doc["default_queue"]
    assert doc["queues"] == ["aitp.acme.cpu.hi"]
