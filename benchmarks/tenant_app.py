"""The Celery app of the tenant-scale benchmark: N tenants, one tiny task.

Workers import this module and read the run from the environment
(``AITP_SCALE_TENANTS``, ``AITP_SCALE_RUN``, ``AITP_SCALE_BROKER``, ``AITP_SCALE_PREFIX``,
``AITP_SCALE_QUEUE``, ``AITP_SCALE_LAYOUT``, ``AITP_SCALE_PLAIN``: plain Celery, no
middleware; ``AITP_SCALE_STORE``: the store's Redis when the broker is RabbitMQ). The task
appends its finish time to a Redis list, so the benchmark measures the worker's drain rate
from the tasks themselves.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

TASK = "scale.touch"


def tenant_names(n: int, run: str) -> list[str]:
    """``n`` tenants of this run (``t<run>00000`` ...), besides ``default``."""
    return [f"t{run}{i:05d}" for i in range(n)]


def class_name(run: str) -> str:
    """The run's tenant class (``class`` and ``unlisted`` layouts)."""
    return f"s{run}"


#: How the benchmark's tenants are laid out: ``dedicated`` (listed, queues of their own),
#: ``class`` (listed, sharing the queues of one class), ``unlisted`` (not listed at all:
#: the class of ``unlisted_tenants`` takes them).
LAYOUTS = ("dedicated", "class", "unlisted")


def policy(n: int, run: str, layout: str = "dedicated") -> dict[str, Any]:
    """Takeover, default tiers; every tenant may be named by the header (the benchmark
    spreads tasks over tenants that way)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    base: dict[str, Any] = {"stage": "takeover", "placement": {"min_samples": 1e12}}
    shared = class_name(run)  # the run's own: its queues are not another run's
    if layout == "unlisted":
        return base | {"tenants": {"default": {}}, "tenant_classes": {shared: {}},
                       "unlisted_tenants": shared}
    spec = {"tenant_class": shared} if layout == "class" else {}
    tenants: dict[str, Any] = {name: dict(spec) for name in tenant_names(n, run)}
    classes = {"tenant_classes": {shared: {}}} if layout == "class" else {}
    return base | classes | {"tenants": tenants | {"default": {}}}


def done_key(queue: str) -> str:
    return f"{queue}:done"


def make_app(n: int, run: str, broker: str, prefix: str, queue: str,
             plain: bool = False, layout: str = "dedicated", store: str | None = None) -> Celery:
    """``broker``: Redis or RabbitMQ; ``store``: the Redis of the store and of the tasks'
    finish times (the broker's URL when None: Redis as both)."""
    store = store or broker
    app = Celery(f"scale_{n}", broker=broker)
    app.conf.update(task_default_queue=queue, task_ignore_result=True,
                    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    if not plain:
        import celery_aitp

        celery_aitp.install(app, policy=policy(n, run, layout), key_prefix=prefix, store_url=store)
    key = done_key(queue)
    state: dict[str, Any] = {}

    def touch(self: Any) -> None:
        sink = state.get("sink")
        if sink is None:
            sink = state["sink"] = redis.Redis.from_url(store)
        sink.rpush(key, time.time())

    app.task(touch, name=TASK, bind=True, shared=False)
    return app


app = make_app(int(os.environ.get("AITP_SCALE_TENANTS", "1")),
               os.environ.get("AITP_SCALE_RUN", "x"),
               os.environ.get("AITP_SCALE_BROKER", "redis://127.0.0.1:6379/14"),
               os.environ.get("AITP_SCALE_PREFIX", "aitp-scale"),
               os.environ.get("AITP_SCALE_QUEUE", "aitp-scale"),
               plain=os.environ.get("AITP_SCALE_PLAIN") == "1",
               layout=os.environ.get("AITP_SCALE_LAYOUT", "dedicated"),
               store=os.environ.get("AITP_SCALE_STORE"))
