"""Exponentially decaying sums in one Redis hash, updated atomically by many writers.

A sample of ``amount`` added at time ``t`` is worth ``amount * 2 ** (-(now - t) / h)`` at
``now`` (half-life ``h``). Rather than rewriting every field as time passes, writers add
``amount * 2 ** ((t - ref) / h)`` against a reference time ``ref`` stored in the hash,
and readers multiply by ``2 ** (-(now - ref) / h)`` (Kubernetes' VPA keeps its decaying
histograms the same way). When the exponent grows large (32 half-lives) or the half-life
changes, the script rebases every field to a new reference in the same atomic step and
drops fields that have decayed to nothing, so a hash only holds what still matters.

Fields whose name starts with ``_`` do not decay: ``_ref`` and ``_hl`` (metadata) and any
raw counter a writer adds (e.g. ``_n``, the number of samples ever added).

The clock need not be time: with ``clock_field``, "now" is that raw counter of the hash
after the add (e.g. samples added so far), read inside the script, so sums decay by
count and every writer stamps its samples with the same clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from celery_aitp.store.redis_store import RedisStore, translated_errors

#: KEYS[1] the hash. ARGV: half-life, ttl s (0: none), now (a number, or the name of the
#: raw field that is the clock), then field/amount pairs (fields starting with '_' are
#: added as they are, the others decayed).
_ADD = """
local key = KEYS[1]
local hl = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  now = tonumber(redis.call('HGET', key, ARGV[3])) or 0
  for i = 4, #ARGV, 2 do
    if ARGV[i] == ARGV[3] then now = now + tonumber(ARGV[i + 1]) end
  end
end
local meta = redis.call('HMGET', key, '_ref', '_hl')
local ref = tonumber(meta[1])
local old_hl = tonumber(meta[2])
if not old_hl or old_hl ~= old_hl or old_hl <= 0 or old_hl == math.huge then old_hl = hl end
if not ref or ref ~= ref or ref == math.huge or ref == -math.huge then
  ref = now
  redis.call('HSET', key, '_ref', ref, '_hl', hl)
elseif old_hl ~= hl or (now - ref) / hl > 32 or (ref - now) / hl > 32 then
  local scale = 2 ^ (-(now - ref) / old_hl)
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '_' then
      local v = (tonumber(all[i + 1]) or 0) * scale
      if not (v >= 1e-9 and v < math.huge) then
        redis.call('HDEL', key, all[i])
      else
        redis.call('HSET', key, all[i], tostring(v))
      end
    end
  end
  ref = now
  redis.call('HSET', key, '_ref', ref, '_hl', hl)
end
local w = 2 ^ ((now - ref) / hl)
for i = 4, #ARGV, 2 do
  local field = ARGV[i]
  local amount = tonumber(ARGV[i + 1])
  if string.sub(field, 1, 1) ~= '_' then amount = amount * w end
  local current = redis.call('HGET', key, field)
  if current then  -- a value no writer of this script left (garbage, NaN, inf): reset
    local n = tonumber(current)
    if not n or n ~= n or n == math.huge or n == -math.huge then
      redis.call('HDEL', key, field)
    end
  end
  redis.call('HINCRBYFLOAT', key, field, tostring(amount))
end
if ttl > 0 then redis.call('EXPIRE', key, math.ceil(ttl)) end
return 1
"""


class DecayedSums:
    """Add to and read decaying sums; one script call per hash."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._script = store.client.register_script(_ADD)

    def add(self, pipe: Any, key: str, amounts: Mapping[str, float], now: float,
            half_life_s: float, ttl_s: float = 0.0, clock_field: str | None = None) -> None:
        """Queue an atomic add on ``pipe`` (a redis pipeline); nothing is sent yet. With
        ``clock_field`` (a ``_`` field), that counter after the add is "now", and
        ``now`` and ``half_life_s`` are in its units."""
        if clock_field is not None and not clock_field.startswith("_"):
            raise ValueError(f"clock_field {clock_field!r}: a raw field (starting with _)")
        args: list[Any] = [repr(float(half_life_s)), repr(float(ttl_s)),
                           clock_field or repr(float(now))]
        for field, amount in amounts.items():
            args += [field, repr(float(amount))]
        self._script(keys=[key], args=args, client=pipe)

    def add_now(self, key: str, amounts: Mapping[str, float], now: float,
                half_life_s: float, ttl_s: float = 0.0) -> None:
        """Add in its own round trip (raises StoreError)."""
        with translated_errors():
            pipe = self.store.client.pipeline(transaction=False)
            self.add(pipe, key, amounts, now, half_life_s, ttl_s)
            pipe.execute()


def decode_hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A redis hash reply as ``str -> str``."""
    return {_text(k): _text(v) for k, v in raw.items()}


def decayed_values(fields: Mapping[str, str],
                   now: float) -> tuple[dict[str, float], dict[str, float]]:
    """Decaying fields as worth at ``now``, and the raw ``_`` counters (metadata left out)."""
    try:
        ref = float(fields["_ref"])
        hl = float(fields["_hl"])
    except (KeyError, ValueError):
        return {}, {}
    if not (math.isfinite(ref) and math.isfinite(hl)):
        return {}, {}
    try:
        scale = 2.0 ** (-(now - ref) / hl) if hl > 0 else 0.0
    except OverflowError:  # a reference time far off for its half-life: not usable
        return {}, {}
    values: dict[str, float] = {}
    raw: dict[str, float] = {}
    for name, text in fields.items():
        if name in ("_ref", "_hl"):
            continue
        try:
            number = float(text)
        except ValueError:
            continue
        if not math.isfinite(number):  # not something the script writes: ignored
            continue
        if name.startswith("_"):
            raw[name] = number
        else:
            values[name] = number * scale
    return values, raw


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
