"""The side-by-side demo's two Celery apps: the same tasks, once plain, once with AITP.

Nothing is declared: no tier, no runtime hint, no tenant. ``thumbnail`` is short work,
``transcode`` long work; each sleeps the milliseconds it is given and returns when it
started, so the publisher measures every task's wait the same way under both apps.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

import celery_aitp

BROKER = os.environ.get("AITP_DEMO_BROKER", "redis://127.0.0.1:6379/0")
#: The product's default policy; only the stage is set (takeover: every task is placed).
POLICY: dict[str, Any] = {"stage": "takeover"}


def _app(name: str) -> Celery:
    app = Celery(name, broker=BROKER, backend=BROKER)
    app.conf.update(result_expires=600, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    return app


def _tasks(app: Celery) -> None:
    @app.task(name="demo.thumbnail", shared=False)
    def thumbnail(ms: int) -> float:
        """Short work."""
        started = time.time()
        time.sleep(ms / 1000)
        return started

    @app.task(name="demo.transcode", shared=False)
    def transcode(ms: int) -> float:
        """Long work."""
        started = time.time()
        time.sleep(ms / 1000)
        return started


plain = _app("aitp_versus_plain")
_tasks(plain)

aitp = _app("aitp_versus")
_tasks(aitp)
celery_aitp.install(aitp, policy=POLICY,
                    key_prefix=os.environ.get("AITP_DEMO_PREFIX", "aitp-versus"))
