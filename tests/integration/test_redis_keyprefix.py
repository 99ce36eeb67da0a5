"""kombu's ``global_keyprefix`` on real Redis: the queue adapter reads and moves the lists
kombu really writes (``<prefix><queue>``), so the janitor, ``evacuate`` and the depth
metrics see tier queues of an app that shares its Redis under a prefix."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from adapters.redis_queues import RedisQueueOps

pytestmark = pytest.mark.redis


@pytest.fixture
def prefixed(redis_url: str) -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    prefix = f"pfx{tag}:"
    app = Celery("prefixed", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = f"default-{tag}"
    app.conf.broker_transport_options = {"global_keyprefix": prefix}
    ops = RedisQueueOps(app)
    yield {"app": app, "ops": ops, "tier": f"aitp.acme{tag}.cpu.lo",
           "default": app.conf.task_default_queue, "prefix": prefix}
    ops.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)


def test_depth_age_and_move_follow_kombus_key_prefix(prefixed: dict[str, Any]) -> None:
    app, ops, tier, default = (prefixed[k] for k in ("app", "ops", "tier", "default"))
    ids = [app.send_task("t.x", args=(i,), queue=tier,
                         headers={"aitp": {"decided_at": time.time() - 5}}).id
           for i in range(3)]
    assert ops.depths([tier, default]) == {tier: 3, default: 0}
    assert (ops.oldest_ages([tier], time.time())[tier] or 0) >= 4
    assert ops.move_all(tier, default) == 3
    assert ops.depths([tier, default]) == {tier: 0, default: 3}
    with app.connection_for_read() as conn:  # kombu reads them back under its prefix
        from kombu import Queue

        queue = Queue(default, no_declare=True)(conn.default_channel)
        got = []
        while (message := queue.get(no_ack=True)) is not None:
            got.append(message.headers["id"])
    assert got == ids
