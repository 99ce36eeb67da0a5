"""Follow a capped store stream incrementally: new records once, plus a recent window.

The first poll back-fills the window from the newest entries (so pages have data at
once) but reports nothing as new: cumulative figures (Prometheus counters and
histograms) count only what arrived while this process was watching, so a restarted
dashboard looks like an ordinary counter reset, not a burst.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from celery_aitp.errors import StoreError
from celery_aitp.redact import redact

BATCH = 2000
MAX_BATCHES_PER_POLL = 10


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (redis.RedisError, OSError) as exc:
        raise StoreError(redact(f"store unreachable: {type(exc).__name__}: {exc}")) from exc


def _decode(entry_id: Any, fields: Any) -> tuple[str, float, dict[str, Any]] | None:
    sid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    raw = fields.get(b"r", fields.get("r")) if isinstance(fields, dict) else None
    try:
        doc = json.loads(raw) if raw is not None else None
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested too deep
        return None
    if not isinstance(doc, dict):
        return None
    try:
        at = int(sid.split("-", 1)[0]) / 1000.0
    except ValueError:
        return None
    return sid, at, doc


class StreamTail:
    """Incremental reader of one stream of JSON records (field ``r``)."""

    def __init__(self, client: Any, key: str, window_s: float, max_recent: int) -> None:
        self.client = client
        self.key = key
        self.window_s = window_s
        self.cursor: str | None = None
        self.recent: deque[tuple[float, dict[str, Any]]] = deque(maxlen=max_recent)

    def poll(self, now: float) -> list[dict[str, Any]]:
        """Records appended since the last poll (none on the first, which back-fills)."""
        if self.cursor is None:
            self._backfill()
            self._prune(now)
            return []
        new: list[dict[str, Any]] = []
        for _ in range(MAX_BATCHES_PER_POLL):
            with _translated():
                raw = self.client.xrange(self.key, min=f"({self.cursor}", count=BATCH)
            for entry_id, fields in raw:
                self.cursor = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                decoded = _decode(entry_id, fields)
                if decoded is not None:
                    self.recent.append((decoded[1], decoded[2]))
                    new.append(decoded[2])
            if len(raw) < BATCH:
                break
        self._prune(now)
        return new

    def _backfill(self) -> None:
        with _translated():
            raw = self.client.xrevrange(self.key, count=self.recent.maxlen)
        self.cursor = "0-0"
        if raw:
            first = raw[0][0]
            self.cursor = first.decode() if isinstance(first, bytes) else str(first)
        for entry_id, fields in reversed(raw):
            decoded = _decode(entry_id, fields)
            if decoded is not None:
                self.recent.append((decoded[1], decoded[2]))

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()

    def records(self) -> list[dict[str, Any]]:
        """The records of the window, oldest first."""
        return [doc for _, doc in list(self.recent)]  # list(): one atomic copy

    def find(self, field: str, value: str, scan_limit: int = 20_000) -> dict[str, Any] | None:
        """The newest record with ``field == value``: the window first, then the stream."""
        for _, doc in reversed(list(self.recent)):  # the refresher may append meanwhile
            if doc.get(field) == value:
                return doc
        with _translated():
            raw = self.client.xrevrange(self.key, count=scan_limit)
        for entry_id, fields in raw:
            decoded = _decode(entry_id, fields)
            if decoded is not None and decoded[2].get(field) == value:
                return decoded[2]
        return None
