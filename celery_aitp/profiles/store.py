"""Profiles in the shared store: one decaying histogram hash per task name, plus an index.

Keys (under the deployment prefix):

* ``profile:<task>``: HASH of decaying bucket weights (``cpu:<i>``, ``cores:<i>``,
  ``mem:<i>``, ``acc:<class>``) and raw run counts (``_n``, ``_n:cpu``, ``_n:mem``,
  ``_n:acc``); it expires after ``8 * profiles.half_life_s`` without a new run.
* ``profiles``: HASH task -> time of its last update, so readers fetch only what changed.

Workers write (batched, from the background refresher); producers read (in a Source).
At most ``profiles.max_tasks`` task names are kept: beyond that the least recently run
ones are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_aitp.priority_policy import ProfileSettings
from celery_aitp.profiles.profile import ObservedProfile, observed_profile
from celery_aitp.store.decayed import DecayedSums, decayed_values, decode_hash
from celery_aitp.store.redis_store import RedisStore, _text, translated_errors

#: A histogram outlives its last run by this many half-lives (its weight is < 0.4% by then).
TTL_HALF_LIVES = 8
_READ_CHUNK = 500


class ProfileStore:
    """Read and write per-task resource histograms."""

    def __init__(self, store: RedisStore, settings: ProfileSettings) -> None:
        self.store = store
        self.settings = settings
        self.sums = DecayedSums(store)
        self.index = store.keys.any("profiles")

    def key(self, task: str) -> str:
        return self.store.keys.any("profile", task)

    def queue_writes(self, pipe: Any, batches: Mapping[str, Mapping[str, float]],
                     now: float) -> None:
        """Queue one atomic histogram update per task on ``pipe``, and the index update."""
        if not batches:
            return
        ttl = TTL_HALF_LIVES * self.settings.half_life_s
        for task, amounts in batches.items():
            self.sums.add(pipe, self.key(task), amounts, now, self.settings.half_life_s, ttl)
        pipe.hset(self.index, mapping=dict.fromkeys(batches, repr(now)))
        pipe.hlen(self.index)

    def trim(self, size: int) -> int:
        """Drop the least recently run tasks beyond ``max_tasks``; returns how many."""
        excess = size - self.settings.max_tasks
        if excess <= 0:
            return 0
        with translated_errors():
            index = self.store.client.hgetall(self.index)
            oldest = sorted(index.items(), key=lambda kv: float(kv[1]))[:excess]
            pipe = self.store.client.pipeline(transaction=False)
            for task, _ in oldest:
                pipe.delete(self.key(_text(task)))
                pipe.hdel(self.index, task)
            pipe.execute()
        return len(oldest)

    def read_index(self) -> dict[str, float]:
        with translated_errors():
            raw = self.store.client.hgetall(self.index)
        out = {}
        for task, stamp in raw.items():
            try:
                out[_text(task)] = float(stamp)
            except ValueError:
                continue
        return out

    def read(self, tasks: list[str], now: float,
             accelerators: tuple[str, ...]) -> dict[str, ObservedProfile | None]:
        """Profiles of ``tasks``; None for a task whose histogram has expired."""
        out: dict[str, ObservedProfile | None] = {}
        for start in range(0, len(tasks), _READ_CHUNK):
            chunk = tasks[start:start + _READ_CHUNK]
            with translated_errors():
                pipe = self.store.client.pipeline(transaction=False)
                for task in chunk:
                    pipe.hgetall(self.key(task))
                replies = pipe.execute()
            for task, reply in zip(chunk, replies, strict=True):
                if not reply:
                    out[task] = None
                    continue
                values, raw = decayed_values(decode_hash(reply), now)
                out[task] = observed_profile(values, raw, self.settings, accelerators)
        return out

    def forget(self, tasks: list[str]) -> None:
        if tasks:
            with translated_errors():
                self.store.client.hdel(self.index, *tasks)


@dataclass(frozen=True)
class ProfileBook:
    """Every known profile, as the publish path reads it (a dict lookup by task name)."""

    profiles: Mapping[str, ObservedProfile] = field(default_factory=dict)
    seen: Mapping[str, float] = field(default_factory=dict)  # task -> index stamp read
    fetched_at: float = float("-inf")


class ProfileSource:
    """Live-view source ``profiles``: re-reads changed profiles every ``refresh_s``.

    Profiles move slowly (half-life of hours), so the default refresh is 10 s, and only
    tasks whose index stamp changed are fetched again.
    """

    name = "profiles"
    initial = ProfileBook()

    def __init__(self, settings: ProfileSettings, accelerators: tuple[str, ...],
                 refresh_s: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.accelerators = accelerators
        self.refresh_s = refresh_s
        self.clock = clock

    def fetch(self, store: RedisStore, previous: ProfileBook) -> ProfileBook:
        now = self.clock()
        if now - previous.fetched_at < self.refresh_s:
            return previous
        profiles_store = ProfileStore(store, self.settings)
        index = profiles_store.read_index()
        changed = [t for t, stamp in index.items() if stamp != previous.seen.get(t)]
        profiles = {t: p for t, p in previous.profiles.items() if t in index}
        fresh = profiles_store.read(changed, now, self.accelerators) if changed else {}
        gone = [t for t, p in fresh.items() if p is None]
        for task, found in fresh.items():
            if found is None:
                profiles.pop(task, None)
            else:
                profiles[task] = found
        profiles_store.forget(gone)
        seen = {t: s for t, s in index.items() if t not in gone}
        return ProfileBook(profiles, seen, now)
