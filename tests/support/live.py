"""Waiting for a worker's advertisement to reach the store and a producer's view."""

from __future__ import annotations

import time
from typing import Any


def wait_live(proj: Any, queue: str, timeout: float = 15) -> None:
    """Until ``queue`` is advertised; then refresh the producer's view of it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if queue in proj.app.aitp.store.live_queues():
            proj.app.aitp.live.refresh()
            return
        time.sleep(0.1)
    raise AssertionError(f"{queue} never advertised")
