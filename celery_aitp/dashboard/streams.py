"""Follow a capped store stream incrementally: new records once, plus a recent window.

The first poll back-fills the window from the newest entries (so pages have data at
once) but reports nothing as new: cumulative figures (Prometheus counters and
histograms) count only what arrived while this process was watching, so a restarted
dashboard looks like an ordinary counter reset, not a burst.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from celery_aitp.store.packed import entry_records
from celery_aitp.store.redis_store import translated_errors

BATCH = 2000
MAX_BATCHES_PER_POLL = 10
#: Entries read per backwards page (back-fill, search).
BACKFILL_PAGE = 500


def _decode(entry_id: Any, fields: Any) -> tuple[str, float, list[dict[str, Any]]] | None:
    """The entry's id, its write time, and its records (one, or a packed batch)."""
    sid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    docs = entry_records(fields)
    if not docs:
        return None
    try:
        at = int(sid.split("-", 1)[0]) / 1000.0
    except ValueError:
        return None
    return sid, at, docs


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
            with translated_errors():
                raw = self.client.xrange(self.key, min=f"({self.cursor}", count=BATCH)
            for entry_id, fields in raw:
                self.cursor = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                decoded = _decode(entry_id, fields)
                if decoded is not None:
                    self.recent.extend((decoded[1], doc) for doc in decoded[2])
                    new.extend(decoded[2])
            if len(raw) < BATCH:
                break
        self._prune(now)
        return new

    def _backfill(self) -> None:
        wanted = self.recent.maxlen or 0
        with translated_errors():
            raw = self.client.xrevrange(self.key, count=max(1, min(wanted, BACKFILL_PAGE)))
        self.cursor = "0-0"
        if raw:
            first = raw[0][0]
            self.cursor = first.decode() if isinstance(first, bytes) else str(first)
        found: list[tuple[float, dict[str, Any]]] = []  # newest first
        while raw:
            for entry_id, fields in raw:
                decoded = _decode(entry_id, fields)
                if decoded is not None:
                    found.extend((decoded[1], doc) for doc in reversed(decoded[2]))
            if len(found) >= wanted or len(raw) < BACKFILL_PAGE:
                break  # a packed stream fills the window from a few entries
            last = raw[-1][0]
            with translated_errors():
                raw = self.client.xrevrange(self.key, max=f"({_sid(last)}",
                                            count=BACKFILL_PAGE)
        self.recent.extend(reversed(found[:wanted]))

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()

    def records(self) -> list[dict[str, Any]]:
        """The records of the window, oldest first."""
        return [doc for _, doc in list(self.recent)]  # list(): one atomic copy

    def find(self, field: str, value: str, scan_limit: int = 20_000) -> dict[str, Any] | None:
        """The newest record with ``field == value``: the window first, then the newest
        ``scan_limit`` records of the stream."""
        for _, doc in reversed(list(self.recent)):  # the refresher may append meanwhile
            if doc.get(field) == value:
                return doc
        scanned = 0
        top = "+"
        while scanned < scan_limit:
            with translated_errors():
                raw = self.client.xrevrange(self.key, max=top, count=BACKFILL_PAGE)
            for entry_id, fields in raw:
                decoded = _decode(entry_id, fields)
                for doc in reversed(decoded[2]) if decoded is not None else ():
                    if doc.get(field) == value:
                        return doc
                scanned += len(decoded[2]) if decoded is not None else 1
            if len(raw) < BACKFILL_PAGE:
                break
            top = f"({_sid(raw[-1][0])}"
        return None


def _sid(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
