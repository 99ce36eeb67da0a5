"""In-memory stand-ins for every port, for unit tests and the memory:// broker."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any


class MemoryQueueOps:
    """Queues as in-process deques of (decided_at, payload) pairs."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.queues: dict[str, deque[tuple[float, Any]]] = defaultdict(deque)

    def depths(self, queues: Iterable[str]) -> dict[str, int]:
        return {q: len(self.queues.get(q, ())) for q in queues}

    def oldest_ages(self, queues: Iterable[str], now: float) -> dict[str, float | None]:
        return {q: (now - self.queues[q][0][0]) if self.queues.get(q) else None for q in queues}

    def move_all(self, source: str, destination: str) -> int:
        moved = 0
        src = self.queues.get(source)
        while src:
            self.queues[destination].append(src.popleft())
            moved += 1
        return moved

    def close(self) -> None:
        pass


class NoAccelerators:
    """A host with no accelerator (the CPU-only default)."""

    def classes(self) -> list[str]:
        return []
