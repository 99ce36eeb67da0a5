"""Celery's semantics through celery_aitp: one contract, every broker, every stage.

Each test states what Celery does (a result, an error, where a message is delivered)
and runs on Redis and RabbitMQ, for plain Celery (``plain``: the same tasks on an app
without celery_aitp, which proves the expectation is Celery's own) and for an app with
celery_aitp in each migration stage. Workers start once per broker (module-scoped
fixture); the stage is flipped at run time through the shared store, as in production.

Workers: plain Celery's own; and for the app with celery_aitp, an AITP worker serving
tenant ``acme`` (``--aitp-no-default-queue``) next to a standard worker (default queue
and an extra queue), so every task's delivery says which side ran it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import chain, chord, group
from celery.canvas import StampingVisitor
from celery.exceptions import (
    ChordError,
    MaxRetriesExceededError,
    TaskRevokedError,
    TimeLimitExceeded,
    WorkerLostError,
)
from celery.result import AsyncResult

from tests.apps.compat import create_app
from tests.conftest import cleanup_deployment, deployment_env
from tests.support.services import amqp_url
from tests.support.workers import WorkerProcess, stop_all

pytestmark = [pytest.mark.slow,
              # compat.prioritized sets Celery's deprecated (still working) task attribute
              pytest.mark.filterwarnings("ignore:.*'priority' task attribute")]

TENANT = {"aitp_tenant": "acme"}
STAGES = ("plain", "coexistence", "split", "takeover")
APP = "tests.apps.compat"


class Fleet:
    """Producers and workers of one broker: a plain deployment and an AITP one."""

    def __init__(self, broker: str, redis_url: str) -> None:
        self.broker = broker
        self.redis_url = redis_url
        self.tags = {"plain": uuid.uuid4().hex[:8], "aitp": uuid.uuid4().hex[:8]}
        self.envs = {kind: deployment_env(broker, redis_url, tag)
                     for kind, tag in self.tags.items()}
        self.envs["plain"]["AITP_TEST_PLAIN"] = "1"
        for env in self.envs.values():
            env["AITP_TEST_MARKS"] = redis_url
        self.apps = {kind: create_app(env) for kind, env in self.envs.items()}
        self.workers: list[WorkerProcess] = []

    def extra_queue(self, kind: str) -> str:
        return f"{self.envs[kind]['AITP_TEST_QUEUE']}.extra"

    def start(self) -> Fleet:
        for kind, name, args in (
            ("plain", "plain", ["-Q", self._queues("plain")]),
            ("aitp", "std", ["-Q", self._queues("aitp")]),
            ("aitp", "acme", ["--aitp-tenant", "acme", "--aitp-no-default-queue"]),
        ):
            worker = WorkerProcess(f"{name}-{self.tags[kind]}", args, self.envs[kind], app=APP)
            self.workers.append(worker)
            worker.start()
        self._wait_advertised("aitp.acme.cpu.hi")
        return self

    def _queues(self, kind: str) -> str:
        return f"{self.envs[kind]['AITP_TEST_QUEUE']},{self.extra_queue(kind)}"

    def _wait_advertised(self, queue: str, timeout: float = 15) -> None:
        store = self.apps["aitp"].aitp.store
        deadline = time.monotonic() + timeout
        while queue not in store.live_queues():
            if time.monotonic() > deadline:
                raise AssertionError(f"{queue} never advertised")
            time.sleep(0.1)

    def stop(self) -> None:
        stop_all(self.workers)
        self.apps["aitp"].aitp.close()
        for kind, env in self.envs.items():
            cleanup_deployment(env, self.redis_url, self.tags[kind], (self.extra_queue(kind),))


class Env:
    """What one test sees: the producing app, its stage and how to read deliveries."""

    def __init__(self, fleet: Fleet, stage: str) -> None:
        self.fleet = fleet
        self.stage = stage
        self.plain = stage == "plain"
        kind = "plain" if self.plain else "aitp"
        self.app = fleet.apps[kind]
        self.default_queue = fleet.envs[kind]["AITP_TEST_QUEUE"]
        self.extra_queue = fleet.extra_queue(kind)
        self.marks = self.app.marks

    def task(self, name: str) -> Any:
        return self.app.tasks[f"compat.{name}"]

    def physical(self, logical: str) -> str:
        """The broker queue a task routed to ``logical`` is delivered from."""
        return logical if self.fleet.broker == "redis" else logical.rsplit(".", 1)[0]

    def check(self, info: dict[str, Any], logical: str | None) -> None:
        """Assert one delivery is what this stage promises for a task of tenant acme.

        ``logical`` is the tier queue the decision names (None: the caller chose the
        queue, so nothing may be routed).
        """
        header = info["aitp"]
        if self.plain:
            assert header is None
            assert info["queue"] in (self.default_queue, self.extra_queue)
            return
        assert header["stage"] == self.stage and header["tenant"] == "acme", info
        if logical is None:
            assert header["routed"] is False and header["reason"] == "explicit_queue", info
            return
        assert header["queue"] == logical, info
        routed = (header.get("arm") == "routed" if self.stage == "split"
                  else self.stage == "takeover")
        assert header["routed"] is routed, info
        assert header["reason"] == ("routed" if routed else {
            "coexistence": "shadow", "split": "split_standard_arm"}[self.stage]), info
        assert info["queue"] == (self.physical(logical) if routed else self.default_queue), info
        assert info["hostname"].startswith("acme-" if routed else "std-"), info


class Fleets:
    """At most one running fleet: tests are ordered broker by broker, stage by stage."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.running: Fleet | None = None

    def get(self, broker: str) -> Fleet:
        if self.running is None or self.running.broker != broker:
            self.close()
            fleet = Fleet(broker, self.redis_url)
            self.running = fleet
            fleet.start()
        return self.running

    def close(self) -> None:
        if self.running is not None:
            fleet, self.running = self.running, None
            fleet.stop()


