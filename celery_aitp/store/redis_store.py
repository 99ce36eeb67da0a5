"""The shared store on Redis: who serves which queue, the live stage, counters, records.

Every method is a single round trip (a pipeline where several keys are involved) and
raises :class:`StoreError` on any Redis failure, so callers have one thing to catch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_aitp.errors import StageConflict, StoreError
from celery_aitp.redact import redact
from celery_aitp.store.keys import Keys
from celery_aitp.store.packed import entry_records

HISTORY_LIMIT = 1000
# Appends each ARGV[2..] as one entry {r: <json>} to a capped stream: one atomic command
# for a whole batch instead of one XADD each (a tenth of the client-side CPU per record).
_APPEND = """
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'r', ARGV[i])
end
return #ARGV - 1
"""
# Liveness is judged by one clock, the Redis server's, never a process's: a worker or a
# producer whose clock is off would otherwise see live advertisements as expired (or
# delete other workers' ones). Each script reads TIME; Lua numbers come back as integers,
# so times travel as text ('%.6f', seconds). Writes after TIME need effects replication
# (the default since Redis 5; replicate_commands turns it on before that).
_CLOCK = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local stamp = string.format('%.6f', now)
"""
# KEYS: consumers, workers. ARGV: ttl_s, worker, its document's JSON up to the value of
# "heartbeat" (the script appends the server time and '}'), how many members to remove,
# those members, then the members to add ('<queue>|<worker>', scored by expiry).
_ADVERTISE = _CLOCK + """
local expiry = string.format('%.6f', now + tonumber(ARGV[1]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', stamp)
local gone = tonumber(ARGV[4])
for i = 5, 4 + gone do redis.call('ZREM', KEYS[1], ARGV[i]) end
for i = 5 + gone, #ARGV do redis.call('ZADD', KEYS[1], expiry, ARGV[i]) end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. stamp .. '}')
return stamp
"""
# The members of KEYS[1] (the consumers zset) whose expiry has not passed on the server.
_LIVE = """
local t = redis.call('TIME')
return redis.call('ZRANGEBYSCORE', KEYS[1],
                  string.format('%d.%06d', tonumber(t[1]), tonumber(t[2])), '+inf')
"""
# HSET KEYS[1] ARGV[1] to ARGV[2] (a JSON object up to a time field's value) + the
# server time + '}'.
_STAMPED_HSET = _CLOCK + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. stamp .. '}')
return stamp
"""
#: Worker documents (and occupancy reports) whose own time is older than this are pruned.
STALE_AFTER_S = 3600.0
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))
#: ``write_stage(expect=ANY)``: write whatever is stored now.
ANY: Any = object()


def redis_url_for(url: str) -> str:
    """Translate a Celery/kombu Redis URL into one redis-py understands."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    if url.startswith("socket://"):
        return "unix://" + url[len("socket://") :]
    return url


def connect(url: str, timeout_s: float = 0.5) -> redis.Redis:
    """A client with explicit timeouts, so a dead store can never hang a publisher."""
    return redis.Redis.from_url(
        redis_url_for(url),
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        decode_responses=False,
        retry=Retry(NoBackoff(), 0),  # fail fast; the caller falls back and tries next round
    )


