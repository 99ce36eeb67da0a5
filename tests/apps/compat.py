"""The app of the compatibility and fault suites: the same tasks with or without celery_aitp.

``create_app(env)`` builds it from an environment mapping (the test process builds its
producers this way; worker processes use the module-level ``app``, built from
``os.environ``):

AITP_TEST_BROKER             broker URL (Redis or RabbitMQ)
AITP_TEST_BACKEND            result backend URL (default: the broker's)
AITP_STORE_URL               shared store (Redis; required with RabbitMQ)
AITP_TEST_PREFIX             store key prefix, also the prefix of the tasks' marker keys
AITP_TEST_QUEUE              default queue name
AITP_TEST_POLICY             policy as JSON
AITP_TEST_PLAIN              "1": plain Celery, celery_aitp not installed
AITP_TEST_MARKS              Redis URL where tasks count their runs (default: the backend)
AITP_TEST_TRANSPORT_OPTIONS  broker_transport_options as JSON
AITP_TEST_WORKER_TTL, AITP_TEST_EVACUATE_INTERVAL, AITP_TEST_MAX_STALENESS  (seconds)

Task names are fixed (``compat.<name>``) so both apps and ``send_task`` agree.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

import celery_aitp


def create_app(env: Mapping[str, str]) -> Celery:
    broker = env.get("AITP_TEST_BROKER", "memory://")
    backend = env.get("AITP_TEST_BACKEND") or broker
    prefix = env.get("AITP_TEST_PREFIX", "aitptest")
    app = Celery("aitp_compat", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=env.get("AITP_TEST_QUEUE", "celery"),
        broker_connection_retry_on_startup=True,
        broker_transport_options=json.loads(env.get("AITP_TEST_TRANSPORT_OPTIONS") or "{}"),
        result_expires=600,
        worker_hijack_root_logger=False,
    )
    if env.get("AITP_TEST_PLAIN") != "1":
        celery_aitp.install(
            app,
            policy=json.loads(env.get("AITP_TEST_POLICY") or "null"),
            key_prefix=prefix,
            store_url=env.get("AITP_STORE_URL"),
            worker_ttl_s=float(env.get("AITP_TEST_WORKER_TTL", "3")),
            evacuate_interval_s=float(env.get("AITP_TEST_EVACUATE_INTERVAL", "1")),
            max_staleness_s=float(env.get("AITP_TEST_MAX_STALENESS", "5")),
            refresh_interval_s=0.5,
        )
    marks = Marks(env.get("AITP_TEST_MARKS") or backend, prefix)
    app.marks = marks  # type: ignore[attr-defined]
    _register_tasks(app, marks)
    return app


class Marks:
    """Counters in Redis that tasks bump, so tests can count runs across processes."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = f"{prefix}:marks"
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            if not self.url.startswith("redis"):
                raise RuntimeError(f"marks need a Redis URL (AITP_TEST_MARKS), not {self.url!r}")
            self._client = redis.Redis.from_url(self.url, socket_timeout=5)
        return self._client

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def incr(self, name: str) -> int:
        return int(self.client.incr(self.key(name)))

    def get(self, name: str) -> int:
        return int(self.client.get(self.key(name)) or 0)

    def add_run(self, name: str, value: str) -> None:
        """Append one completed run (e.g. a task id) to the list ``name``."""
        self.client.rpush(self.key(name), value)

    def runs(self, name: str) -> list[str]:
        return [v.decode() for v in self.client.lrange(self.key(name), 0, -1)]


def delivery(request: Any) -> dict[str, Any]:
    """Where and how a task was delivered, and what the middleware decided for it."""
    info = getattr(request, "delivery_info", None) or {}
    return {
        "queue": info.get("routing_key"),
        "priority": info.get("priority"),
        "aitp": getattr(request, "aitp", None),
        "hostname": getattr(request, "hostname", None),
        "retries": getattr(request, "retries", 0),
        "started_at": time.time(),
    }


