"""The decisions stream with a lookup by task id, for ``celery aitp explain``.

Records are written packed: one entry of the capped ``decisions`` stream per flush (up
to 1000 records: field ``b`` a JSON array, ``n`` its length; readers use
:func:`celery_aitp.store.packed.entry_records`). An entry per task cost the store
about as much as publishing the task itself. In the same atomic script an index learns
where each task's latest decision is:

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

from celery_aitp.store.packed import entry_records
from celery_aitp.store.redis_store import RedisStore, _text, translated_errors

_APPEND = """
local maxlen = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], redis.call('LLEN', KEYS[3]))
end
for i = 2, #ARGV, 3 do
  local id = redis.call('XADD', KEYS[1], '*', 'n', ARGV[i], 'b', ARGV[i + 1])
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
        """Write records (dicts, or decisions with ``record()``), up to ``chunk`` per
        stream entry and five entries per script call; raises StoreError."""
        stamp = (f',"policy":{json.dumps(self.policy_digest)}}}'
                 if self.policy_digest is not None else "}")
        texts: list[str] = []
        ids: list[str] = []
        args: list[Any] = []
        n = 0
        with translated_errors():
            for item in records:
                if hasattr(item, "record_json"):  # a Decision: the fast encoder, stamped
                    task_id, text = item.task_id, item.record_json()[:-1] + stamp
                else:
                    record = _as_record(item)
                    if self.policy_digest is not None:
                        record.setdefault("policy", self.policy_digest)
                    task_id, text = record.get("task_id"), json.dumps(record, default=str)
                texts.append(text)
                if task_id:
                    ids.append(str(task_id))
                n += 1
                if len(texts) >= self.chunk:
                    args += _entry(texts, ids)
                    texts, ids = [], []
                    if len(args) >= 3 * _ENTRIES_PER_CALL:
                        self._call(args)
                        args = []
            if texts:
                args += _entry(texts, ids)
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
        for _id, fields in found:
            for doc in reversed(entry_records(fields)):  # the latest of a retried task
                if doc.get("task_id") == task_id:
                    return doc
        return None

    def size(self) -> int:
        with translated_errors():
            return int(self.store.client.hlen(self.index))


def _entry(texts: list[str], ids: list[str]) -> list[Any]:
    """Script arguments of one stream entry: its record count, records, task ids."""
    return [len(texts), "[" + ",".join(texts) + "]", json.dumps(ids, ensure_ascii=False)]


def _as_record(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    return dict(item.record())