@contextmanager
def translated_errors() -> Iterator[None]:
    """Redis and socket errors as StoreError, passwords masked: one error type for callers."""
    try:
        yield
    except (redis.RedisError, OSError) as exc:
        raise StoreError(redact(f"store unreachable: {type(exc).__name__}: {exc}")) from exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisStore:
    """Store operations on one Redis database, keys under ``keys.prefix``."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self._append = client.register_script(_APPEND)
        self._advertise = client.register_script(_ADVERTISE)
        self._live = client.register_script(_LIVE)
        self._stamped_hset = client.register_script(_STAMPED_HSET)

    # --- liveness ---------------------------------------------------------------

    def advertise(
        self, worker: str, queues: Iterable[str], info: Mapping[str, Any], ttl_s: float
    ) -> None:
        """Declare that ``worker`` consumes ``queues`` for the next ``ttl_s`` seconds, and
        no longer the queues it advertised before and left out now (at once, not when
        their advertisement expires).

        Expiry, pruning and the ``heartbeat`` are the Redis server's time (one script), so
        a worker's clock never shortens or stretches an advertisement, nor prunes the
        live ones of others."""
        members = list(dict.fromkeys(f"{q}|{worker}" for q in queues))
        queue_names = sorted(m.rsplit("|", 1)[0] for m in members)
        doc = {**info, "worker": worker, "queues": queue_names}
        with translated_errors():
            before = _json_or_none(self.client.hget(self.keys.workers, worker))
            left = before.get("queues") if isinstance(before, dict) else None
            gone = [f"{q}|{worker}" for q in left if isinstance(q, str)
                    and f"{q}|{worker}" not in members] if isinstance(left, list) else []
            self._advertise(keys=[self.keys.consumers, self.keys.workers],
                            args=[repr(float(ttl_s)), worker,
                                  _stamped_prefix(doc, "heartbeat"), len(gone), *gone,
                                  *members])

    def withdraw(self, worker: str) -> None:
        """Remove a worker's advertisements at once (clean shutdown)."""
        with translated_errors():
            members = [
                m for m in map(_text, self.client.zrange(self.keys.consumers, 0, -1))
                if m.endswith(f"|{worker}")
            ]
            pipe = self.client.pipeline(transaction=False)
            if members:
                pipe.zrem(self.keys.consumers, *members)
            pipe.hdel(self.keys.workers, worker)
            pipe.execute()

    def live_queues(self) -> frozenset[str]:
        """Queues with at least one advertisement unexpired by the server's clock."""
        with translated_errors():
            raw = self._live(keys=[self.keys.consumers])
        return _queues_of(raw)

    def server_time(self) -> float:
        """The Redis server's clock (seconds), the one liveness is judged by."""
        with translated_errors():
            return _seconds(self.client.time())

    def workers(self) -> list[dict[str, Any]]:
        """Every advertised worker's description; stale ones are pruned."""
        return self.workers_at()[1]

    def workers_at(self) -> tuple[float, list[dict[str, Any]]]:
        """The server's time and every advertised worker's description (read together,
        so ``now - heartbeat`` is a heartbeat's age whatever this process's clock says);
        those not heard from in :data:`STALE_AFTER_S` are pruned."""
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(self.keys.workers)
            clock, raw = pipe.execute()
        now = _seconds(clock)
        docs = self._fresh(self.keys.workers, raw, "heartbeat", now)
        return now, sorted(docs, key=lambda d: str(d.get("worker")))

    def put_stamped(self, key: str, field: str, doc: Mapping[str, Any],
                    stamp: str = "at") -> float:
        """HSET ``key`` ``field`` to ``doc`` as JSON, with ``stamp`` set to the server's
        time (returned): a report whose age anyone can judge by the same clock."""
        with translated_errors():
            return float(self._stamped_hset(keys=[key],
                                            args=[field, _stamped_prefix(doc, stamp)]))

    def read_stamped(self, key: str, stamp: str = "at"
                     ) -> tuple[float, list[dict[str, Any]]]:
        """The server's time and the JSON documents of hash ``key`` (one round trip);
        documents whose ``stamp`` is older than :data:`STALE_AFTER_S`, or missing or
        unreadable, are deleted (a worker killed without cleaning up leaves its own)."""
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(key)
            clock, raw = pipe.execute()
        now = _seconds(clock)
        return now, self._fresh(key, raw, stamp, now)

    def _fresh(self, key: str, raw: Mapping[Any, Any], stamp: str, now: float
               ) -> list[dict[str, Any]]:
        """The documents of a hash read at server time ``now`` whose ``stamp`` is within
        :data:`STALE_AFTER_S`; the others are deleted from ``key``."""
        docs, stale = [], []
        horizon = now - STALE_AFTER_S
        for name, value in raw.items():
            doc = _json_or_none(value)
            beat = doc.get(stamp) if isinstance(doc, dict) else None
            if isinstance(beat, (int, float)) and beat >= horizon:  # also drops NaN
                docs.append(doc)
            else:
                stale.append(name)
        if stale:
            with translated_errors():
                self.client.hdel(key, *stale)
        return docs

    # --- stage ------------------------------------------------------------------

    def read_stage(self) -> dict[str, Any] | None:
        """The live stage document, or None if none was ever set."""
        with translated_errors():
            raw = self.client.hget(self.keys.stage, "doc")
        return _json_or_none(raw)

    def write_stage(self, doc: Mapping[str, Any], who: str, why: str | None = None,
                    expect: Any = ANY) -> dict[str, Any] | None:
        """Replace the stage document and append the change to the audit log; returns the old.

        Read, write and log happen in one optimistic transaction (WATCH), so the logged
        ``old`` is exactly what was replaced even with concurrent writers. With
        ``expect``, the write happens only if the stored document still equals it
        (compare-and-set, for the guard); otherwise :class:`StageConflict` is raised.
        """
        key = self.keys.stage
        with translated_errors(), self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    old = _json_or_none(pipe.hget(key, "doc"))
                    if expect is not ANY and old != expect:
                        raise StageConflict(f"the stage changed meanwhile (now {old!r})")
                    entry = {"at": time.time(), "who": who, "why": why, "old": old,
                             "new": dict(doc)}
                    pipe.multi()
                    pipe.hset(key, "doc", json.dumps(dict(doc)))
                    pipe.lpush(self.keys.stage_history, json.dumps(entry))
                    pipe.ltrim(self.keys.stage_history, 0, HISTORY_LIMIT - 1)
                    pipe.execute()
                    return old if isinstance(old, dict) else None
                except redis.WatchError:
                    continue

    def stage_history(self, limit: int = 50) -> list[dict[str, Any]]:
        with translated_errors():
            raw = self.client.lrange(self.keys.stage_history, 0, max(0, limit - 1))
        return [doc for doc in map(_json_or_none, raw) if isinstance(doc, dict)]

    # --- the snapshot the publish path caches -----------------------------------

    def snapshot(self) -> tuple[frozenset[str], dict[str, Any] | None, str | None]:
        """Live queues (by the server's clock), stage document and model version in one
        round trip."""
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)
            # the script's text, not EVALSHA: a pipeline with registered scripts asks
            # the server first whether it has them (one more round trip every refresh)
            pipe.eval(_LIVE, 1, self.keys.consumers)
            pipe.hget(self.keys.stage, "doc")
            pipe.hget(self.keys.model, "version")
            consumers, stage, version = pipe.execute()
        return _queues_of(consumers), _json_or_none(stage), _text(version) if version else None

    # --- counters and records ---------------------------------------------------

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add to fleet-wide counters (producers batch these; never one call per task)."""
        if not counts:
            return
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)
            for name, n in counts.items():
                pipe.hincrby(self.keys.counters, name, int(n))
            pipe.execute()

    def counts(self) -> dict[str, int]:
        with translated_errors():
            raw = self.client.hgetall(self.keys.counters)
        out = {}
        for k, v in raw.items():
            try:
                out[_text(k)] = int(v)
            except ValueError:  # not written by HINCRBY: ignored
                continue
        return out

    def append_records(
        self, stream: str, records: Iterable[Mapping[str, Any] | str], maxlen: int
    ) -> int:
        """Append records (dicts, or their JSON text) to a capped stream; returns how many."""
        texts = [r if type(r) is str else _ENCODER.encode(r) for r in records]
        if texts:
            with translated_errors():
                self._append(keys=[stream], args=[int(maxlen), *texts])
        return len(texts)

    def read_records(
        self, stream: str, count: int | None = None, newest_first: bool = False
    ) -> list[dict[str, Any]]:
        """Records of a stream, oldest first unless ``newest_first``; bad entries skipped."""
        with translated_errors():
            if newest_first:
                raw = self.client.xrevrange(stream, count=count)
            else:
                raw = self.client.xrange(stream, count=count)
        out: list[dict[str, Any]] = []
        for _id, fields in raw or ():  # an entry may hold a packed batch (decisions)
            docs = entry_records(fields)
            out.extend(reversed(docs) if newest_first else docs)
        return out if count is None else out[:count]

    def try_lock(self, key: str, ttl_s: float, owner: str) -> bool:
        """Take a short expiring lock; True if this caller holds it now."""
        with translated_errors():
            return bool(self.client.set(key, owner, nx=True, px=max(1, int(ttl_s * 1000))))

    def release_lock(self, key: str, owner: str) -> bool:
        """Give up a lock taken with :meth:`try_lock`, only if ``owner`` still holds it."""
        with translated_errors():
            return bool(self.client.eval(_RELEASE, 1, key, owner))

    def extend_lock(self, key: str, ttl_s: float, owner: str) -> bool:
        """Reset the expiry of a lock taken with :meth:`try_lock` to ``ttl_s``, only if
        ``owner`` still holds it; False if it expired or another holds it now."""
        with translated_errors():
            return bool(self.client.eval(_EXTEND, 1, key, owner,
                                         max(1, int(ttl_s * 1000))))

    def ping(self) -> bool:
        try:
            with translated_errors():
                return bool(self.client.ping())
        except StoreError:
            return False


#: Delete a lock only when its value is the caller's owner name (no one else's lock).
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) end return 0")

#: Extend a lock's expiry only when its value is the caller's owner name.
_EXTEND = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
           "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0")


def _seconds(clock: Any) -> float:
    """TIME's answer (seconds, microseconds) as seconds."""
    seconds, micros = clock
    return int(seconds) + int(micros) / 1_000_000


def _stamped_prefix(doc: Mapping[str, Any], stamp: str) -> str:
    """``doc`` as JSON up to the value of the field ``stamp``, left for a script to
    write (the server's time, then ``}``)."""
    rest = json.dumps({k: v for k, v in doc.items() if k != stamp})[:-1]
    return f"{rest}{', ' if rest != '{' else ''}{json.dumps(stamp)}: "


def _queues_of(members: Iterable[Any]) -> frozenset[str]:
    return frozenset(_text(m).rsplit("|", 1)[0] for m in members)


def _json_or_none(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested too deep
        return None
