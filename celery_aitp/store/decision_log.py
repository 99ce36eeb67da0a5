"""The decisions stream with a lookup by task id, for ``celery aitp explain``.

Records are written packed: one entry of the capped ``decisions`` stream per flush (up
to 1000 records; field ``n`` their count, field ``p`` the batch, see
:mod:`celery_aitp.store.packed`). A batch holds each distinct decision once (the
``shared`` parts: everything but the task id and the times) and one short row per task
pointing at its part, so tasks that got the same decision (the decision memo's) cost a
few dozen bytes each instead of a whole record. An entry per task cost the store about as
much as publishing the task itself. In the same atomic script an index learns where each
task's latest decision is:

* ``decisions:index``: HASH task id -> id of the stream entry holding its latest decision
  (one HSET per entry, all its tasks at once);
* ``decisions:order``: LIST of ``#<entry id>|<records>|<JSON array of task ids>``, oldest
  first (entries written before packing: ``<entry id>|<task id>``);
* ``decisions:count``: how many records the stream holds.

The oldest entry is deleted, with the index entries that still point to it, while the
rest holds at least ``aitp_decision_maxlen`` records; an entry holds at most a tenth of
that, so the stream keeps between 1 and 1.1 times the cap. The index never holds more
entries than the stream keeps (about 100 bytes each), and a lookup is two commands,
whatever the stream's length. Each record is stamped with the digest of the policy that
decided it (``policy``), here in the refresher thread rather than on the publish path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from celery_aitp.store.packed import entry_records, row_json
from celery_aitp.store.redis_store import RedisStore, _text, translated_errors

_APPEND = """
local maxlen = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], redis.call('LLEN', KEYS[3]))
end
for i = 2, #ARGV, 3 do
  local id = redis.call('XADD', KEYS[1], '*', 'n', ARGV[i], 'p', ARGV[i + 1])
  local args = {}
  for _, task in ipairs(cjson.decode(ARGV[i + 2])) do
    args[#args + 1] = task
    args[#args + 1] = id
  end
  if #args > 0 then redis.call('HSET', KEYS[2], unpack(args)) end
  redis.call('RPUSH', KEYS[3], '#' .. id .. '|' .. ARGV[i] .. '|' .. ARGV[i + 2])
  redis.call('INCRBY', KEYS[4], tonumber(ARGV[i]))
end
local total = tonumber(redis.call('GET', KEYS[4]))
while total > maxlen do
  local entry = redis.call('LINDEX', KEYS[3], 0)
  if not entry then
    total = 0
    break
  end
  local id, n, tasks
  if string.sub(entry, 1, 1) == '#' then
    local a = string.find(entry, '|', 2, true)
    local b = string.find(entry, '|', a + 1, true)
    id = string.sub(entry, 2, a - 1)
    n = tonumber(string.sub(entry, a + 1, b - 1))
    tasks = cjson.decode(string.sub(entry, b + 1))
  else
    local sep = string.find(entry, '|', 1, true)
    id = string.sub(entry, 1, sep - 1)
    n = 1
    tasks = {string.sub(entry, sep + 1)}
  end
  if total - n < maxlen then break end  -- keep at least maxlen records
  redis.call('LPOP', KEYS[3])
  if #tasks > 0 then
    local current = redis.call('HMGET', KEYS[2], unpack(tasks))
    local dead = {}
    for k, task in ipairs(tasks) do
      if current[k] == id then dead[#dead + 1] = task end
    end
    if #dead > 0 then redis.call('HDEL', KEYS[2], unpack(dead)) end
  end
  redis.call('XDEL', KEYS[1], id)
  total = total - n
end
redis.call('SET', KEYS[4], total)
return 1
"""
#: Most records per stream entry (Lua's ``unpack`` takes a few thousand values at most);
#: also at most a tenth of the cap, so trimming whole entries stays close to it.
_CHUNK = 1000
#: Stream entries written per script call.
_ENTRIES_PER_CALL = 5


class DecisionLog:
    """Append decision records (indexed by task id) and find one by task id."""

    def __init__(self, store: RedisStore, maxlen: int, policy_digest: str | None = None) -> None:
        self.store = store
        self.maxlen = maxlen
        self.policy_digest = policy_digest
        self.stream = store.keys.decisions
        self.index = store.keys.any("decisions", "index")
        self.order = store.keys.any("decisions", "order")
        self.count = store.keys.any("decisions", "count")
        self.chunk = max(1, min(_CHUNK, maxlen // 10))
        self._script = store.client.register_script(_APPEND)

    def append(self, records: Iterable[Any]) -> int:
        """Write records (dicts, or decisions with ``record_parts()``), up to ``chunk`` per
        stream entry and five entries per script call; raises StoreError."""
        stamp = (f',"policy":{json.dumps(self.policy_digest)}}}'
                 if self.policy_digest is not None else "}")
        batch = _Batch(stamp)
        args: list[Any] = []
        n = 0
        with translated_errors():
            for item in records:
                if hasattr(item, "record_parts"):  # a decision: its shared part once
                    batch.add_decision(item)
                else:
                    record = _as_record(item)
                    if self.policy_digest is not None:
                        record.setdefault("policy", self.policy_digest)
                    batch.add_record(record)
                n += 1
                if len(batch.rows) >= self.chunk:
                    args += batch.entry()
                    batch = _Batch(stamp)
                    if len(args) >= 3 * _ENTRIES_PER_CALL:
                        self._call(args)
                        args = []
            if batch.rows:
                args += batch.entry()
            if args:
                self._call(args)
        return n

    def _call(self, args: list[Any]) -> None:
        # EVALSHA straight away (a pipeline would check SCRIPT EXISTS on every flush)
        self._script(keys=[self.stream, self.index, self.order, self.count],
                     args=[self.maxlen, *args])

    def find(self, task_id: str) -> dict[str, Any] | None:
        """The latest decision recorded for ``task_id``, or None."""
        with translated_errors():
            entry = self.store.client.hget(self.index, task_id)
            if entry is None:
                return None
            found = self.store.client.xrange(self.stream, _text(entry), _text(entry))
        for _id, fields in found or ():
            for doc in reversed(entry_records(fields)):  # the latest of a retried task
                if doc.get("task_id") == task_id:
                    return doc
        return None

    def size(self) -> int:
        with translated_errors():
            return int(self.store.client.hlen(self.index))


class _Batch:
    """One stream entry being built: shared parts (JSON objects), rows, task ids."""

    def __init__(self, stamp: str) -> None:
        self.stamp = stamp  # closes each shared part (with the policy digest, if any)
        self.shared: list[str] = []
        self.index: dict[Any, int] = {}
        self.rows: list[str] = []
        self.ids: list[str] = []

    def add_decision(self, item: Any) -> None:
        parts = item.record_parts()
        i = self.index.get(parts)
        if i is None:
            i = self.index[parts] = len(self.shared)
            self.shared.append(parts[0] + parts[1] + self.stamp)
        task_id = item.task_id
        self.rows.append(row_json(i, task_id, item.decided_at, item.origin_at))
        if task_id:
            self.ids.append(task_id)

    def add_record(self, record: dict[str, Any]) -> None:
        """A record that is not a decision: whole, as its own shared part."""
        self.rows.append(f"[{len(self.shared)}]")
        self.shared.append(json.dumps(record, default=str))
        task_id = record.get("task_id")
        if task_id:
            self.ids.append(str(task_id))

    def entry(self) -> list[Any]:
        """Script arguments of the entry: its record count, batch, task ids."""
        payload = f'{{"s":[{",".join(self.shared)}],"r":[{",".join(self.rows)}]}}'
        return [len(self.rows), payload, json.dumps(self.ids, ensure_ascii=False)]


def _as_record(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    return dict(item.record())