@pytest.fixture(scope="module")
def fleets(redis_url: str) -> Iterator[Fleets]:
    pool = Fleets(redis_url)
    yield pool
    pool.close()


COMBOS = [pytest.param((broker, stage), id=f"{broker}-{stage}",
                       marks=getattr(pytest.mark, broker))
          for broker in ("redis", "rabbitmq") for stage in STAGES]


@pytest.fixture(scope="module", params=COMBOS)
def env(request: pytest.FixtureRequest, fleets: Fleets) -> Env:
    broker, stage = request.param
    if broker == "rabbitmq":
        amqp_url()  # fails loudly in CI, skips elsewhere, if RabbitMQ is down
    current = Env(fleets.get(broker), stage)
    if not current.plain:
        set_stage(current, stage)
    return current


def set_stage(env: Env, stage: str, timeout: float = 15) -> None:
    """Write the stage to the store; return once producer and workers decide with it."""
    mw = env.app.aitp
    mw.store.write_stage({"stage": stage, "split": {"percent": 50}}, who="compat-suite")
    mw.live.refresh()
    # every process refreshes every 0.5 s: after two periods all have read the new stage
    # (a probe alone may miss a pool process that ran none of its steps)
    time.sleep(1.2)
    deadline = time.monotonic() + timeout
    trace = env.task("trace")
    while time.monotonic() < deadline:
        probe = (trace.s([], "a") | trace.s("b") | trace.s("c") | trace.s("d"))
        steps = probe.apply_async(headers=TENANT).get(timeout=20)
        if all(step["aitp"]["stage"] == stage for step in steps):
            return
        time.sleep(0.2)
    raise AssertionError(f"workers never switched to {stage}")


# --- canvas -----------------------------------------------------------------------

def test_chain_result(env: Env) -> None:
    add = env.task("add")
    assert (add.s(1, 2) | add.s(3) | add.s(4)).apply_async(headers=TENANT).get(timeout=20) == 10


