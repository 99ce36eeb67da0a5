"""The QueueOps adapters on real brokers: depth, and a move that loses nothing.

One contract for Redis (``RedisQueueOps``) and RabbitMQ (``RabbitQueueOps``). Messages
are real Celery task messages published by an app; the move target is the app's
default queue, declared as Celery declares it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_aitp.core.request import read_header
from celery_aitp.errors import AdapterError
from celery_aitp.layout import layout_for
from celery_aitp.registry import QUEUE_OPS, resolve
from tests.support.rabbit import delete_queues
from tests.support.services import amqp_url

pytestmark = pytest.mark.parametrize(
    "broker_url", [pytest.param("redis", marks=pytest.mark.redis),
                   pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)], indirect=True)


@pytest.fixture
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    return redis_url if request.param == "redis" else amqp_url()


@pytest.fixture
def case(broker_url: str) -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    app = Celery("opstest", broker=broker_url, set_as_current=False)
    app.conf.task_default_queue = f"opstest-{tag}"
    driver = "redis" if broker_url.startswith("redis") else "amqp"
    layout = layout_for(driver, ["hi", "mid", "lo"])
    source = layout.physical(f"aitp.ops{tag}.cpu.hi")
    ops = resolve(QUEUE_OPS, driver)(app)
    yield {"app": app, "ops": ops, "layout": layout, "source": source, "tag": tag,
           "default": app.conf.task_default_queue, "driver": driver}
    ops.close()
    if driver == "amqp":
        delete_queues(broker_url, [source, app.conf.task_default_queue])
    else:
        import redis

        client = redis.Redis.from_url(broker_url)
        for pattern in (f"{source}*", f"opstest-{tag}*", f"_kombu.binding.*{tag}*"):
            keys = list(client.scan_iter(pattern))
            if keys:
                client.delete(*keys)


def publish(case: dict[str, Any], n: int) -> list[str]:
    """n task messages to the source queue; tier priorities from the layout (mixed)."""
    app, layout = case["app"], case["layout"]
    tag = case["tag"]
    queue = layout.declaration(case["source"])
    ids = []
    with app.producer_or_acquire() as producer:
        for i in range(n):
            logical = f"aitp.ops{tag}.cpu.{('hi', 'mid', 'lo')[i % 3]}"
            result = app.send_task("ops.task", args=(i,), queue=queue, producer=producer,
                                   priority=layout.priority(logical),
                                   headers={"aitp": {"queue": logical},
                                            # a header of the user's quoting the route
                                            "trace": {"routing_key": case["source"]}})
            ids.append(result.id)
    return ids


def wait_depth(case: dict[str, Any], queue: str, n: int, timeout: float = 10) -> None:
    """Until ``queue`` holds ``n`` messages (a RabbitMQ publish is routed asynchronously)."""
    deadline = time.monotonic() + timeout
    while case["ops"].depths([queue])[queue] != n:
        assert time.monotonic() < deadline, case["ops"].depths([queue])
        time.sleep(0.05)


def drain(case: dict[str, Any], name: str) -> list[Any]:
    from kombu import Queue

    out = []
    with case["app"].connection_for_read() as conn:
        queue = Queue(name, no_declare=True)(conn.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            out.append(message)
    return out


def test_depth_of_a_missing_queue_is_zero(case):
    assert case["ops"].depths([f"nothing-{case['tag']}"]) == {f"nothing-{case['tag']}": 0}


def test_move_all_moves_every_message_once_keeping_headers_and_priority(case):
    ids = publish(case, 9)
    ops, source, default = case["ops"], case["source"], case["default"]
    wait_depth(case, source, 9)
    assert ops.move_all(source, default) == 9
    assert ops.depths([source, default]) == {source: 0, default: 9}
    moved = drain(case, default)
    assert sorted(m.headers["id"] for m in moved) == sorted(ids)  # each exactly once
    assert all(m.delivery_info["routing_key"] == default for m in moved)
    # the route is rewritten where kombu keeps it, not in a header that quotes it
    assert all(m.headers["trace"] == {"routing_key": source} for m in moved)
    assert all(m.headers["task"] == "ops.task" and read_header(m.headers["aitp"])[
        "queue"].startswith("aitp.ops") for m in moved)
    if case["driver"] == "amqp":  # taken highest priority first, and the priority is kept
        priorities = [m.properties["priority"] for m in moved]
        assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == 3
    else:  # one list per priority step on Redis; all tier messages have priority 0: FIFO
        assert [m.headers["id"] for m in moved] == ids


def test_a_move_that_fails_half_way_loses_and_duplicates_nothing(case, monkeypatch):
    ids = publish(case, 6)
    ops, source, default = case["ops"], case["source"], case["default"]
    wait_depth(case, source, 6)
    if case["driver"] == "amqp":
        ops.batch = 2
        from kombu.transport.pyamqp import Channel

        commits = {"n": 0}
        real_commit = Channel.tx_commit

        def commit_then_fail(self: Any) -> Any:
            commits["n"] += 1
            if commits["n"] == 2:  # the connection drops before the second commit
                self.connection.collect()
                raise ConnectionError("connection lost")
            return real_commit(self)

        monkeypatch.setattr(Channel, "tx_commit", commit_then_fail)
    else:
        import celery_aitp_adapters.redis_queues as redis_queues

        monkeypatch.setattr(redis_queues, "BATCH", 2)
        script = ops._move
        calls = {"n": 0}

        def move_then_fail(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:
                raise redis_queues.redis.ConnectionError("connection lost")
            return script(*args, **kwargs)

        ops._move = move_then_fail
    with pytest.raises(AdapterError, match="connection lost"):
        ops.move_all(source, default)
    monkeypatch.undo()
    deadline = time.monotonic() + 10  # the broker requeues a dropped connection's messages
    while sum(ops.depths([source, default]).values()) != len(ids):
        assert time.monotonic() < deadline, ops.depths([source, default])
        time.sleep(0.05)
    in_source = [m.headers["id"] for m in drain(case, source)]
    in_default = [m.headers["id"] for m in drain(case, default)]
    assert sorted(in_source + in_default) == sorted(ids)  # nothing lost, nothing twice
    assert len(in_default) == 2  # the first batch was committed


def test_an_unreachable_broker_raises_adapter_error(broker_url):
    url = "redis://127.0.0.1:1/0" if broker_url.startswith("redis") else \
        "amqp://guest:guest@127.0.0.1:1//"
    app = Celery("down", broker=url, set_as_current=False)
    app.conf.broker_connection_timeout = 0.5
    app.conf.broker_connection_max_retries = 0
    driver = "redis" if url.startswith("redis") else "amqp"
    ops = resolve(QUEUE_OPS, driver)(app)
    with pytest.raises(AdapterError):
        ops.depths(["q"])
    with pytest.raises(AdapterError):
        ops.move_all("q", "celery")
    ops.close()
