"""The guard's shared state: what it is doing (for ``status``) and a lock (one guard at a time).

Keys, under the deployment's prefix: ``guard`` (a JSON document, replaced each round)
and ``lock:guard`` (the owner's name, expiring unless renewed each round).
"""

from __future__ import annotations

import json
import time
from typing import Any

from celery_aitp.errors import StoreError
from celery_aitp.migration.analysis import ArmStats
from celery_aitp.migration.describe import when
from celery_aitp.store import RedisStore
from celery_aitp.store.redis_store import translated_errors

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def state_key(store: RedisStore) -> str:
    return store.keys.any("guard")


def lock_key(store: RedisStore) -> str:
    return store.keys.any("lock", "guard")


def read_guard_state(store: RedisStore) -> dict[str, Any] | None:
    """The last state a guard wrote, or None if none ever ran."""
    with translated_errors():
        raw = store.client.get(state_key(store))
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


#: Waits of the takeover baseline kept in the guard's state (a sample: the p90 is read).
BASELINE_WAITS = 1000


def baseline_doc(stats: ArmStats) -> dict[str, Any]:
    """The takeover baseline as the guard's state keeps it (so a guard started later in
    takeover compares with it too)."""
    return {"runs": stats.n, "wait_p90_s": stats.wait(0.9), "failures": stats.failures,
            "waits": [round(w, 4) for w in stats.waits[-BASELINE_WAITS:]]}


def baseline_of(doc: Any) -> ArmStats | None:
    """The baseline a state document holds, if it is well formed (anyone who can write
    the store can write it: bad values mean no baseline)."""
    if not isinstance(doc, dict):
        return None
    runs, failures, waits = doc.get("runs"), doc.get("failures"), doc.get("waits")
    if not isinstance(runs, int) or not isinstance(failures, int) or \
            not isinstance(waits, list) or not waits or not 0 <= failures <= runs:
        return None
    if not all(type(w) in (int, float) and 0 <= w < 1e9 for w in waits):
        return None
    return ArmStats(n=runs, waits=[float(w) for w in waits], failures=failures)


def write_guard_state(store: RedisStore, doc: dict[str, Any]) -> None:
    with translated_errors():
        store.client.set(state_key(store), json.dumps({**doc, "updated_at": time.time()}))


def acquire(store: RedisStore, owner: str, ttl_s: float) -> bool:
    """Take the guard lock; False if another guard holds it."""
    return store.try_lock(lock_key(store), ttl_s, owner)


def renew(store: RedisStore, owner: str, ttl_s: float) -> bool:
    """Extend the lock if this owner still holds it."""
    with translated_errors():
        held = store.client.eval(_RENEW, 1, lock_key(store), owner, max(1, int(ttl_s * 1000)))
    return bool(held)


def release(store: RedisStore, owner: str) -> None:
    try:
        with translated_errors():
            store.client.eval(_RELEASE, 1, lock_key(store), owner)
    except StoreError:
        pass  # it expires on its own


def describe_guard(doc: dict[str, Any]) -> str:
    """``running at 25% (step 2/4, failures 1/2); last analysis ...: pass ...``."""
    state = doc.get("state", "?")
    steps = doc.get("steps") or []
    text = f"{state} ({doc.get('owner', '?')})"
    if state == "running" and doc.get("watching") == "takeover":
        base = doc.get("baseline") or {}
        text += (f" watching takeover (failures {doc.get('failures', 0)}/"
                 f"{doc.get('failure_limit', '?')}, baseline "
                 + (f"{base.get('runs')} control runs)" if base else "none)"))
    elif state == "running":
        text += (f" at {doc.get('percent', 0):g}% (step {int(doc.get('step', 0)) + 1}/"
                 f"{len(steps)}, failures {doc.get('failures', 0)}/"
                 f"{doc.get('failure_limit', '?')})")
    last = doc.get("last") or {}
    if last:
        text += f"; last analysis {when(last.get('at'))}: {last.get('summary', '')}"
    if doc.get("dry_run"):
        text += " [dry run]"
    return text