def test_chain_steps_are_decided_in_the_worker(env: Env) -> None:
    trace = env.task("trace")
    steps = (trace.s([], "a") | trace.s("b") | trace.s("c")).apply_async(
        headers=TENANT).get(timeout=20)
    assert [s["label"] for s in steps] == ["a", "b", "c"]
    for step in steps:
        env.check(step, "aitp.acme.cpu.lo")
    if not env.plain:  # steps b and c were decided after the step before them ran
        for before, after in zip(steps, steps[1:], strict=False):
            assert after["aitp"]["decided_at"] >= before["started_at"]


def test_group_results_and_members_are_decided(env: Env) -> None:
    add, trace = env.task("add"), env.task("trace")
    assert group(add.s(i, i) for i in range(5)).apply_async(headers=TENANT).get(
        timeout=20) == [0, 2, 4, 6, 8]
    members = group(trace.s([], str(i)) for i in range(3)).apply_async(
        headers=TENANT).get(timeout=20)
    for (member,) in members:
        env.check(member, "aitp.acme.cpu.lo")


def test_chord_result_and_body_decided_in_the_worker(env: Env) -> None:
    add, tsum, trace = env.task("add"), env.task("tsum"), env.task("trace")
    assert chord([add.s(i, i) for i in range(5)], tsum.s()).apply_async(
        headers=TENANT).get(timeout=20) == 20
    *members, body = chord([trace.s([], "m0"), trace.s([], "m1")], trace.s("body")).apply_async(
        headers=TENANT).get(timeout=20)
    assert body["label"] == "body" and [m[0]["label"] for m in members] == ["m0", "m1"]
    env.check(body, "aitp.acme.cpu.lo")
    if not env.plain:
        assert body["aitp"]["decided_at"] >= max(m[0]["started_at"] for m in members)


def test_chord_with_a_failing_member(env: Env) -> None:
    add, fail, tsum = env.task("add"), env.task("fail"), env.task("tsum")
    result = chord([add.s(1, 1), fail.s(2)], tsum.s()).apply_async(headers=TENANT)
    with pytest.raises(ValueError, match="boom 2"):  # get() re-raises the member's error
        result.get(timeout=20)
    deadline = time.monotonic() + 20
    while result.state != "FAILURE":  # and the body fails with a ChordError naming it
        assert time.monotonic() < deadline, result.state
        time.sleep(0.05)
    assert isinstance(result.result, ChordError) and "boom 2" in str(result.result)


def test_chord_inside_a_chain(env: Env) -> None:
    add, tsum = env.task("add"), env.task("tsum")
    flow = chain(add.s(1, 1), chord([add.s(1), add.s(2)], tsum.s()), add.s(10))
    assert flow.apply_async(headers=TENANT).get(timeout=20) == 17  # 2 -> [3, 4] -> 7 -> 17


# --- retries, ETA, expiry, revoke -------------------------------------------------

def test_retry_with_countdown_stays_on_its_queue(env: Env) -> None:
    attempts = env.task("retrying").apply_async((2,), headers=TENANT).get(timeout=30)
    assert [a["retries"] for a in attempts] == [0, 1, 2]
    assert len({a["queue"] for a in attempts}) == 1  # every attempt on the first one's queue
    env.check(attempts[0], "aitp.acme.cpu.lo")
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert after["started_at"] - before["started_at"] >= 0.25  # countdown=0.3 honoured
        if not env.plain:  # the retry is re-decided in the worker and keeps its queue
            assert after["aitp"]["reason"] == "explicit_queue"


def test_countdown_and_eta_tasks_are_routed(env: Env) -> None:
    where = env.task("where")
    published = time.time()
    by_countdown = where.apply_async((1,), headers=TENANT, countdown=1)
    by_eta = where.apply_async((2,), headers=TENANT,
                               eta=datetime.now(timezone.utc) + timedelta(seconds=1))
    for info in (by_countdown.get(timeout=20), by_eta.get(timeout=20)):
        assert info["started_at"] - published >= 0.9
        env.check(info, "aitp.acme.cpu.hi")


