"""The Celery app that test worker processes import; configured from environment variables.

AITP_TEST_BROKER   broker (and result backend) URL
AITP_TEST_PREFIX   store key prefix (one per test)
AITP_TEST_QUEUE    default queue name (one per test)
AITP_TEST_POLICY   policy as JSON
AITP_TEST_REFRESH_INTERVAL   the live view's refresh interval (default 0.5 s)
AITP_TEST_TRANSPORT_OPTIONS  broker_transport_options as JSON (default none)
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from celery import Celery

import celery_aitp

app = Celery("aitp_test", broker=os.environ.get("AITP_TEST_BROKER", "memory://"),
             backend=os.environ.get("AITP_TEST_BACKEND") or os.environ.get("AITP_TEST_BROKER"))
app.conf.update(
    task_default_queue=os.environ.get("AITP_TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    result_expires=600,
    worker_hijack_root_logger=False,
    broker_transport_options=json.loads(os.environ.get("AITP_TEST_TRANSPORT_OPTIONS") or "{}"),
)
celery_aitp.install(
    app,
    policy=json.loads(os.environ.get("AITP_TEST_POLICY") or "null"),
    key_prefix=os.environ.get("AITP_TEST_PREFIX", "aitptest"),
    worker_ttl_s=float(os.environ.get("AITP_TEST_WORKER_TTL", "3")),
    evacuate_interval_s=float(os.environ.get("AITP_TEST_EVACUATE_INTERVAL", "1")),
    refresh_interval_s=float(os.environ.get("AITP_TEST_REFRESH_INTERVAL", "0.5")),
)
PREFIX = os.environ.get("AITP_TEST_PREFIX", "aitptest")
_clients: dict[tuple[int, int], Any] = {}


def tally_client() -> Any:
    """A Redis client of this process and thread (after fork, a new one) for the tally
    keys: a threads pool shared one once, and a connection closed under one thread's
    read failed its tally with "I/O operation on closed file" (the task itself ran)."""
    key = (os.getpid(), threading.get_ident())
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(app.conf.broker_url)
    return client


@app.task(shared=False, aitp={"tier": "hi"})
def hi(x: int, sleep: float = 0.0) -> dict:
    time.sleep(sleep)
    return {"x": x, "at": time.time()}


@app.task(shared=False, aitp={"tier": "lo"})
def lo(x: int, sleep: float = 0.0) -> dict:
    time.sleep(sleep)
    return {"x": x, "at": time.time()}


@app.task(shared=False, aitp={"accelerator": "gpu", "tier": "mid"})
def gpu(x: int, sleep: float = 0.0) -> dict:
    time.sleep(sleep)
    return {"x": x, "at": time.time()}


@app.task(shared=False)
def add(x: int, y: int) -> int:
    return x + y


@app.task(shared=False)
def tsum(values: list) -> int:
    return sum(values)


@app.task(shared=False, bind=True, max_retries=3)
def flaky(self, x: int) -> dict:
    """Fails on its first run, then succeeds: shows where a retry is delivered."""
    queue = self.request.delivery_info.get("routing_key")
    if self.request.retries == 0:
        raise self.retry(countdown=0.1)
    return {"x": x, "queue": queue, "retries": self.request.retries,
            "aitp": getattr(self.request, "aitp", None)}


def _where(request: object, x: int) -> dict:
    delivery = getattr(request, "delivery_info", None) or {}
    return {"x": x, "queue": delivery.get("routing_key"), "priority": delivery.get("priority"),
            "aitp": getattr(request, "aitp", None), "hostname": getattr(request, "hostname", None)}


@app.task(shared=False, bind=True)
def where(self, x: int = 0) -> dict:
    """Reports the queue it was delivered from, its priority and its aitp header."""
    return _where(self.request, x)


@app.task(shared=False, bind=True, aitp={"tier": "hi", "runtime_hint_s": 0.4})
def busy_hi(self, x: int = 0, sleep: float = 0.4) -> dict:
    """A top-tier task of a known size: where it ran (spill tests)."""
    time.sleep(sleep)
    return _where(self.request, x)


@app.task(shared=False, bind=True, aitp={"tier": "hi"})
def where_hi(self, x: int = 0) -> dict:
    """``where`` for a top-tier task."""
    return _where(self.request, x)


@app.task(shared=False)
def nap(ms: int) -> int:
    """Sleeps ``ms`` milliseconds: a runtime the model can learn from the argument."""
    time.sleep(ms / 1000.0)
    return ms


@app.task(shared=False)
def model_version() -> str | None:
    """The runtime model version this worker process predicts with (None: cold start)."""
    model = app.aitp.live.current().sources.get("aitp.model")
    return model.version if model is not None else None
@app.task(shared=False, ignore_result=True)
def noop() -> None:
    """Nothing: for producers that only show what they decided."""


@app.task(shared=False, bind=True)
def probe(self, sleep: float = 0.0) -> dict:
    """The stage and policy this pool process sees in its own live view, and when."""
    time.sleep(sleep)
    return {"pid": os.getpid(), "stage": app.aitp.live.current().stage.value,
            "policy": app.aitp.policy_digest, "at": time.time()}


@app.task(shared=False, bind=True, ignore_result=True, aitp={"tier": "hi"},
          autoretry_for=(redis.RedisError,), retry_backoff=0.2, max_retries=20)
def tally(self, n: int) -> None:
    """Count a delivery: ids that ran, deliveries per (id, attempt), and the queue.

    A count above 1 for one (id, attempt) is a duplicate delivery. A Redis hiccup inside
    the task (a loaded machine can time a call out) retries as a new attempt, so it can
    look neither like a lost task nor like a duplicate.
    """
    pipe = tally_client().pipeline(transaction=True)
    pipe.hincrby(f"{PREFIX}:tally:deliveries", f"{self.request.id}:{self.request.retries}", 1)
    pipe.sadd(f"{PREFIX}:tally:ids", self.request.id)
    pipe.hincrby(f"{PREFIX}:tally:queues", self.request.delivery_info.get("routing_key"), 1)
    pipe.execute()


@app.task(shared=False, bind=True)
def render(self, x: int = 0) -> dict:
    """Undeclared, but uses the (pretend) GPU: its profile should learn that."""
    from tests.support import fake_gpu

    fake_gpu.use()
    return {"x": x, "queue": self.request.delivery_info.get("routing_key"),
            "aitp": getattr(self.request, "aitp", None)}


@app.task(shared=False, bind=True)
def step(self, x: int = 0, sleep: float = 0.0) -> dict:
    """Reports when it started and from which queue (for ordering checks)."""
    started = time.time()
    time.sleep(sleep)
    return {"x": x, "started": started, "queue": self.request.delivery_info.get("routing_key")}


def _record_run(request: Any, kind: str, x: int, sleep: float) -> None:
    """Append this run (start time, delivery priority) to ``<prefix>:runs`` (aging tests)."""
    delivery = getattr(request, "delivery_info", None) or {}
    aitp = getattr(request, "aitp", None) or {}
    client = redis.Redis.from_url(os.environ.get("AITP_TEST_BACKEND") or app.conf.broker_url)
    client.rpush(f"{PREFIX}:runs", json.dumps({
        "kind": kind, "x": x, "id": request.id, "started": time.time(),
        "priority": delivery.get("priority"), "origin_at": aitp.get("origin_at")}))
    client.close()
    time.sleep(sleep)


@app.task(shared=False, bind=True, ignore_result=True, aitp={"tier": "hi"})
def run_hi(self, x: int, sleep: float = 0.0) -> None:
    """A top-tier run, recorded in order of start."""
    _record_run(self.request, "hi", x, sleep)


@app.task(shared=False, bind=True, ignore_result=True, aitp={"tier": "lo"})
def run_lo(self, x: int, sleep: float = 0.0) -> None:
    """A lowest-tier run, recorded in order of start."""
    _record_run(self.request, "lo", x, sleep)


def _hold(request: Any, seconds: float) -> None:
    """Note this run's start in ``<prefix>:held``, then wait (for the test to act)."""
    client = redis.Redis.from_url(os.environ.get("AITP_TEST_BACKEND") or app.conf.broker_url)
    client.rpush(f"{PREFIX}:held", request.id)
    client.close()
    time.sleep(seconds)


@app.task(shared=False, bind=True, ignore_result=True, aitp={"tier": "lo"})
def hold(self, seconds: float = 30.0) -> None:
    """Leaves acks to the configuration: late on a strict worker's tier queues only."""
    _hold(self.request, seconds)


@app.task(shared=False, bind=True, ignore_result=True, aitp={"tier": "lo"}, acks_late=False)
def hold_early(self, seconds: float = 30.0) -> None:
    """Sets acks_late=False itself: acknowledged at its start, wherever it comes from."""
    _hold(self.request, seconds)
