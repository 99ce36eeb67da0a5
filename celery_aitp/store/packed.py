"""Reading stream entries that hold one record (field ``r``) or a packed batch (``b``).

Observations are written one record per entry. Decisions are written as one entry per
flush holding a JSON array of records (field ``b``, with ``n`` their count), because a
stream entry per task cost the store about as much as publishing the task itself.
Every reader of a record stream goes through :func:`entry_records`, so both shapes
(and streams written before decisions were packed) read the same way.
"""

from __future__ import annotations

import json
from typing import Any


def _field(fields: Any, name: bytes) -> Any:
    if not isinstance(fields, dict):
        return None
    found = fields.get(name)
    return fields.get(name.decode()) if found is None else found


def entry_records(fields: Any) -> list[dict[str, Any]]:
    """The records of one stream entry, in the order written; bad input gives []."""
    raw = _field(fields, b"r")
    if raw is not None:
        try:
            doc = json.loads(raw)
        except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
            return []
        return [doc] if isinstance(doc, dict) else []
    raw = _field(fields, b"b")
    if raw is None:
        return []
    try:
        docs = json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return []
    if not isinstance(docs, list):
        return []
    return [doc for doc in docs if isinstance(doc, dict)]


def entry_size(fields: Any) -> int:
    """How many records an entry holds (its ``n`` field; 1 for a single record)."""
    raw = _field(fields, b"n")
    if raw is None:
        return 1
    try:
        return max(1, int(raw))
    except (TypeError, ValueError):
        return 1
