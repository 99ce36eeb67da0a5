"""In-memory stand-ins for every port, for unit tests and the memory:// broker."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any

from celery_aitp.ports import AcceleratorUsage


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
    """A host with no accelerator (the CPU-only default).

    ``usage`` says "cannot tell" rather than "none used": a run on a CPU-only host tells
    nothing about whether the task would use a GPU where there is one.
    """

    def classes(self) -> list[str]:
        return []

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        return None


class FixedAccelerator:
    """A probe that reports a fixed answer: for tests and simulations."""

    def __init__(self, accelerator: str | None = "gpu", memory_mb: float | None = None) -> None:
        self.answer = AcceleratorUsage(accelerator, memory_mb)

    def classes(self) -> list[str]:
        return [self.answer.accelerator] if self.answer.accelerator else []

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        return self.answer
