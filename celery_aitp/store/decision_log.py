"""The decisions stream with a lookup by task id, for ``celery aitp explain``.

Records go to the capped ``decisions`` stream as before (field ``r``: JSON), and in the
same atomic script an index learns where each task's latest decision is:

* ``decisions:index``: HASH task id -> stream entry id of its latest decision;
* ``decisions:order``: LIST of ``<entry id>|<task id>``, oldest first, trimmed to the
  stream's cap; trimming removes the index entry unless a newer decision replaced it.

So the index never holds more entries than the stream keeps (``aitp_decision_maxlen``,
about 100 bytes each), and a lookup is two commands, whatever the stream's length.
Each record is stamped with the digest of the policy that decided it (``policy``),
here in the refresher thread rather than on the publish path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.store.redis_store import RedisStore, _json_or_none, _text, _translated

_APPEND = """
local maxlen = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'r', ARGV[i + 1])
  if ARGV[i] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[i], id)
    redis.call('RPUSH', KEYS[3], id .. '|' .. ARGV[i])
  end
end
local excess = redis.call('LLEN', KEYS[3]) - maxlen
while excess > 0 do
  local n = math.min(excess, 1000)
  local old = redis.call('LPOP', KEYS[3], n)
  for _, entry in ipairs(old) do
    local sep = string.find(entry, '|', 1, true)
    local id = string.sub(entry, 1, sep - 1)
    local task = string.sub(entry, sep + 1)
    if redis.call('HGET', KEYS[2], task) == id then redis.call('HDEL', KEYS[2], task) end
  end
  excess = excess - n
end
return 1
"""
_CHUNK = 1000


class DecisionLog:
    """Append decision records (indexed by task id) and find one by task id."""

    def __init__(self, store: RedisStore, maxlen: int, policy_digest: str | None = None) -> None:
        self.store = store
        self.maxlen = maxlen
        self.policy_digest = policy_digest
        self.stream = store.keys.decisions
        self.index = store.keys.any("decisions", "index")
        self.order = store.keys.any("decisions", "order")
        self._script = store.client.register_script(_APPEND)

    def append(self, records: Iterable[Any]) -> int:
        """Write records (dicts, or decisions with ``record()``) in batches of 1000, one
        script call each; raises StoreError."""
        batch: list[str] = []
        n = 0
        with _translated():
            pipe = self.store.client.pipeline(transaction=False)
            stamp = (f',"policy":{json.dumps(self.policy_digest)}}}'
                     if self.policy_digest is not None else "}")
            for item in records:
                if hasattr(item, "record_json"):  # a Decision: the fast encoder, stamped
                    task_id, text = item.task_id, item.record_json()[:-1] + stamp
                else:
                    record = _as_record(item)
                    if self.policy_digest is not None:
                        record.setdefault("policy", self.policy_digest)
                    task_id, text = record.get("task_id"), json.dumps(record, default=str)
                batch += [str(task_id) if task_id else "", text]
                n += 1
                if len(batch) >= 2 * _CHUNK:
                    self._queue(pipe, batch)
                    batch = []
            if batch:
                self._queue(pipe, batch)
            if n:
                pipe.execute()
        return n

    def _queue(self, pipe: Any, batch: list[str]) -> None:
        self._script(keys=[self.stream, self.index, self.order], args=[self.maxlen, *batch],
                     client=pipe)

    def find(self, task_id: str) -> dict[str, Any] | None:
        """The latest decision recorded for ``task_id``, or None."""
        with _translated():
            entry = self.store.client.hget(self.index, task_id)
            if entry is None:
                return None
            found = self.store.client.xrange(self.stream, _text(entry), _text(entry))
        for _id, fields in found:
            doc = _json_or_none(fields.get(b"r") if isinstance(fields, dict) else None)
            if isinstance(doc, dict):
                return doc
        return None

    def size(self) -> int:
        with _translated():
            return int(self.store.client.hlen(self.index))


def _as_record(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    return dict(item.record())
