"""The placement benchmark's Celery app: one undeclared task ``bench.job(d)``.

``fifo``: plain Celery, no middleware, one queue. ``aitp``: celery_aitp installed with the
placement workload's policy (two tenants, defaults otherwise); whether a model is in use
depends on what was promoted in the run's store. ``oracle``: the same, and the producer's
``predict`` stage reads the true runtime from the ``bench_runtime_s`` header. The task
sleeps for that header's runtime and appends its start and end times to a Redis list.
With a ``bench_cores`` header it instead works as on a machine of that many cores shared
by every running task of the run, over all its workers (:func:`work`): how a worker with
one process more than the machine has cores runs.
Plain Celery's worker settings are left as they are (the AITP worker sets what tier
order needs itself); results are ignored.

Workers import this module and read their mode from the environment
(``AITP_BENCH_MODE``, ``AITP_BENCH_BROKER``, ``AITP_BENCH_PREFIX``, ``AITP_BENCH_QUEUE``,
``AITP_BENCH_STORE`` with a RabbitMQ broker).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from benchmarks.bench_runs import CORES_HEADER, MODES, RUNTIME_HEADER, results_key, running_key
from benchmarks.placement_workloads import POLICY, TASK
from celery_aitp.core.request import read_header


def policy_with(extra: str | None) -> dict[str, Any]:
    """The workload's policy with top-level fields replaced from a JSON object (the
    benchmark's ``--policy``, passed to workers as ``AITP_BENCH_POLICY``)."""
    found = dict(POLICY)
    if extra:
        found.update(json.loads(extra))
    return found


#: Seconds between two looks at how many tasks share the cores.
STEP_S = 0.005


def work(client: redis.Redis, counter: str, runtime_s: float, cores: float | None) -> float:
    """Take ``runtime_s`` of one core's time; returns the seconds lost to sharing.

    Without ``cores``: a sleep, as a task alone on its core. With it: the run's tasks
    share ``cores`` cores as an operating system time-slices processes (each of ``n``
    running tasks progresses at ``min(1, cores / n)``), counted in the Redis ``counter``
    every task of the run increments while it runs. So a fifth task on four cores slows
    the four others by a fifth instead of waiting for one of them to end.
    """
    if not cores:
        time.sleep(runtime_s)
        return 0.0
    client.incr(counter)
    try:
        left, lost = runtime_s, 0.0
        last = time.monotonic()
        while left > 0:
            rate = min(1.0, cores / max(1, int(client.get(counter) or 1)))
            time.sleep(min(STEP_S, left / rate))
            now = time.monotonic()
            left -= (now - last) * rate
            lost += (now - last) * (1.0 - rate)
            last = now
        return lost
    finally:
        client.decr(counter)


def make_app(mode: str, broker: str, prefix: str, queue: str,
             policy: dict[str, Any] | None = None, store: str | None = None) -> Celery:
    """The app of one run. ``store``: the Redis database of celery_aitp's store and of the
    tasks' timings when the broker is not Redis (RabbitMQ); None: the broker's."""
    store = store or broker
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    app = Celery(f"placement_{mode}", broker=broker)
    app.conf.update(task_default_queue=queue, task_ignore_result=True,
                    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    if mode != "fifo":
        import celery_aitp

        celery_aitp.install(app, policy=policy or POLICY, key_prefix=prefix, store_url=store)
        if mode == "oracle":
            from celery_aitp.replay.routers import OraclePredictStage

            app.aitp.use_stage("predict", OraclePredictStage(header=RUNTIME_HEADER))
    sink = redis.Redis.from_url(store)
    key = results_key(queue)

    @app.task(name=TASK, bind=True, shared=False)
    def job(self: Any, d: int) -> None:
        """Runs for about ``d`` milliseconds (exactly: the header's runtime)."""
        started = time.time()
        headers = getattr(self.request, "headers", None) or {}
        runtime = getattr(self.request, RUNTIME_HEADER, None)
        if not isinstance(runtime, (int, float)):
            runtime = headers.get(RUNTIME_HEADER, d / 1000)
        cores = getattr(self.request, CORES_HEADER, None) or headers.get(CORES_HEADER)
        lost = work(sink, running_key(queue), max(0.0, float(runtime)),
                    float(cores) if isinstance(cores, (int, float)) else None)
        finished = time.time()
        aitp = read_header(getattr(self.request, "aitp", None)) or {}
        sink.rpush(key, json.dumps({
            "id": self.request.id, "started": started, "finished": finished,
            "tier": aitp.get("tier"), "queue": aitp.get("queue"),
            "source": aitp.get("prediction_source"), "shared_s": lost,
        }))

    return app


app = make_app(
    os.environ.get("AITP_BENCH_MODE", "aitp"),
    os.environ.get("AITP_BENCH_BROKER", "redis://127.0.0.1:6379/14"),
    os.environ.get("AITP_BENCH_PREFIX", "aitp-placement"),
    os.environ.get("AITP_BENCH_QUEUE", "aitp-placement"),
    policy_with(os.environ.get("AITP_BENCH_POLICY")),
    os.environ.get("AITP_BENCH_STORE") or None,
)
