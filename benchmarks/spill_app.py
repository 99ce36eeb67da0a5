"""The Celery app of the spill benchmark (``spill_effect.py``): one top-tier task that
sleeps and records when it started and which queue it came from.

Workers read the run from the environment: ``AITP_SPILL_BROKER`` (Redis: broker, store
and result sink), ``AITP_SPILL_PREFIX``, ``AITP_SPILL_QUEUE`` and ``AITP_SPILL_POLICY``
(the policy as JSON).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

import celery_aitp

BROKER = os.environ.get("AITP_SPILL_BROKER", "redis://127.0.0.1:6379/14")
PREFIX = os.environ.get("AITP_SPILL_PREFIX", "spill-bench")
QUEUE = os.environ.get("AITP_SPILL_QUEUE", "spill-bench")

app = Celery("spill_bench", broker=BROKER)
app.conf.update(task_default_queue=QUEUE, task_ignore_result=True, task_acks_late=True,
                worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)
celery_aitp.install(app, policy=json.loads(os.environ.get("AITP_SPILL_POLICY", "{}")),
                    key_prefix=PREFIX, store_url=BROKER, refresh_interval_s=0.5)
_sink: list[Any] = []


def runs_key() -> str:
    return f"{PREFIX}:runs"


@app.task(name="bench.urgent", bind=True, shared=False,
          aitp={"tier": "hi", "runtime_hint_s": 0.25})
def urgent(self: Any, published: float, sleep: float) -> None:
    started = time.time()
    time.sleep(sleep)
    if not _sink:
        _sink.append(redis.Redis.from_url(BROKER))
    aitp = getattr(self.request, "aitp", None) or {}
    _sink[0].rpush(runs_key(), json.dumps({
        "id": self.request.id, "published": published, "started": started,
        "queue": (self.request.delivery_info or {}).get("routing_key"),
        "reason": aitp.get("reason") if isinstance(aitp, dict) else None}))
