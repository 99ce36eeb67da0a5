"""Load the example project as `celery -A shop worker` or `manage.py runserver` would.

The broker is kombu's in-memory transport (published messages stay in this process); the
store is a real Redis (``AITP_TEST_REDIS_URL``, else 127.0.0.1:6379/13), with a key prefix
of its own that is deleted afterwards. In CI a missing Redis fails the run.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

PROJECT = Path(__file__).resolve().parent
REDIS_URL = os.environ.get("AITP_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
PREFIX = f"shop-test-{uuid.uuid4().hex[:8]}"


def _redis_reachable() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="session")
def django_project() -> Iterator[Any]:
    """The configured project: its Celery app, with settings taken from Django's."""
    if not _redis_reachable():
        message = f"Redis is not reachable at {REDIS_URL}"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must provide it", pytrace=False)
        pytest.skip(message)
    os.environ.update(DJANGO_SETTINGS_MODULE="shop.settings", CELERY_BROKER_URL="memory://",
                      CELERY_AITP_STORE_URL=REDIS_URL, CELERY_AITP_KEY_PREFIX=PREFIX)
    sys.path.insert(0, str(PROJECT))
    import django

    django.setup()
    from shop import celery_app

    yield celery_app
    celery_app.aitp.close()
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{PREFIX}*"))
    if keys:
        client.delete(*keys)