def test_expired_task_is_revoked(env: Env) -> None:
    result = env.task("add").apply_async((1, 1), headers=TENANT, countdown=1, expires=0.3)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert result.state == "REVOKED"


def test_revoked_task_does_not_run(env: Env) -> None:
    name = f"revoked-{uuid.uuid4().hex[:6]}"
    result = env.task("mark").apply_async((name,), headers=TENANT, countdown=1.5)
    result.revoke()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert env.marks.get(name) == 0


# --- limits -----------------------------------------------------------------------

def test_rate_limit_spaces_runs_on_each_worker(env: Env) -> None:
    rate_limited = env.task("rate_limited")
    runs = [r.get(timeout=30) for r in
            [rate_limited.apply_async((i,), headers=TENANT) for i in range(5)]]
    assert sorted(r["i"] for r in runs) == list(range(5))
    by_worker: dict[str, list[float]] = {}
    for run in runs:
        by_worker.setdefault(run["hostname"], []).append(run["started_at"])
    for starts in by_worker.values():  # 4/s: one token every 0.25 s
        starts.sort()
        assert all(b - a >= 0.2 for a, b in zip(starts, starts[1:], strict=False)), starts


def test_time_limits(env: Env) -> None:
    assert env.task("soft_limited").apply_async(headers=TENANT).get(timeout=20) == "soft limit"
    with pytest.raises(TimeLimitExceeded):
        env.task("hard_limited").apply_async(headers=TENANT).get(timeout=20)


# --- how callers address tasks ----------------------------------------------------

def test_send_task_by_name(env: Env) -> None:
    info = env.app.send_task("compat.where", args=(7,), headers=TENANT).get(timeout=20)
    assert info["x"] == 7
    env.check(info, "aitp.acme.cpu.hi")  # the producer knows the task: its tier is used
    assert env.app.send_task("compat.add", args=(2, 3), headers=TENANT).get(timeout=20) == 5


def test_caller_queue_is_respected(env: Env) -> None:
    info = env.task("where").apply_async((1,), headers=TENANT, queue=env.extra_queue).get(
        timeout=20)
    assert info["queue"] == env.extra_queue
    env.check(info, None)


def test_caller_priority_reaches_the_task(env: Env) -> None:
    info = env.task("headers_seen").apply_async(headers=TENANT, priority=5).get(timeout=20)
    assert info["priority"] == 5  # as Celery delivers it, routed or not
    # Redis keeps it inside the tier queue; on RabbitMQ, where a tier queue's priority is
    # the tier, a priority of its own keeps Celery's route (publish/caller_priority.py)
    env.check(info, "aitp.acme.cpu.lo" if env.fleet.broker == "redis" else None)


def test_caller_headers_reach_the_task(env: Env) -> None:
    info = env.task("headers_seen").apply_async(
        headers={"x_custom": "kept", **TENANT}).get(timeout=20)
    assert info["x_custom"] == "kept" and info["aitp_tenant"] == "acme"


# --- results and acknowledgement ------------------------------------------------

def test_results_and_ignore_result(env: Env) -> None:
    assert env.task("add").apply_async((2, 3), headers=TENANT).get(timeout=20) == 5
    by_call, by_task = (f"quiet-{uuid.uuid4().hex[:6]}" for _ in range(2))
    quiet_call = env.task("mark").apply_async((by_call,), headers=TENANT, ignore_result=True)
    quiet_task = env.task("mark_quiet").apply_async((by_task,), headers=TENANT)
    deadline = time.monotonic() + 20
    while not (env.marks.get(by_call) and env.marks.get(by_task)):
        assert time.monotonic() < deadline, "the ignore_result tasks never ran"
        time.sleep(0.05)
    time.sleep(0.2)  # a stored result would be written right after the run
    for result in (quiet_call, quiet_task):
        assert AsyncResult(result.id, app=env.app).state == "PENDING"


