"""Reading observation records: from the store's capped stream, page by page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import redis

from celery_aitp.errors import StoreError
from celery_aitp.learn.dataset import Unreadable
from celery_aitp.store import RedisStore

PAGE = 5000


def stream_length(store: RedisStore) -> int:
    try:
        return int(store.client.xlen(store.keys.observations))
    except (redis.RedisError, OSError) as exc:
        raise StoreError(f"store unreachable: {exc}") from exc


def last_id(store: RedisStore) -> str | None:
    """Id of the newest observation (a trainer retrains only when it moved)."""
    try:
        newest = store.client.xrevrange(store.keys.observations, count=1)
    except (redis.RedisError, OSError) as exc:
        raise StoreError(f"store unreachable: {exc}") from exc
    if not newest:
        return None
    raw = newest[0][0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def count_after(store: RedisStore, entry_id: str, at_most: int) -> int:
    """How many observations came after entry ``entry_id``, counting up to ``at_most``.

    Counted by entry id, not by ``XLEN``: the stream is capped, and once full its length
    stays at the cap however many records arrive (an entry that was trimmed away still
    orders the newer ones). ``XRANGE`` with an exclusive start needs Redis 6.2."""
    if at_most <= 0:
        return 0
    try:
        newer = store.client.xrange(store.keys.observations, min="(" + entry_id, max="+",
                                    count=at_most)
    except (redis.RedisError, OSError) as exc:
        raise StoreError(f"store unreachable: {exc}") from exc
    return len(newer or ())


def store_records(store: RedisStore, limit: int | None = None) -> Iterator[Any]:
    """Observation records oldest first (the newest ``limit`` if given), in pages.

    Entries that are not JSON objects come out as skip markers, so they are counted.
    """
    key = store.keys.observations
    start = "-"
    if limit is not None:
        try:
            tail = store.client.xrevrange(key, count=limit)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        if not tail:
            return
        start = _entry_id(tail[-1][0])
    while True:
        try:
            page = store.client.xrange(key, min=start, count=PAGE)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        page = page or []
        for _id, fields in page:
            yield _decode(fields)
        if len(page) < PAGE:
            return
        start = "(" + _entry_id(page[-1][0])


def _decode(fields: Any) -> Any:
    raw = fields.get(b"r") if isinstance(fields, dict) else None
    try:
        doc = json.loads(raw) if raw is not None else None
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return Unreadable("not JSON")
    return doc if isinstance(doc, dict) else Unreadable("not a JSON object")


def _entry_id(value: Any) -> str:
    """A stream entry id as text (redis-py returns bytes without ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
