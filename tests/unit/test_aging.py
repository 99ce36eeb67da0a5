"""RabbitMQ aging (worker/aging.py): promotion ages, the selection logic and its bound.

The broker is a fake priority queue with RabbitMQ's delivery order (highest priority,
then FIFO); the bound is checked on a virtual clock with a worker that always has a
top-tier backlog to serve.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from celery_aitp.errors import PolicyError
from celery_aitp.layout import layout_for
from celery_aitp.policy import parse_policy
from celery_aitp.telemetry.counters import Counters
from celery_aitp.worker import aging

POLICY = {
    "tiers": [{"name": "hi", "sla_s": 5}, {"name": "mid", "sla_s": 60},
              {"name": "lo", "sla_s": 600}],
    "tenants": {"acme": {}, "capped": {"max_tier": "mid"}},
    "default_tenant": "acme",
    "accelerators": ["cpu"],
}
HI, MID, LO = 10, 9, 8  # the RabbitMQ layout's priorities of the three tiers


def header(origin: Any) -> dict[str, Any]:
    return {"aitp": {"tier": "lo", "origin_at": origin, "decided_at": origin}}


class FakeQueue:
    """Messages in RabbitMQ's delivery order: priority descending, then FIFO."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.items: list[tuple[int, int, str, dict[str, Any]]] = []

    def publish(self, name: str, priority: int, origin: float) -> None:
        self.items.append((priority, next(self.seq), name, header(origin)))

    def ordered(self) -> list[tuple[int, int, str, dict[str, Any]]]:
        return sorted(self.items, key=lambda m: (-m[0], m[1]))

    def get(self) -> tuple[int, str] | None:
        if not self.items:
            return None
        first = self.ordered()[0]
        self.items.remove(first)
        return first[0], first[2]


class FakeOps:
    """``reprioritise`` over FakeQueues: promoted messages go to the back of their level."""

    def __init__(self, queues: dict[str, FakeQueue]) -> None:
        self.queues = queues
        self.calls: list[tuple[str, int]] = []

    def reprioritise(self, queue: str, selector: aging.Selector, limit: int) -> tuple[int, int]:
        self.calls.append((queue, limit))
        fake = self.queues.get(queue)
        if fake is None:
            return 0, 0
        chosen = []
        inspected = 0
        for item in fake.ordered()[:limit]:
            inspected += 1
            new = selector.decide(item[0], item[3])
            if new is not None:
                chosen.append((item, new))
            if selector.done:
                break
        for item, new in chosen:
            fake.items.remove(item)
            fake.items.append((new, next(fake.seq), item[2], item[3]))
        return inspected, len(chosen)


class FakeStore:
    class keys:  # noqa: N801 - mimics the store's attribute
        aging_lock = "lock:aging"


class FakeMiddleware:
    def __init__(self, policy: dict[str, Any]) -> None:
        self.policy = parse_policy(policy)
        self.layout = layout_for("amqp", self.policy.tier_names)
        self.counters = Counters()
        self.store = FakeStore()


def selector_for(tenant: str = "acme", now: float = 1000.0,
                 policy: dict[str, Any] = POLICY) -> aging.Selector:
    middleware = FakeMiddleware(policy)
    return aging.AgingPlan(middleware.policy, middleware.layout).selector(
        f"aitp.{tenant}.cpu", now)


