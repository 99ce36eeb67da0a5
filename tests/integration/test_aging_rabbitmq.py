"""Aging on real RabbitMQ: no starvation of lower tiers in a shared priority queue.

The pass itself (``RabbitQueueOps.reprioritise`` with the aging selector): every message
is kept exactly once with its body, headers and properties, only the priority of aged
ones raised; a failure in the middle leaves at most the one documented duplicate. Then a
real worker with one process and a continuous top-tier stream: the lo task runs once it
is promoted, within the documented bound, and nothing is lost or duplicated.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from adapters.rabbitmq_queues import RabbitQueueOps
from celery_aitp.errors import AdapterError
from celery_aitp.layout import layout_for
from celery_aitp.policy import parse_policy
from celery_aitp.worker import aging
from tests.conftest import TEST_POLICY, cleanup_deployment, deployment_env, environment
from tests.support.live import wait_live
from tests.support.rabbit import delete_queues
from tests.support.services import amqp_url

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]

PROMOTE_AFTER_S = 2.0
INTERVAL_S = 0.5
POLICY: dict[str, Any] = dict(
    TEST_POLICY,
    tiers=[{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
           {"name": "lo", "sla_s": 60, "promote_after_s": PROMOTE_AFTER_S}],
    aging={"interval_s": INTERVAL_S, "max_inspect": 100},
)


@pytest.fixture
def broker() -> str:
    return "rabbitmq"


@pytest.fixture
def deployment(redis_url: str) -> Iterator[dict[str, str]]:
    """The shared fixtures' deployment, with this module's aging policy."""
    tag = uuid.uuid4().hex[:8]
    env = deployment_env("rabbitmq", redis_url, tag, POLICY)
    with environment(env):
        yield env
    cleanup_deployment(env, redis_url, tag)


# --- the pass on the broker ------------------------------------------------------------


@pytest.fixture
def case() -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    app = Celery("agingtest", broker=amqp_url(), set_as_current=False)
    layout = layout_for("amqp", ["hi", "mid", "lo"])
    tenant = f"age{tag}"
    policy = parse_policy(dict(POLICY, tenants={tenant: {}}, default_tenant=tenant,
                               accelerators=["cpu"]))
    queue = f"aitp.{tenant}.cpu"
    ops = RabbitQueueOps(app)
    yield {"app": app, "layout": layout, "tenant": tenant, "queue": queue, "ops": ops,
           "plan": aging.AgingPlan(policy, layout)}
    ops.close()
    delete_queues(amqp_url(), [queue])


def publish(case: dict[str, Any], tiers: list[str], origins: list[float]) -> list[str]:
    """Real task messages into the tier queue, priorities and headers as the middleware
    writes them."""
    app, layout, tenant = case["app"], case["layout"], case["tenant"]
    declaration = layout.declaration(case["queue"])
    ids = []
    with app.producer_or_acquire() as producer:
        for i, (tier, origin) in enumerate(zip(tiers, origins, strict=True)):
            logical = f"aitp.{tenant}.cpu.{tier}"
            header = {"tier": tier, "queue": logical, "origin_at": origin, "decided_at": origin}
            result = app.send_task("agingtest.task", args=(i,), queue=declaration,
                                   producer=producer, priority=layout.priority(logical),
                                   headers={"aitp": header})
            ids.append(result.id)
    deadline = time.monotonic() + 10
    while case["ops"].depths([case["queue"]])[case["queue"]] != len(ids):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return ids


def take_all(case: dict[str, Any], keep: bool) -> list[Any]:
    """Every waiting message in delivery order; ``keep`` hands them back afterwards."""
    with case["ops"]._channel("test read") as channel:
        out = []
        while (message := channel.basic_get(case["queue"], no_ack=not keep)) is not None:
            out.append(message)
    return out


def task_id(message: Any) -> str:
    return str(message.properties["application_headers"]["id"])


def snapshot(message: Any) -> tuple[Any, ...]:
    """What a republish must keep: body, every property but the priority, the route."""
    properties = {k: v for k, v in message.properties.items() if k != "priority"}
    info = message.delivery_info
    return message.body, json.dumps(properties, sort_keys=True, default=str), \
        info["exchange"], info["routing_key"]


def test_a_pass_raises_aged_messages_and_keeps_everything_else_exactly_once(case):
    now = time.time()
    tiers = ["hi", "mid", "lo"] * 6
    origins = [now - 100] * 9 + [now] * 9  # the older half first, as published
    ids = publish(case, tiers, origins)
    before = {task_id(m): snapshot(m) for m in take_all(case, keep=True)}
    assert len(before) == len(ids)

    selector = case["plan"].selector(case["queue"], time.time())
    inspected, promoted = case["ops"].reprioritise(case["queue"], selector, 100)

    old_lower = {ids[i] for i in range(9) if tiers[i] != "hi"}
    assert promoted == len(old_lower) == 6
    assert selector.done and inspected < len(ids)  # stopped at the first young lo message
    after = take_all(case, keep=False)
    assert Counter(task_id(m) for m in after) == Counter(ids)  # nothing lost, no duplicate
    for message in after:
        tid = task_id(message)
        assert snapshot(message) == before[tid]
        tier = tiers[ids.index(tid)]
        expected = 10 if tid in old_lower else case["layout"].priority(f"aitp.x.cpu.{tier}")
        assert message.properties["priority"] == expected, tid
    priorities = [m.properties["priority"] for m in after]
    assert priorities == sorted(priorities, reverse=True)
    promoted_order = [task_id(m) for m in after if task_id(m) in old_lower]
    # Promoted in the order the pass took them: by original priority, then FIFO.
    taken = sorted((i for i in range(len(ids)) if ids[i] in old_lower),
                   key=lambda i: (-case["layout"].priority(f"aitp.x.cpu.{tiers[i]}"), i))
    assert promoted_order == [ids[i] for i in taken]


class CrashingOps(RabbitQueueOps):
    """Fails at the third republish: before its publish, or after its confirm."""

    def __init__(self, app: Any, after_confirm: bool) -> None:
        super().__init__(app)
        self.after_confirm = after_confirm
        self.calls = 0

    def _republish(self, channel: Any, queue: str, message: Any, priority: int) -> None:
        self.calls += 1
        if self.calls == 3 and not self.after_confirm:
            raise ConnectionError("simulated crash before the publish")
        super()._republish(channel, queue, message, priority)
        if self.calls == 3:
            raise ConnectionError("simulated crash between confirm and acknowledgement")


@pytest.mark.parametrize("after_confirm", [False, True])
def test_a_pass_that_fails_midway_loses_nothing(case, after_confirm):
    now = time.time()
    ids = publish(case, ["lo"] * 6, [now - 100] * 6)
    ops = CrashingOps(case["app"], after_confirm)
    try:
        with pytest.raises(AdapterError, match="simulated crash"):
            ops.reprioritise(case["queue"], case["plan"].selector(case["queue"], now), 100)
    finally:
        ops.close()
    after = Counter(task_id(m) for m in take_all(case, keep=False))
    assert set(after) == set(ids)  # nothing lost
    duplicated = [tid for tid, n in after.items() if n > 1]
    # The only duplicate is the message whose copy was confirmed but not acknowledged.
    assert duplicated == ([ids[2]] if after_confirm else [])


# --- a real worker under a continuous top-tier stream ----------------------------------


def runs(proj: Any) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(proj.app.conf.result_backend)
    return [json.loads(raw) for raw in client.lrange(f"{proj.PREFIX}:runs", 0, -1)]


def test_low_tier_task_runs_within_the_bound_under_a_continuous_top_tier_stream(
        proj, start_worker):
    start_worker("acme", "--aitp-tenant", "acme", "--aitp-no-default-queue")
    wait_live(proj, "aitp.acme.cpu.hi")
    ops = RabbitQueueOps(proj.app)
    headers = {"aitp_tenant": "acme"}
    hi_runtime, backlog = 0.2, 5
    published: list[str] = []
    try:
        for i in range(backlog):
            published.append(proj.run_hi.apply_async((i, hi_runtime), headers=headers).id)
        lo_published = time.time()
        lo_id = proj.run_lo.apply_async((0,), headers=headers).id
        published.append(lo_id)
        deadline = time.monotonic() + 60
        n = backlog
        # Keep at least `backlog` top-tier messages waiting until the lo task has started.
        while not any(r["kind"] == "lo" for r in runs(proj)):
            assert time.monotonic() < deadline, "the lo task starved"
            depth = ops.depths(["aitp.acme.cpu"])["aitp.acme.cpu"]
            for _ in range(max(0, backlog + 1 - depth)):
                published.append(proj.run_hi.apply_async((n, hi_runtime), headers=headers).id)
                n += 1
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while len(runs(proj)) < len(published):
            assert time.monotonic() < deadline, (len(runs(proj)), len(published))
            time.sleep(0.1)
        deadline = time.monotonic() + 20
        while not proj.app.aitp.store.counts().get("aged"):
            assert time.monotonic() < deadline, "no promotion counted"
            time.sleep(0.2)
    finally:
        ops.close()

    done = runs(proj)
    assert Counter(r["id"] for r in done) == Counter(published)  # none lost, none twice
    order = [r["kind"] for r in done]
    lo_run = next(r for r in done if r["kind"] == "lo")
    wait = lo_run["started"] - lo_published
    assert lo_run["priority"] == 10  # it was promoted to the top priority
    assert order.index("lo") < len(order) - 1 and order[-1] == "hi"  # overtook waiting hi
    assert wait >= PROMOTE_AFTER_S  # before its promotion age the top tier went first
    assert proj.app.aitp.store.counts().get("aged") == 1  # only the lo task was raised
    # The bound in reads: a read takes at least `hi_runtime`, so between the lo task's
    # publish and its start at most (A + interval) / hi_runtime reads happen before the
    # promotion, then the top-priority messages ahead of it (at most backlog + 1 topped up).
    reads_before = order.index("lo")
    started_after_publish = sum(1 for r in done[:order.index("lo")]
                                if r["started"] >= lo_published)
    bound_reads = math.ceil((PROMOTE_AFTER_S + INTERVAL_S) / hi_runtime) + backlog + 2
    assert started_after_publish <= bound_reads, (started_after_publish, bound_reads)
    bound_s = aging.longest_wait_s(PROMOTE_AFTER_S, INTERVAL_S, backlog + 1, 1, hi_runtime)
    print(f"lo waited {wait:.2f} s (documented bound {bound_s:.2f} s with R = "
          f"{hi_runtime} s); {started_after_publish} hi runs started in between "
          f"(bound {bound_reads}); {reads_before} runs before it in all")
