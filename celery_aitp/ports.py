"""Small interfaces to the outside world; adapters implement them, stubs fake them.

The core resolves an implementation through :mod:`celery_aitp.registry` and never
imports a driver itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class QueueOps(Protocol):
    """Broker-specific queue operations the middleware needs."""

    def depths(self, queues: Iterable[str]) -> dict[str, int]:
        """Messages waiting in each broker queue (all priority levels together).

        Names are the broker's (see :mod:`celery_aitp.layout`); a missing queue has 0.
        """
        ...

    def oldest_ages(self, queues: Iterable[str], now: float) -> dict[str, float | None]:
        """Seconds since the oldest waiting message of each queue was decided.

        None: the queue is empty, or the broker cannot tell (RabbitMQ).
        """
        ...

    def move_all(self, source: str, destination: str) -> int:
        """Move every waiting message from ``source`` to ``destination``.

        Each message must end up in exactly one of the two queues at every instant:
        nothing lost, nothing duplicated. Returns how many were moved.
        """
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class AcceleratorUsage:
    """What one run did on the host's accelerators."""

    accelerator: str | None  # class used during the run ('gpu'); None: none was used
    memory_mb: float | None = None  # accelerator memory the process held at the end
    utilisation: float | None = None  # highest utilisation seen during the run, percent


class AcceleratorProbe(Protocol):
    """Reports which accelerators this host has and what a process uses."""

    def classes(self) -> list[str]:
        """Accelerator classes present on this host, e.g. ['gpu'] or []."""
        ...

    def usage(self, pid: int, since: float) -> AcceleratorUsage | None:
        """What process ``pid`` used since ``since`` (epoch s); None if it cannot tell.

        Must never raise and should cost well under a millisecond: it runs after every
        task, in the pool process.
        """
        ...
