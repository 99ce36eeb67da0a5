"""Which deliveries a strict AITP worker acknowledges late, seen by killing it mid-run.

One worker (tier queues of acme and the default queue, three pool processes) runs three
tasks that wait: ``hold`` from a tier queue, ``hold`` from the default queue and
``hold_early`` (``acks_late=False`` on the task) from a tier queue. Once the worker has
accepted all three, it is killed with SIGKILL; a message the broker still holds as
unacknowledged (kombu's ``unacked`` hash on Redis; requeued by RabbitMQ when the
connection drops) is one the worker would have acknowledged only after the run.
"""

from __future__ import annotations

import json

import pytest
import redis
from kombu import Connection

from tests.support.live import wait_for, wait_live

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("broker", [pytest.param("redis", marks=pytest.mark.redis),
                                       pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]),
]
TENANT = {"aitp_tenant": "acme"}


def unacked_ids_redis(url: str) -> set[str]:
    """Task ids in kombu's ``unacked`` hash (delivered, not yet acknowledged)."""
    client = redis.Redis.from_url(url)
    entries = client.hvals("unacked")
    return {json.loads(raw)[0]["headers"]["id"] for raw in entries}


def requeued_ids_rabbitmq(url: str, queues: list[str]) -> set[str]:
    """Once no consumer is left on ``queues``, the task ids waiting in them again."""
    ids: set[str] = set()
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in queues:
            wait_for(lambda q=queue: channel.queue_declare(q, passive=True).consumer_count == 0,
                     30, f"the killed worker's consumer to leave {queue}")
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                ids.add(message.headers["id"])
        channel.close()
    return ids


def test_only_tier_deliveries_of_tasks_without_their_own_setting_ack_late(
        proj, start_worker, broker, redis_url):
    worker = start_worker("acme", "--aitp-tenant", "acme", concurrency=3)
    wait_live(proj, "aitp.acme.cpu.lo")
    default_queue = proj.app.conf.task_default_queue
    tier = proj.hold.apply_async(headers=TENANT)
    plain = proj.hold.apply_async(headers=TENANT, queue=default_queue)
    early = proj.hold_early.apply_async(headers=TENANT)
    ids = {tier.id, plain.id, early.id}

    store = redis.Redis.from_url(redis_url)
    wait_for(lambda: set(map(bytes.decode, store.lrange(f"{proj.PREFIX}:held", 0, -1))) == ids,
             30, "all three runs to start")
    # The worker acknowledges in its main process when it accepts a run; 'active' lists
    # a run only once that is done.
    wait_for(lambda: {t["id"] for reply in (proj.app.control.inspect(timeout=2).active()
                                             or {}).values() for t in reply} == ids,
             30, "the worker to have accepted the three runs")
    worker.kill()

    if broker == "redis":
        held = unacked_ids_redis(redis_url)
    else:
        held = requeued_ids_rabbitmq(proj.app.conf.broker_url,
                                     ["aitp.acme.cpu", default_queue])
    assert held == {tier.id}
    log = worker.output()
    conflict = [line for line in log.splitlines() if "acks_late=False keep it" in line]
    assert len(conflict) == 1
    named = conflict[0].rsplit(": ", 1)[1].split(", ")
    assert "tests.apps.proj.hold_early" in named and "tests.apps.proj.hold" not in named
