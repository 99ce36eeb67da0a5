"""Cost of ``Middleware.on_publish`` per broker layout, and of tenant inheritance.

    python benchmarks/publish_layouts.py [--n 100000]

The whole in-process decision plus annotation for one routed task (no broker I/O: the
message is handed to ``on_publish`` directly, the store is fakeredis), on the Redis layout
(one broker queue per tier) and the RabbitMQ layout (one priority queue per tenant and
accelerator), from a producer and from inside a running task (whose tenant is inherited).
Prints p50/p99 in microseconds and the ratio of each case to the Redis producer case.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import fakeredis
from celery import Celery, signals
from celery.app.amqp import task_message

import celery_aitp
from celery_aitp.store import Keys, RedisStore

POLICY = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi"}, "default": {}},
    "stage": "takeover",
}


def middleware(driver: str) -> Any:
    app = Celery("bench", broker="memory://", set_as_current=False)
    mw = celery_aitp.install(app, policy=POLICY)
    mw.store = RedisStore(fakeredis.FakeRedis(), Keys("bench"))
    mw.broker_driver = driver
    mw.store.advertise("w@bench", ["aitp.acme.cpu.lo", "aitp.acme.cpu.hi"], {}, 3600)

    @app.task(shared=False, name="bench.task")
    def task() -> None:
        return None

    mw.live.current()
    mw.live.refresh()
    return app, mw


def measure(mw: Any, n: int, headers: dict[str, Any]) -> tuple[float, float]:
    message = task_message(headers={"id": "b1", "task": "bench.task"}, properties={},
                           body=((), {}, {}), sent_event=None)
    samples = []
    for _ in range(n):
        options = {"_aitp_auto": True, "headers": dict(headers)}
        began = time.perf_counter_ns()
        mw.on_publish("bench.task", message, options)
        samples.append(time.perf_counter_ns() - began)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    n = parser.parse_args().n
    rows = []
    for driver in ("redis", "amqp"):
        app, mw = middleware(driver)
        rows.append((f"{driver}: producer", *measure(mw, n, {"aitp_tenant": "acme"})))
        task = app.tasks["bench.task"]
        task.push_request(aitp={"tenant": "acme"}, called_directly=False)
        signals.task_prerun.send(sender=task, task_id="parent", task=task)
        try:
            rows.append((f"{driver}: inside a task (tenant inherited)", *measure(mw, n, {})))
        finally:
            signals.task_postrun.send(sender=task, task_id="parent", task=task)
            task.pop_request()
        mw.close()
    base = rows[0][1]
    print(f"{'case':42} {'p50 us':>8} {'p99 us':>8} {'p50 ratio':>10}")
    for name, p50, p99 in rows:
        print(f"{name:42} {p50:8.2f} {p99:8.2f} {p50 / base:10.2f}")


if __name__ == "__main__":
    main()
