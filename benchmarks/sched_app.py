"""The Celery app of the scheduling benchmark, in one of three modes.

``fifo``: plain Celery, no middleware; hand-written ``task_routes`` send the accelerator
task to its own queue (what a team does today). ``aitp``: ``celery_aitp.install`` with
the benchmark policy. ``oracle``: the same, and the producer's ``predict`` stage reads
the true runtime (see :func:`use_oracle`). All modes: prefetch 1 and late acks, so the
runs differ only in the order tasks are served. Every task sleeps for the
``bench_runtime_s`` header and appends its start and end times to a Redis list.

Workers import this module and read their mode from the environment
(``AITP_BENCH_MODE``, ``AITP_BENCH_BROKER``, ``AITP_BENCH_PREFIX``, ``AITP_BENCH_QUEUE``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery

from benchmarks.bench_runs import MODES, RUNTIME_HEADER, results_key
from benchmarks.workload import KINDS, POLICY
from celery_aitp.core.request import read_header


def gpu_queue(queue: str) -> str:
    return f"{queue}.gpu"


def make_app(mode: str, broker: str, prefix: str, queue: str) -> Celery:
    """The benchmark app for one run; tasks are not shared with other apps."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    app = Celery(f"bench_{mode}", broker=broker)
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_transport_options={"queue_order_strategy": "priority"},
    )
    if mode == "fifo":
        app.conf.task_routes = {
            name: {"queue": gpu_queue(queue)}
            for name, kind in KINDS.items() if kind.accelerator == "gpu"
        }
    else:
        import celery_aitp

        celery_aitp.install(app, policy=POLICY, key_prefix=prefix, store_url=broker)
    sink = redis.Redis.from_url(broker)
    key = results_key(queue)
    host = socket.gethostname()

    def run(task: Any, size: int) -> None:
        started = time.time()
        runtime = getattr(task.request, RUNTIME_HEADER, None)
        if not isinstance(runtime, (int, float)):
            headers = getattr(task.request, "headers", None) or {}
            runtime = headers.get(RUNTIME_HEADER, 0.0)
        time.sleep(max(0.0, float(runtime)))
        finished = time.time()
        aitp = read_header(getattr(task.request, "aitp", None)) or {}
        sink.rpush(key, json.dumps({
            "id": task.request.id, "started": started, "finished": finished,
            "worker": task.request.hostname or host,
            "queue": (task.request.delivery_info or {}).get("routing_key"),
            "tier": aitp.get("tier") if isinstance(aitp, dict) else None,
        }))

    for name, kind in KINDS.items():
        def body(self: Any, size: int) -> None:
            run(self, size)

        body.__name__ = name.rsplit(".", 1)[1]
        app.task(body, name=name, bind=True, shared=False,
                 aitp={"accelerator": kind.accelerator, "tier": kind.tier})
    return app


def use_oracle(app: Celery) -> None:
    """Swap the producer's ``predict`` stage for one that reads the true runtime."""
    from celery_aitp.replay.routers import OraclePredictStage

    app.aitp.use_stage("predict", OraclePredictStage(header=RUNTIME_HEADER))


app = make_app(
    os.environ.get("AITP_BENCH_MODE", "aitp"),
    os.environ.get("AITP_BENCH_BROKER", "redis://127.0.0.1:6379/15"),
    os.environ.get("AITP_BENCH_PREFIX", "aitp-bench"),
    os.environ.get("AITP_BENCH_QUEUE", "aitp-bench"),
)
