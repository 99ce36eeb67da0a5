"""Waiting in integration tests: for a condition, and for a worker's advertisement to
reach the store and a producer's view."""

from __future__ import annotations

import time
from typing import Any


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """``predicate()``'s first true value, polled every 0.1 s; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_live(proj: Any, queue: str, timeout: float = 15) -> None:
    """Until ``queue`` is advertised; then refresh the producer's view of it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if queue in proj.app.aitp.store.live_queues():
            proj.app.aitp.live.refresh()
            return
        time.sleep(0.1)
    raise AssertionError(f"{queue} never advertised")
