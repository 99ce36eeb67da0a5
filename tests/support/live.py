"""Waiting in integration tests: for a condition, and for a worker's advertisement to
reach the store and a producer's view; a producer process publishing meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running_producer(seconds: float = 60) -> Iterator[list[list[str]]]:
    """``tests.support.producer`` publishing in its own process during the block; after
    it, the list holds one ``[time, stage, policy digest]`` row per task it published."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.producer", str(seconds)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT),
                            stdout=subprocess.PIPE, text=True)
    published: list[list[str]] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # it publishes
        yield published
    finally:
        proc.kill()  # by its pid; what it printed stays readable in the pipe
        proc.wait()
    assert proc.stdout is not None
    published.extend(line.split() for line in proc.stdout.read().splitlines())


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
