"""Stream entries of records: one record (field ``r``) or a packed batch (``p``, ``b``).

Observations are written one record per entry. Decisions are written as one entry per
flush (a stream entry per task cost the store about as much as publishing the task
itself), field ``n`` the number of records and field ``p`` the batch:

    {"s": [<shared part>, ...], "r": [<row>, ...]}

A shared part is a record without its task id and times (the JSON object every task
that got the same decision shares); a row is ``[i, task_id, decided_at]``, plus
``origin_at`` when it differs from ``decided_at`` (a retry), and stands for shared part
``i`` with those fields; a row ``[i]`` is shared part ``i`` as it is (a record that is
not a decision). Entries written before this layout hold a JSON array of whole records
in field ``b``. Every reader of a record stream goes through :func:`entry_records`, so
all shapes read the same way, and a malformed row is skipped, never raised.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from celery_aitp.numbers import json_number


def row_json(index: int, task_id: str, decided_at: Any, origin_at: Any) -> str:
    """One task's row of a packed batch (see the module docstring)."""
    at = json_number(decided_at)
    if origin_at is decided_at or origin_at == decided_at:
        return f"[{index},{_quote(task_id)},{at}]"
    return f"[{index},{_quote(task_id)},{at},{json_number(origin_at)}]"


def _field(fields: Any, name: bytes) -> Any:
    if not isinstance(fields, dict):
        return None
    found = fields.get(name)
    return fields.get(name.decode()) if found is None else found


def _json(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return None


def entry_records(fields: Any) -> list[dict[str, Any]]:
    """The records of one stream entry, in the order written; bad input gives []."""
    raw = _field(fields, b"r")
    if raw is not None:
        doc = _json(raw)
        return [doc] if isinstance(doc, dict) else []
    raw = _field(fields, b"p")
    if raw is not None:
        return _unpack(_json(raw))
    docs = _json(_field(fields, b"b"))
    if not isinstance(docs, list):
        return []
    return [doc for doc in docs if isinstance(doc, dict)]


def _unpack(batch: Any) -> list[dict[str, Any]]:
    if not isinstance(batch, dict):
        return []
    shared, rows = batch.get("s"), batch.get("r")
    if not isinstance(shared, list) or not isinstance(rows, list):
        return []
    out = []
    for row in rows:
        if not isinstance(row, list) or not row or type(row[0]) is not int or \
                not 0 <= row[0] < len(shared) or not isinstance(shared[row[0]], dict):
            continue
        record = dict(shared[row[0]])
        if len(row) >= 3:
            record["task_id"] = row[1]
            record["decided_at"] = row[2]
            record["origin_at"] = row[3] if len(row) > 3 else row[2]
        out.append(record)
    return out


def entry_size(fields: Any) -> int:
    """How many records an entry holds (its ``n`` field; 1 for a single record)."""
    raw = _field(fields, b"n")
    if raw is None:
        return 1
    try:
        return max(1, int(raw))
    except (TypeError, ValueError):
        return 1