def test_acks_late_with_reject_on_worker_lost_runs_again(env: Env) -> None:
    name = f"lost-{uuid.uuid4().hex[:6]}"
    result = env.task("lose_worker_once").apply_async((name,), headers=TENANT)
    assert result.get(timeout=40) == 2  # the first run killed its process; redelivered
    assert env.marks.get(name) == 2


# --- message priority (publish/caller_priority.py) --------------------------------

def priority_route(env: Env) -> str | None:
    """Where a task with a priority of its own is decided to go: inside its tier queue on
    Redis; Celery's route on RabbitMQ (None: as if the caller chose the queue)."""
    return "aitp.acme.cpu.lo" if env.fleet.broker == "redis" else None


def test_a_tasks_own_priority_reaches_it(env: Env) -> None:
    info = env.task("prioritized").apply_async(headers=TENANT).get(timeout=20)
    assert info["priority"] == 6
    env.check(info, priority_route(env))


def test_task_default_priority_reaches_the_task(env: Env) -> None:
    kind = "plain" if env.plain else "aitp"
    producer = create_app(env.fleet.envs[kind])  # configured before its tasks are bound
    producer.conf.task_default_priority = 4
    try:
        info = producer.tasks["compat.headers_seen"].apply_async(headers=TENANT).get(
            timeout=20)
    finally:
        if not env.plain:
            producer.aitp.close()
    assert info["priority"] == 4
    env.check(info, priority_route(env))


def test_chain_steps_keep_their_own_priorities(env: Env) -> None:
    trace = env.task("trace")
    steps = (trace.signature(([], "a"), priority=3) | trace.signature(("b",), priority=5)
             ).apply_async(headers=TENANT).get(timeout=20)
    assert [s["priority"] for s in steps] == [3, 5]
    for step in steps:
        env.check(step, priority_route(env))


def test_chord_members_and_body_keep_their_priorities(env: Env) -> None:
    trace = env.task("trace")
    *members, body = chord([trace.signature(([], "m"), priority=4)],
                           trace.signature(("body",), priority=6)).apply_async(
        headers=TENANT).get(timeout=20)
    assert [m[0]["priority"] for m in members] == [4] and body["priority"] == 6
    env.check(body, priority_route(env))


def test_a_retry_keeps_the_priority(env: Env) -> None:
    attempts = env.task("retrying").apply_async((1,), headers=TENANT, priority=7).get(
        timeout=30)
    assert [(a["retries"], a["priority"]) for a in attempts] == [(0, 7), (1, 7)]
    env.check(attempts[0], priority_route(env))


# --- destinations -------------------------------------------------------------------

def test_caller_exchange_and_routing_key_are_respected(env: Env) -> None:
    info = env.task("where").apply_async(
        (1,), headers=TENANT, exchange=env.extra_queue, routing_key=env.extra_queue).get(
        timeout=20)
    assert info["queue"] == env.extra_queue
    env.check(info, None)


def test_a_task_that_has_not_expired_runs(env: Env) -> None:
    info = env.task("where").apply_async((1,), headers=TENANT, expires=60).get(timeout=20)
    env.check(info, "aitp.acme.cpu.hi")


# --- limits and acknowledgement by call -------------------------------------------

def test_time_limits_given_by_the_caller(env: Env) -> None:
    soft = env.task("soft_probe").apply_async((3,), headers=TENANT, soft_time_limit=0.3)
    assert soft.get(timeout=20) == "soft limit"
    with pytest.raises(TimeLimitExceeded):
        env.task("sleeper").apply_async((3,), headers=TENANT, time_limit=0.5).get(timeout=20)


