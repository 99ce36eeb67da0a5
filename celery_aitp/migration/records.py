"""Reading a window of a capped record stream (observations, decisions) from the store.

Stream ids start with the millisecond the record was written, so "the runs recorded
since t" or "since the last id I read" is one XRANGE, not a scan of the whole stream.
"""

from __future__ import annotations

from typing import Any

from celery_aitp.store import RedisStore
from celery_aitp.store.packed import entry_records
from celery_aitp.store.redis_store import _text, translated_errors

#: Most records one read returns (a window larger than this is truncated, oldest kept).
MAX_RECORDS = 100_000


def _decode(entries: list[Any]) -> tuple[list[dict[str, Any]], str | None]:
    out: list[dict[str, Any]] = []
    last = None
    for entry_id, fields in entries:
        last = _text(entry_id)
        out.extend(entry_records(fields))  # one record, or a packed batch (decisions)
    return out, last


def records_since(store: RedisStore, stream: str, since: float | None = None,
                  after_id: str | None = None,
                  limit: int = MAX_RECORDS) -> tuple[list[dict[str, Any]], str | None]:
    """Records written after ``after_id`` (exclusive) or at/after Unix time ``since``.

    ``limit`` counts stream entries (a packed entry holds many records). Returns the
    records, oldest first, and the id of the last entry read (pass it back as
    ``after_id`` to read only what came next); the id is ``after_id`` when none came.
    """
    if after_id is not None:
        start = f"({after_id}"
    elif since is not None:
        start = str(max(0, int(since * 1000)))
    else:
        start = "-"
    with translated_errors():
        entries = store.client.xrange(stream, min=start, max="+", count=limit)
    records, last = _decode(entries or [])
    return records, last or after_id


def latest_records(store: RedisStore, stream: str, count: int) -> list[dict[str, Any]]:
    """The newest ``count`` records, oldest first."""
    with translated_errors():
        entries = store.client.xrevrange(stream, max="+", min="-", count=count)
    records, _ = _decode(list(reversed(entries or [])))
    return records[-count:] if count > 0 else []


def last_id(store: RedisStore, stream: str) -> str | None:
    """The id of the newest record (a cursor meaning "from now on"), None if empty."""
    with translated_errors():
        entries = store.client.xrevrange(stream, max="+", min="-", count=1)
    return _text(entries[0][0]) if entries else None
