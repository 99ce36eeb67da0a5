"""Shared fixtures: real Redis for integration tests, an isolated deployment per test."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from tests.support.services import DEFAULT_REDIS, IN_CI, amqp_url, missing, redis_ok
from tests.support.workers import WorkerProcess, stop_all

TEST_POLICY: dict[str, Any] = {
    "tiers": [
        {"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10}, {"name": "lo", "sla_s": 60},
    ],
    "tenants": {"acme": {"max_tier": "hi", "weight": 2}, "globex": {"max_tier": "mid"},
                "default": {"max_tier": "lo"}},
    "accelerators": ["cpu", "gpu"],
    "stage": "takeover",
    # No size classes: undeclared tasks stay in the lowest tier, so the tests of routing,
    # compatibility and faults know where each task goes. The tests of placement by size
    # set their own (tests/integration/test_priority_redis.py, tests/unit/test_size_*).
    "placement": {"min_samples": 1e12},
}


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis server: the configured or local one; embedded only outside CI."""
    url = os.environ.get("AITP_TEST_REDIS_URL")
    if url:
        if not redis_ok(url):
            missing("Redis", url)
        yield url
        return
    if redis_ok(DEFAULT_REDIS):
        yield DEFAULT_REDIS
        return
    if IN_CI:
        missing("Redis", DEFAULT_REDIS)
    from celery_aitp.demo.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def broker() -> str:
    """The broker a test's deployment uses; parametrize it to run on RabbitMQ too."""
    return "redis"


def deployment_env(broker_kind: str, redis_url: str, tag: str,
                   policy: dict[str, Any] | None = None) -> dict[str, str]:
    """Environment of one isolated deployment (see ``tests/apps/proj.py``).

    On RabbitMQ the broker is the test vhost and Redis is the store and result backend.
    """
    env = {
        "AITP_TEST_BROKER": redis_url,
        "AITP_TEST_PREFIX": f"aitptest-{tag}",
        "AITP_TEST_QUEUE": f"aitptest-{tag}",
        "AITP_TEST_POLICY": json.dumps(policy or TEST_POLICY),
    }
    if broker_kind == "rabbitmq":
        env.update(AITP_TEST_BROKER=amqp_url(), AITP_TEST_BACKEND=redis_url,
                   AITP_STORE_URL=redis_url)
    elif broker_kind != "redis":
        raise ValueError(f"unknown broker {broker_kind!r}")
    return env


@contextmanager
def environment(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Set ``env`` in os.environ for the block; restore what was there."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cleanup_deployment(env: dict[str, str], redis_url: str, tag: str,
                       extra_queues: tuple[str, ...] = ()) -> None:
    """Delete what one deployment created, on Redis and (if used) RabbitMQ."""
    if env["AITP_TEST_BROKER"].startswith("amqp"):
        from tests.support.rabbit import delete_queues

        policy = json.loads(env["AITP_TEST_POLICY"])
        tier_queues = [f"aitp.{t}.{a}" for t in policy["tenants"] for a in policy["accelerators"]]
        delete_queues(env["AITP_TEST_BROKER"],
                      [env["AITP_TEST_QUEUE"], *tier_queues, *extra_queues])
    _cleanup(redis_url, tag)


@pytest.fixture
def deployment(redis_url: str, broker: str) -> Iterator[dict[str, str]]:
    """Environment for one isolated deployment: own key prefix and default queue.

    Deletes only what this test created: its prefix, its default queue, tier queues and
    their kombu bindings (or RabbitMQ queues and exchanges), and its result keys.
    """
    tag = uuid.uuid4().hex[:8]
    env = deployment_env(broker, redis_url, tag)
    with environment(env):
        yield env
    cleanup_deployment(env, redis_url, tag)


def _cleanup(url: str, tag: str) -> None:
    from celery_aitp.store.redis_store import redis_url_for

    client = redis.Redis.from_url(redis_url_for(url))
    patterns = [f"aitptest-{tag}*", "aitp.*", "_kombu.binding*.aitp.*", "unacked*",
                f"_kombu.binding*.aitptest-{tag}*"]  # its default queue's bindings
    for pattern in patterns:
        keys = list(client.scan_iter(pattern, count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def proj(deployment: dict[str, str]) -> Iterator[Any]:
    """The test app, imported fresh with this test's deployment environment."""
    import importlib
    import sys

    sys.modules.pop("tests.apps.proj", None)
    module = importlib.import_module("tests.apps.proj")
    yield module
    module.app.aitp.close()
    sys.modules.pop("tests.apps.proj", None)


@pytest.fixture
def start_worker(deployment: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes of the test app; all are stopped at the end of the test."""
    started: list[WorkerProcess] = []

    def start(name: str, *args: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(f"{name}-{uuid.uuid4().hex[:6]}", list(args), deployment, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    stop_all(started)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the fault suite's table: published, completed, duplicated, lost per scenario."""
    from tests.support.faults import RESULTS, format_table

    if RESULTS:
        terminalreporter.section("fault tests: every task accounted for")
        terminalreporter.write_line(format_table(RESULTS))
