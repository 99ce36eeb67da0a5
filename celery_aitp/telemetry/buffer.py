"""A bounded buffer of records waiting to be written to the store.

Writers never block: when the buffer is full the oldest record is dropped and counted.
An item is a JSON-safe dict, or an object with a ``record()`` method (a Decision) that
the refresher turns into its dict when shipping, so the publish path builds nothing.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from celery_aitp.telemetry.counters import Counters


class RecordBuffer:
    """Bounded FIFO of records (dicts, or objects with ``record()``) for one store stream."""

    def __init__(self, name: str, counters: Counters, capacity: int = 10_000) -> None:
        self.name = name
        self._counters = counters
        self._items: deque[Any] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, record: Any) -> None:
        """Append without the lock: one deque append is atomic, and only the refresher
        takes records out (under the lock). Two publishers filling the last place at
        once may miss one drop in the count, never a record that was kept."""
        items = self._items
        if len(items) == items.maxlen:
            self._counters.incr(f"records_dropped:{self.name}")
        items.append(record)

    def take(self, limit: int = 5000) -> list[Any]:
        with self._lock:
            n = min(limit, len(self._items))
            return [self._items.popleft() for _ in range(n)]

    def put_back(self, records: list[Any]) -> None:
        """Return records whose write failed; the oldest are dropped (and counted) if full."""
        with self._lock:
            room = (self._items.maxlen or 0) - len(self._items)
            keep = records[len(records) - room :] if room < len(records) else records
            dropped = len(records) - len(keep)
            if dropped > 0:
                self._counters.incr(f"records_dropped:{self.name}", dropped)
            self._items.extendleft(reversed(keep))

    def __len__(self) -> int:
        return len(self._items)