def test_acks_late_without_reject_on_worker_lost_fails_once(env: Env) -> None:
    name = f"unrejected-{uuid.uuid4().hex[:6]}"
    result = env.task("lose_worker_unrejected").apply_async((name,), headers=TENANT)
    with pytest.raises(WorkerLostError):
        result.get(timeout=40)
    time.sleep(0.5)  # a redelivery would run within this
    assert env.marks.get(name) == 1


def test_retries_stop_at_max_retries(env: Env) -> None:
    name = f"retries-{uuid.uuid4().hex[:6]}"
    with pytest.raises(MaxRetriesExceededError):
        env.task("always_retry").apply_async((name,), headers=TENANT).get(timeout=30)
    assert env.marks.get(name) == 3  # the first run and max_retries=2 retries


# --- callbacks, counters, replace, stamps -----------------------------------------

def test_link_callback_runs_with_the_result_and_is_decided(env: Env) -> None:
    callback = env.task("where").s()
    callback.freeze()
    assert env.task("add").apply_async((1, 2), headers=TENANT, link=callback).get(
        timeout=20) == 3
    info = AsyncResult(callback.id, app=env.app).get(timeout=20)
    assert info["x"] == 3
    env.check(info, "aitp.acme.cpu.hi")  # published by the worker: the tenant is inherited


def test_link_error_runs_once_on_failure(env: Env) -> None:
    name = f"errback-{uuid.uuid4().hex[:6]}"
    result = env.task("fail").apply_async((3,), headers=TENANT,
                                          link_error=env.task("mark").si(name))
    with pytest.raises(ValueError, match="boom 3"):
        result.get(timeout=20)
    deadline = time.monotonic() + 20
    while env.marks.get(name) == 0:
        assert time.monotonic() < deadline, "the errback never ran"
        time.sleep(0.05)
    time.sleep(0.3)
    assert env.marks.get(name) == 1


def test_group_and_chord_counters(env: Env) -> None:
    add, tsum = env.task("add"), env.task("tsum")
    members = group(add.s(i, 1) for i in range(6)).apply_async(headers=TENANT)
    assert members.get(timeout=20) == [1, 2, 3, 4, 5, 6]
    assert members.completed_count() == 6 and members.ready()
    assert chord([add.s(i, i) for i in range(20)], tsum.s()).apply_async(
        headers=TENANT).get(timeout=30) == 380
    nested = chord([chain(add.s(1, 1), add.s(1)), group(add.s(2, 2), add.s(3, 3))], tsum.s())
    assert nested.apply_async(headers=TENANT).get(timeout=30) == 13  # 3 + 4 + 6


def test_replace_gives_the_replacements_result(env: Env) -> None:
    (step,) = env.task("replaced_by_trace").apply_async(("r",), headers=TENANT).get(
        timeout=20)
    assert step["label"] == "r"
    env.check(step, "aitp.acme.cpu.lo")  # the replacement is decided in the worker
    flow = env.task("replaced_by_add").s(1) | env.task("add").s(10)
    assert flow.apply_async(headers=TENANT).get(timeout=20) == 12


class _Stamp(StampingVisitor):
    def __init__(self, value: str) -> None:
        self.value = value

    def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
        return {"compat_stamp": self.value}


def test_revoke_by_stamped_header(env: Env) -> None:
    revoked, kept = (uuid.uuid4().hex for _ in range(2))
    env.app.control.revoke_by_stamped_headers({"compat_stamp": [revoked]}, reply=True,
                                              timeout=1)
    runs = {}
    for value in (revoked, kept):
        sig = env.task("mark").si(f"stamped-{value}")
        sig.stamp(visitor=_Stamp(value))
        runs[value] = sig.apply_async(headers=TENANT)
    assert runs[kept].get(timeout=20) == f"stamped-{kept}"
    with pytest.raises(TaskRevokedError):
        runs[revoked].get(timeout=20)
    assert env.marks.get(f"stamped-{revoked}") == 0