def _register_tasks(app: Celery, marks: Marks) -> None:  # noqa: C901 - one task each
    @app.task(name="compat.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="compat.tsum", shared=False)
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(name="compat.fail", shared=False)
    def fail(x: int) -> int:
        raise ValueError(f"boom {x}")

    @app.task(name="compat.trace", shared=False, bind=True)
    def trace(self: Any, acc: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
        """Appends where this step ran to what the previous steps reported."""
        return [*acc, {"label": label, **delivery(self.request)}]

    @app.task(name="compat.where", shared=False, bind=True, aitp={"tier": "hi"})
    def where(self: Any, x: Any = None) -> dict[str, Any]:
        return {"x": x, **delivery(self.request)}

    @app.task(name="compat.retrying", shared=False, bind=True, max_retries=5)
    def retrying(self: Any, times: int, seen: list[dict[str, Any]] | None = None) -> Any:
        """Retries ``times`` times with a countdown, reporting where each attempt ran."""
        seen = [*(seen or []), delivery(self.request)]
        if self.request.retries < times:
            raise self.retry(args=(times, seen), countdown=0.3)
        return seen

    @app.task(name="compat.sleeper", shared=False)
    def sleeper(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @app.task(name="compat.soft_limited", shared=False, soft_time_limit=0.3)
    def soft_limited() -> str:
        try:
            time.sleep(3)
        except SoftTimeLimitExceeded:
            return "soft limit"
        return "not interrupted"

    @app.task(name="compat.hard_limited", shared=False, time_limit=0.5)
    def hard_limited() -> str:
        time.sleep(3)
        return "not interrupted"

    @app.task(name="compat.rate_limited", shared=False, bind=True, rate_limit="4/s")
    def rate_limited(self: Any, i: int) -> dict[str, Any]:
        return {"i": i, **delivery(self.request)}

    @app.task(name="compat.headers_seen", shared=False, bind=True)
    def headers_seen(self: Any) -> dict[str, Any]:
        return {"x_custom": getattr(self.request, "x_custom", None),
                "aitp_tenant": getattr(self.request, "aitp_tenant", None),
                **delivery(self.request)}

    @app.task(name="compat.mark", shared=False)
    def mark(name: str) -> str:
        marks.incr(name)
        return name

    @app.task(name="compat.mark_quiet", shared=False, ignore_result=True)
    def mark_quiet(name: str) -> str:
        marks.incr(name)
        return name

    @app.task(name="compat.lose_worker_once", shared=False, bind=True, acks_late=True,
              reject_on_worker_lost=True)
    def lose_worker_once(self: Any, name: str) -> int:
        """Kills its pool process on the first run; Celery redelivers it."""
        attempt = marks.incr(name)
        if attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return attempt

    @app.task(name="compat.lose_worker_unrejected", shared=False, bind=True, acks_late=True,
              reject_on_worker_lost=False)
    def lose_worker_unrejected(self: Any, name: str) -> int:
        """Kills its pool process on every run; Celery fails it, no redelivery."""
        attempt = marks.incr(name)
        os.kill(os.getpid(), signal.SIGKILL)
        return attempt

    @app.task(name="compat.soft_probe", shared=False)
    def soft_probe(seconds: float) -> str:
        """No limit of its own: a caller's ``soft_time_limit=`` interrupts it."""
        try:
            time.sleep(seconds)
        except SoftTimeLimitExceeded:
            return "soft limit"
        return "not interrupted"

    @app.task(name="compat.always_retry", shared=False, bind=True, max_retries=2)
    def always_retry(self: Any, name: str) -> None:
        """Counts its attempts and retries until ``max_retries`` is exceeded."""
        marks.incr(name)
        raise self.retry(countdown=0.1)

    @app.task(name="compat.prioritized", shared=False, bind=True, priority=6)
    def prioritized(self: Any) -> dict[str, Any]:
        """A task whose own ``priority`` attribute sets its message priority."""
        return delivery(self.request)

    @app.task(name="compat.replaced_by_trace", shared=False, bind=True)
    def replaced_by_trace(self: Any, label: str) -> Any:
        """Replaces itself with a ``trace`` step: its result is the replacement's."""
        raise self.replace(trace.s([], label))

    @app.task(name="compat.replaced_by_add", shared=False, bind=True)
    def replaced_by_add(self: Any, x: int) -> Any:
        raise self.replace(add.s(x, 1))

    @app.task(name="compat.work", shared=False, bind=True, acks_late=True)
    def work(self: Any, run_list: str, seconds: float = 0.0) -> str:
        """A unit of a fault test's load: sleeps, then records that it completed."""
        time.sleep(seconds)
        marks.add_run(run_list, f"{self.request.id}|{self.request.hostname}|{time.time()}")
        return self.request.id


app = create_app(os.environ)
