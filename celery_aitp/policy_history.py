"""Policy as code: a digest per policy, and a record of every change of the active one.

Each process with the middleware checks once, on its first successful store round, that
the newest entry of ``policy:history`` has its policy's digest; if not, it appends
``{at, source, digest, host, pid, policy}`` (newest first, trimmed to 1000 entries).
Processes that start with the same policy add nothing; a deploy with another policy
adds one entry, and so does a mixed fleet each time the other policy starts again,
which is exactly when the active policy changed. Decision records carry the digest,
so ``explain`` can tell which policy decided.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from celery_aitp.policy import Policy
from celery_aitp.store.redis_store import (
    HISTORY_LIMIT,
    RedisStore,
    _json_or_none,
    translated_errors,
)

logger = logging.getLogger(__name__)

#: What an entry recorded by a process that keeps its own policy while another one is
#: applied says it did (``policy:history``; one without ``action`` is a start).
KEEP = "keep"

#: KEYS[1] history list, KEYS[2] the applied policy's digest (celery_aitp.policy_live);
#: ARGV: digest, entry JSON, limit, '1' if the process keeps its own policy although one
#: is applied. Returns 1 when appended. Once a policy has been applied, the fleet follows
#: it and a process's own starting policy is not a change, unless the process does not
#: follow it (its tiers differ: a rolling restart with a new file is under way).
_RECORD = """
if ARGV[4] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local newest = redis.call('LINDEX', KEYS[1], 0)
if newest then
  local ok, doc = pcall(cjson.decode, newest)
  if ok and type(doc) == 'table' and doc['digest'] == ARGV[1] then return 0 end
end
redis.call('LPUSH', KEYS[1], ARGV[2])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
return 1
"""


def policy_document(policy: Policy) -> dict[str, Any]:
    """The policy as canonical JSON-safe data (what the digest covers)."""
    return policy.model_dump(mode="json")


def policy_digest(policy: Policy) -> str:
    """SHA-256 of the canonical JSON of the policy (first 16 hex digits)."""
    text = json.dumps(policy_document(policy), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def describe_source(source: Any, where: str = "install()") -> str:
    """A short human description of where a policy came from."""
    if source is None:
        return "built-in defaults"
    if isinstance(source, (str, Path)):
        return f"file {source}"
    if isinstance(source, Policy):
        return f"{where} Policy object"
    return f"{where} mapping"


class PolicyRecorder:
    """Appends the policy to the history once per process (on the first round that works)."""

    def __init__(self, policy: Policy, source: str) -> None:
        self.policy = policy
        self.source = source
        self.digest = policy_digest(policy)
        self.done = False
        #: Why this process keeps its policy although another one is applied (None: it
        #: follows the applied one, or none is applied).
        self.kept: str | None = None

    def keep(self, why: str) -> None:
        """Record the policy (again) as one this process keeps while another is applied:
        ``policy apply`` and ``rollback`` then know that processes run its tiers."""
        self.kept = why
        self.done = False

    def entry(self) -> dict[str, Any]:
        entry = {"at": time.time(), "source": self.source, "digest": self.digest,
                 "host": socket.gethostname(), "pid": os.getpid(),
                 "policy": policy_document(self.policy)}
        if self.kept is not None:
            entry.update(action=KEEP, reason=self.kept)
        return entry

    def record(self, store: RedisStore) -> bool:
        """Append if the newest entry has another digest; True if appended."""
        with translated_errors():
            script = store.client.register_script(_RECORD)
            added = script(keys=[store.keys.policy_history,
                                 store.keys.any("policy", "active", "digest")],
                           args=[self.digest, json.dumps(self.entry()), HISTORY_LIMIT,
                                 "1" if self.kept is not None else "0"])
        return bool(added)

    def __call__(self, store: RedisStore) -> None:
        """As a live-view flusher: record once, then do nothing."""
        if self.done:
            return
        if self.record(store):  # raises StoreError: tried again next round
            if self.kept is not None:
                logger.info("aitp: recorded policy %s (%s), which this process keeps",
                            self.digest, self.source)
            else:
                logger.info("aitp: active policy changed to %s (%s)", self.digest,
                            self.source)
        self.done = True


def policy_history(store: RedisStore, limit: int = 50) -> list[dict[str, Any]]:
    """Recorded policy changes, newest first."""
    with translated_errors():
        raw = store.client.lrange(store.keys.policy_history, 0, max(0, limit - 1))
    return [doc for doc in map(_json_or_none, raw) if isinstance(doc, dict)]
