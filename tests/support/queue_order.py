"""What kombu's Redis transport does with a queue-order strategy, for unit tests."""

from __future__ import annotations

from collections import deque
from typing import Any


def brpop(cycle: Any, queues: dict[str, deque[Any]]) -> str | None:
    """One ``BRPOP``: the first non-empty queue in the strategy's order is served, and the
    strategy is told which (None: every offered queue was empty)."""
    for name in cycle.consume(len(cycle.items)):
        if queues[name]:
            queues[name].popleft()
            cycle.rotate(name)
            return name
    return None