def two_tiers(tiers: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(POLICY, tiers=tiers, tenants={"acme": {}})


# --- promotion ages --------------------------------------------------------------------


def test_default_promotion_ages_come_from_slas_and_weights() -> None:
    # min(sla_hi * w_hi / w_t, max(sla_t - sla_hi, sla_t / 2)) with weights 64:8:1
    assert parse_policy(POLICY).promotion_ages() == {"mid": 40.0, "lo": 320.0}
    tight = two_tiers([{"name": "hi", "sla_s": 5}, {"name": "lo", "sla_s": 8}])
    assert parse_policy(tight).promotion_ages() == {"lo": 4.0}  # sla_t / 2 wins


def test_explicit_promotion_age_wins_and_is_validated() -> None:
    tiers = [{"name": "hi", "sla_s": 5}, {"name": "lo", "sla_s": 600, "promote_after_s": 3}]
    assert parse_policy(two_tiers(tiers)).promotion_ages() == {"lo": 3}
    bad_top = [{"name": "hi", "sla_s": 5, "promote_after_s": 1}, {"name": "lo", "sla_s": 60}]
    with pytest.raises(PolicyError, match="top tier is never promoted"):
        parse_policy(two_tiers(bad_top))
    zero = [{"name": "hi", "sla_s": 5}, {"name": "lo", "sla_s": 60, "promote_after_s": 0}]
    with pytest.raises(PolicyError, match=r"tiers\.1\.promote_after_s"):
        parse_policy(two_tiers(zero))
    with pytest.raises(PolicyError, match=r"aging\.max_inspect"):
        parse_policy(dict(POLICY, aging={"max_inspect": 0}))


def test_aging_runs_only_on_rabbitmq_with_the_weighted_order() -> None:
    policy = parse_policy(POLICY)
    assert aging.enabled(policy, "amqp")
    assert not aging.enabled(policy, "redis")
    assert not aging.enabled(parse_policy(dict(POLICY, tier_order="strict")), "amqp")


# --- selection -------------------------------------------------------------------------


def test_aged_lower_tiers_go_to_the_top_young_ones_and_the_top_stay() -> None:
    s = selector_for(now=1000.0)
    assert s.decide(HI, header(1.0)) is None  # already at the top
    assert s.decide(MID, header(1000.0 - 40.0)) == HI
    assert s.decide(MID, header(1000.0 - 39.0)) is None
    assert not s.done  # younger mid messages say nothing about the lo level
    assert s.decide(LO, header(1000.0 - 320.0)) == HI
    assert s.decide(LO, header(1000.0 - 10.0)) is None
    assert s.done  # later lo messages are younger (FIFO): the pass can stop


def test_promotion_never_goes_above_the_tenants_max_tier() -> None:
    s = selector_for("capped")
    assert s.decide(LO, header(1.0)) == MID
    assert s.decide(MID, header(1.0)) is None


def test_messages_without_a_usable_first_publish_time_stay_and_are_counted() -> None:
    s = selector_for()
    for headers in (None, {}, {"aitp": "x"}, {"aitp": {}}, header("1.0"), header(float("nan")),
                    header(-5.0), header(True)):
        assert s.decide(LO, headers) is None
    assert s.no_age == 8
    assert not s.done
    # origin_at wins over decided_at (a retry keeps its first publish time)
    both = {"aitp": {"origin_at": 1.0, "decided_at": 999.0}}
    assert s.decide(LO, both) == HI


def test_unknown_priorities_count_as_the_lowest_tier() -> None:
    s = selector_for()
    assert s.decide(None, header(1.0)) == HI
    assert s.decide(0, header(999.0)) is None
    assert s.done


def test_a_single_tier_policy_promotes_nothing() -> None:
    s = selector_for(policy=dict(POLICY, tiers=[{"name": "hi", "sla_s": 5}],
                                 tenants={"acme": {}}))
    assert s.decide(HI, header(1.0)) is None
    assert s.decide(0, header(1.0)) is None


# --- the pass --------------------------------------------------------------------------


def test_a_pass_promotes_counts_and_respects_the_inspection_limit() -> None:
    policy = dict(POLICY, aging={"max_inspect": 3})
    middleware = FakeMiddleware(policy)
    queue = FakeQueue()
    for i in range(3):
        queue.publish(f"hi{i}", HI, 999.0)
    queue.publish("old-lo", LO, 1.0)
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    assert ager.sweep(now=1000.0) == {}  # three hi messages ahead: out of reach
    assert ("aitp.acme.cpu", 3) in ops.calls and ("aitp.capped.cpu", 3) in ops.calls
    queue.get()  # one hi message served: now it is within the first three
    assert ager.sweep(now=1000.0) == {"aitp.acme.cpu": 1}
    assert [m[2] for m in queue.ordered()] == ["hi1", "hi2", "old-lo"]
    assert queue.ordered()[-1][0] == HI
    totals = middleware.counters.totals
    assert totals["aged"] == 1 and totals["aging_inspected"] == 6
    assert ager.sweep(now=1000.0) == {}  # promoted once, never again


def test_no_message_is_lost_or_duplicated_by_passes() -> None:
    middleware = FakeMiddleware(POLICY)
    queue = FakeQueue()
    for i in range(50):
        queue.publish(f"m{i}", (HI, MID, LO)[i % 3], 1000.0 - 10 * (50 - i))
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    for now in (1000.0, 1100.0, 1400.0):
        ager.sweep(now=now)
    names = sorted(m[2] for m in queue.items)
    assert names == sorted(f"m{i}" for i in range(50))


# --- the bound -------------------------------------------------------------------------


def simulate(promote: bool, backlog: int, horizon_s: float) -> tuple[float | None, int]:
    """One worker process, top-tier runs of 1 s and always ``backlog`` top-tier messages
    waiting; one lo message published at t=0.5. Returns (lo wait, most top-priority
    messages ahead of it when promoted)."""
    policy = dict(POLICY, tiers=[{"name": "hi", "sla_s": 5}, {"name": "mid", "sla_s": 60},
                                 {"name": "lo", "sla_s": 600, "promote_after_s": 7.0}],
                  aging={"interval_s": 2.0, "max_inspect": 50})
    middleware = FakeMiddleware(policy)
    queue = FakeQueue()
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    runtime, interval = 1.0, 2.0
    published_lo = 0.5
    lo_in_queue = False
    ahead_at_promotion = 0
    next_pass = interval
    t = 0.0
    while t < horizon_s:
        while sum(1 for m in queue.items if m[2] != "lo") < backlog:
            queue.publish("hi", HI, t)
        if not lo_in_queue and t >= published_lo:
            queue.publish("lo", LO, published_lo)
            lo_in_queue = True
        if promote and t >= next_pass:
            ahead = sum(1 for m in queue.items if m[0] == HI)
            if ager.sweep(now=t):
                ahead_at_promotion = ahead
            next_pass += interval
        got = queue.get()
        if got is not None and got[1] == "lo":
            return t - published_lo, ahead_at_promotion
        t += runtime if got is not None else 0.25
    return None, ahead_at_promotion


def test_a_low_tier_task_runs_within_the_bound_under_a_continuous_top_tier_stream() -> None:
    wait, ahead = simulate(promote=True, backlog=4, horizon_s=200)
    assert wait is not None
    assert ahead >= 4  # it really had to overtake a top-tier backlog
    bound = aging.longest_wait_s(7.0, 2.0, ahead, processes=1, max_runtime_s=1.0)
    assert wait <= bound
    assert bound == 7.0 + 2.0 + math.ceil((ahead + 1) / 1) * 1.0


def test_without_aging_the_same_stream_starves_the_low_tier() -> None:
    wait, _ = simulate(promote=False, backlog=4, horizon_s=200)
    assert wait is None


def test_a_queue_is_only_taken_from_when_a_message_in_it_may_be_due() -> None:
    middleware = FakeMiddleware(POLICY)  # promotion ages: mid 40 s, lo 320 s
    queue = FakeQueue()
    queue.publish("young-lo", LO, 990.0)
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    ager.sweep(now=1000.0)
    assert ager.next_due["aitp.acme.cpu"] == 1040.0  # a mid published now: due at 1040
    ops.calls.clear()
    ager.sweep(now=1039.0)
    assert ops.calls == []  # nothing can be due yet: no queue is touched
    ager.sweep(now=1040.0)
    assert ("aitp.acme.cpu", 200) in ops.calls
    queue.publish("older-mid", MID, 1001.0)
    ager.next_due.clear()
    ager.sweep(now=1040.0)
    assert ager.next_due["aitp.acme.cpu"] == 1041.0  # the mid left in place turns due
    assert ager.sweep(now=1041.0) == {"aitp.acme.cpu": 1}


def test_every_worker_runs_aging_on_rabbitmq_and_none_on_redis(app) -> None:
    from types import SimpleNamespace

    from celery_aitp.worker.bootstep import AitpWorkerStep

    worker = SimpleNamespace(app=app, hostname="w@test")
    step = AitpWorkerStep(worker)
    step.runs_aitp = True  # the unit store is given directly, not by URL
    step.start(worker)
    assert "aitp-janitor" in [t.name for t in step._threads]
    assert "aitp-aging" not in [t.name for t in step._threads]  # memory:// (like Redis)
    step.stop(worker)
    app.aitp.broker_driver = "amqp"
    step = AitpWorkerStep(worker)
    step.runs_aitp = True
    step.start(worker)
    assert "aitp-aging" in [t.name for t in step._threads]
    step.stop(worker)


def test_the_loop_takes_the_store_lock_and_runs_passes(app, store) -> None:
    import threading
    import time

    app.aitp.broker_driver = "amqp"
    middleware = app.aitp
    queue = FakeQueue()
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    stop = threading.Event()
    thread = threading.Thread(target=ager.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not ops.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(10)
    assert ops.calls  # a pass ran
    assert store.client.get(store.keys.aging_lock) == ager.owner.encode()


# --- celery aitp age ---------------------------------------------------------------------


def _age_cli(app: Any) -> Any:
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_aitp.cli.celery_command import aitp

    return CliRunner().invoke(aitp, ["age"], obj=SimpleNamespace(app=app))


def _fake_broker(app: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeOps, FakeQueue, int]:
    """The app on a RabbitMQ driver whose queues are fakes; one old lo message waiting."""
    from celery_aitp.queues import tier_queue_name

    mw = app.aitp
    monkeypatch.setattr(mw, "broker_driver", "amqp")
    monkeypatch.delitem(mw.__dict__, "layout", raising=False)  # rebuilt for RabbitMQ
    # acme may use every tier, so its lowest tier has somewhere to go
    tenant, accelerator = "acme", mw.policy.default_accelerator
    queue = FakeQueue()
    lowest = tier_queue_name(tenant, accelerator, mw.policy.tier_names[-1])
    queue.publish("old-lo", mw.layout.priority(lowest), 1.0)
    ops = FakeOps({mw.layout.physical(lowest): queue})
    original = aging.Ager
    monkeypatch.setattr(aging, "Ager", lambda middleware: original(middleware, ops))
    top = tier_queue_name(tenant, accelerator, mw.policy.allowed_tiers(tenant)[0])
    return ops, queue, mw.layout.priority(top)


def test_age_command_runs_one_pass_now_and_gives_the_lock_back(app, store,
                                                               monkeypatch) -> None:
    ops, queue, top = _fake_broker(app, monkeypatch)
    result = _age_cli(app)
    assert result.exit_code == 0, result.output
    assert "promoted 1 message(s)" in result.output, (ops.calls, queue.items)
    assert queue.ordered()[0][0] == top  # the old lo message now has the top priority
    assert store.client.get(store.keys.aging_lock) is None  # released for the workers
    assert app.aitp.counters.totals["aged"] == 1


def _short_interval(app: Any, interval_s: float) -> None:
    mw = app.aitp
    policy = mw.policy.model_copy(update={"aging": mw.policy.aging.model_copy(
        update={"interval_s": interval_s})})
    mw.__dict__["settings"] = mw.settings.model_copy(update={"policy": policy})


def test_age_command_waits_out_a_workers_pass_but_never_runs_beside_one(
        app, store, monkeypatch) -> None:
    """A worker holds the lock for most of each interval: the command waits up to one
    interval for it (it failed nearly every time while workers ran)."""
    ops, queue, top = _fake_broker(app, monkeypatch)
    _short_interval(app, 0.3)
    store.try_lock(store.keys.aging_lock, 30, "worker-1:42")
    result = _age_cli(app)
    assert result.exit_code != 0
    assert "held the lock" in result.output
    assert ops.calls == []  # no pass ran beside the other one
    assert store.client.get(store.keys.aging_lock) == b"worker-1:42"  # not taken away
    store.client.pexpire(store.keys.aging_lock, 300)  # the worker's pass ends soon
    result = _age_cli(app)
    assert result.exit_code == 0, result.output
    assert "promoted 1 message(s)" in result.output


def test_running_workers_follow_a_live_change_of_the_ages() -> None:
    """``policy apply`` may change a tier's promote_after_s: the plan was made once."""
    middleware = FakeMiddleware(POLICY)
    queue = FakeQueue()
    queue.publish("old-lo", LO, 1000.0 - 100.0)
    ops = FakeOps({"aitp.acme.cpu": queue})
    ager = aging.Ager(middleware, ops)
    assert ager.sweep(now=1000.0) == {}  # 100 s is young for lo with the derived ages
    tiers = [{"name": "hi", "sla_s": 5}, {"name": "mid", "sla_s": 60},
             {"name": "lo", "sla_s": 600, "promote_after_s": 8.0}]
    middleware.policy = parse_policy(dict(POLICY, tiers=tiers))
    assert ager.sweep(now=1000.0) == {"aitp.acme.cpu": 1}


def test_age_command_refuses_brokers_without_aging(app) -> None:
    result = _age_cli(app)  # the unit app's broker is memory://, like Redis
    assert result.exit_code != 0
    assert "RabbitMQ" in result.output and "'memory'" in result.output


def test_a_lock_is_released_only_by_its_owner(store) -> None:
    key = store.keys.aging_lock
    assert store.try_lock(key, 30, "a")
    assert not store.release_lock(key, "b")
    assert store.client.get(key) == b"a"
    assert store.release_lock(key, "a")
    assert store.client.get(key) is None
