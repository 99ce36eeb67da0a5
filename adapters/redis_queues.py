"""Queue depth, age and atomic evacuation on the Redis transport.

Kombu keeps one Redis list per queue and priority step (``q``, ``q<sep>3``, ...);
producers LPUSH and consumers BRPOP, so the oldest message is at the right end.
A move is one Lua script per batch: each message leaves the source and enters the
destination in the same atomic step, so none is lost or duplicated, even if the
mover dies half way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import redis

from celery_aitp.core.request import read_header
from celery_aitp.errors import AdapterError
from celery_aitp.store.redis_store import connect

DEFAULT_STEPS = (0, 3, 6, 9)
DEFAULT_SEP = "\x06\x16"
BATCH = 500

# Moves up to ARGV[3] messages from KEYS[1] to KEYS[2], newest first onto the consuming
# end, so they keep their order and are served before the destination's own backlog.
# The routing key recorded in each message is rewritten, so a retry or a redelivery
# of a moved task follows it instead of going back to the orphaned queue: the *last*
# match, the one in ``properties.delivery_info``, which kombu writes after the user's
# headers (a header holding the same text is left as it was).
_MOVE = """
local moved = 0
local limit = tonumber(ARGV[3])
while moved < limit do
  local item = redis.call('LPOP', KEYS[1])
  if not item then break end
  local s, e = string.find(item, ARGV[1], 1, true)
  while s do
    local s2, e2 = string.find(item, ARGV[1], e + 1, true)
    if not s2 then break end
    s, e = s2, e2
  end
  if s then item = string.sub(item, 1, s - 1) .. ARGV[2] .. string.sub(item, e + 1) end
  redis.call('RPUSH', KEYS[2], item)
  moved = moved + 1
end
return moved
"""


# The depth of each queue in KEYS: the sum of its priority-step lists (ARGV[1] is the
# separator, ARGV[2..] the steps; step 0 is the queue's own name). One round trip and one
# reply per queue however many queues (thousands with many tenants); the step lists are
# named from the queue's (kombu's Redis transport is not clustered, so they share a node).
_DEPTHS = """
local out = {}
for i = 1, #KEYS do
  local total = 0
  for j = 2, #ARGV do
    local key = KEYS[i]
    if ARGV[j] ~= '0' then key = key .. ARGV[1] .. ARGV[j] end
    total = total + redis.call('LLEN', key)
  end
  out[i] = total
end
return out
"""
#: Queues per depth script call (keeps each call short on the server).
DEPTH_CHUNK = 2000


class RedisQueueOps:
    """QueueOps for a Celery app whose broker is Redis."""

    def __init__(self, app: Any) -> None:
        options = app.conf.broker_transport_options or {}
        self.steps = tuple(options.get("priority_steps") or DEFAULT_STEPS)
        self.sep = options.get("sep", DEFAULT_SEP)
        #: kombu's ``global_keyprefix``: it writes every queue's lists under it
        self.prefix = str(options.get("global_keyprefix") or "")
        self.client = connect(app.conf.broker_url, timeout_s=5.0)
        self._move = self.client.register_script(_MOVE)
        self._depths = self.client.register_script(_DEPTHS)

    def keys_of(self, queue: str) -> list[str]:
        """Every list kombu may keep for ``queue``, highest message priority first."""
        name = self.prefix + queue
        return [name if step == 0 else f"{name}{self.sep}{step}" for step in self.steps]

    def depths(self, queues: Iterable[str]) -> dict[str, int]:
        queues = list(dict.fromkeys(queues))
        depths: dict[str, int] = {}
        try:
            for start in range(0, len(queues), DEPTH_CHUNK):
                chunk = queues[start:start + DEPTH_CHUNK]
                counts = self._depths(keys=[self.prefix + q for q in chunk],
                                      args=[self.sep, *self.steps])
                depths.update(zip(chunk, (int(c) for c in counts), strict=True))
        except (redis.RedisError, OSError) as exc:
            raise AdapterError(f"redis queue depth failed: {exc}") from exc
        return depths

    def oldest_ages(self, queues: Iterable[str], now: float) -> dict[str, float | None]:
        ages: dict[str, float | None] = {}
        try:
            for q in queues:
                oldest = [self.client.lindex(key, -1) for key in self.keys_of(q)]
                stamps = [s for s in map(_decided_at, oldest) if s is not None]
                ages[q] = max(0.0, now - min(stamps)) if stamps else None
        except (redis.RedisError, OSError) as exc:
            raise AdapterError(f"redis queue age failed: {exc}") from exc
        return ages

    def move_all(self, source: str, destination: str) -> int:
        old = json.dumps({"routing_key": source})[1:-1]
        new = json.dumps({"routing_key": destination})[1:-1]
        moved = 0
        try:
            for src, dst in zip(self.keys_of(source), self.keys_of(destination), strict=True):
                while True:
                    n = int(self._move(keys=[src, dst], args=[old, new, BATCH]))
                    moved += n
                    if n < BATCH:
                        break
        except (redis.RedisError, OSError) as exc:
            raise AdapterError(f"redis move {source} -> {destination} failed: {exc}") from exc
        return moved

    def close(self) -> None:
        self.client.close()


def _decided_at(raw: Any) -> float | None:
    """The ``aitp.decided_at`` stamp of a raw kombu message, if it has one."""
    if raw is None:
        return None
    try:
        headers = json.loads(raw).get("headers") or {}
        stamp = (read_header(headers.get("aitp")) or {}).get("decided_at")
        return float(stamp) if stamp is not None else None
    except (ValueError, TypeError, AttributeError):
        return None
