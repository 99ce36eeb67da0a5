"""The live policy: one active version in the store that every process follows.

``celery aitp policy apply FILE`` validates a policy and makes it the active one: the
store key ``policy:active`` holds ``{digest, at, who, host, action, reason, source,
policy}``, and the change is appended to the policy history (``policy:history``), so
the audit trail and the versions are the same list. ``rollback`` applies the version
before the active one again, as a new entry that says so.

Every producer and worker reads the active digest in its live view's background round
(:class:`ActivePolicySource`, one ``GET`` of a short string) and, when it differs from
its own, loads the document and switches (``Middleware.adopt_policy``). Until a policy
is applied, the one a process starts with (file, ``app.conf`` or ``install()``) is the
initial version; once one is active, a process started with another adopts the active
one on its first round, so a restart never quietly reverts an applied change.

What cannot change live are the tier names, which name the broker queues workers
consume: a process never adopts an applied policy whose tiers differ from its own (it
keeps its policy, says so once in its log and records it in the history as ``keep``),
and ``apply`` refuses tiers that neither the active policy has nor any process recorded
starting with (or keeping) since the active one was applied. Tiers change by a rolling
restart with the new file; once processes run it, ``apply`` of it (or of a policy with
its tiers) is accepted, and every process with those tiers follows.
"""

from __future__ import annotations

import difflib
import getpass
import json
import os
import socket
import time
from typing import Any

from celery_aitp.errors import PolicyError
from celery_aitp.policy import Policy, parse_policy
from celery_aitp.policy_history import policy_digest, policy_document, policy_history
from celery_aitp.store.redis_store import (
    HISTORY_LIMIT,
    RedisStore,
    _json_or_none,
    translated_errors,
)

#: The live-view source name (``view.sources``): the active digest, or None.
ACTIVE_POLICY_SOURCE = "active_policy"
#: What ``policy:history`` entries written here say they did.
APPLY, ROLLBACK = "apply", "rollback"


def active_key(store: RedisStore) -> str:
    return store.keys.any("policy", "active")


def digest_key(store: RedisStore) -> str:
    return store.keys.any("policy", "active", "digest")


def read_active(store: RedisStore) -> dict[str, Any] | None:
    """The active policy's entry (with its document), or None before any apply."""
    with translated_errors():
        raw = store.client.get(active_key(store))
    doc = _json_or_none(raw) if raw is not None else None
    return doc if isinstance(doc, dict) else None


def active_policy(store: RedisStore) -> Policy | None:
    """The active policy, validated; None before any apply. A stored document that no
    longer validates (written by hand, or by a newer version) raises PolicyError."""
    entry = read_active(store)
    if entry is None:
        return None
    document = entry.get("policy")
    if not isinstance(document, dict):
        raise PolicyError("policy:active holds no policy document")
    return parse_policy(document)


def who_applies() -> str:
    """The operator, as the OS names them (``AITP_ACTOR`` wins, e.g. in CI jobs)."""
    actor = os.environ.get("AITP_ACTOR")
    if actor:
        return actor
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (containers)
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"


class TiersDiffer(PolicyError):
    """A policy whose tiers differ from those a process runs: it cannot follow it live."""


def tiers_differ(own: Policy, other: Policy, other_name: str) -> TiersDiffer | None:
    """The refusal to adopt ``other`` in a process deciding by ``own``, if its tiers
    differ (None if they are the same)."""
    if own.tier_names == other.tier_names:
        return None
    return TiersDiffer(
        f"its tiers {list(other.tier_names)} differ from this process's "
        f"{list(own.tier_names)}, and tiers do not change at run time ({other_name}); "
        "to change tiers, finish the rolling restart with the new policy file, then "
        "`celery aitp policy apply` it")


def started_tiers(store: RedisStore) -> set[tuple[str, ...]]:
    """The tiers of the policies processes recorded starting with (or keeping) since the
    active one was applied: what parts of the fleet run besides it (none before any
    apply)."""
    found: set[tuple[str, ...]] = set()
    if read_active(store) is None:
        return found
    for entry in policy_history(store, HISTORY_LIMIT):
        if entry.get("action") in (APPLY, ROLLBACK):
            break  # the active one's entry: what came before is not running any more
        document = entry.get("policy")
        if not isinstance(document, dict):
            continue
        try:
            found.add(parse_policy(document).tier_names)
        except PolicyError:  # written by another version: not this one's to judge
            continue
    return found


def check_replaceable(current: Policy, new: Policy,
                      running: set[tuple[str, ...]] | frozenset[tuple[str, ...]] = frozenset()
                      ) -> None:
    """Refuse a change no process can follow without a restart: tiers that are neither
    the active policy's nor in ``running`` (see :func:`started_tiers`)."""
    if current.tier_names != new.tier_names and new.tier_names not in running:
        raise PolicyError(
            f"tiers: {list(new.tier_names)} differ from the active {list(current.tier_names)}, "
            "and no process has started with them since it was applied; tier names name "
            "the broker queues workers consume, so a change of tiers needs a rolling "
            "restart with the new policy file (processes keep their file's policy while "
            "the applied one's tiers differ), then `policy apply` of it")


def apply_policy(store: RedisStore, policy: Policy, current: Policy, *, source: str,
                 reason: str | None, action: str = APPLY) -> dict[str, Any]:
    """Make ``policy`` the active one and audit it; returns the entry written.

    ``current`` is what the fleet runs now (the active policy, or the app's own before
    any apply): the change must be one processes can follow live, or have tiers some
    process started with since ``current`` was applied (a rolling restart).
    """
    check_replaceable(current, policy, started_tiers(store))
    digest = policy_digest(policy)
    entry = {"at": time.time(), "digest": digest, "action": action, "reason": reason or "",
             "who": who_applies(), "host": socket.gethostname(), "pid": os.getpid(),
             "source": source, "policy": policy_document(policy)}
    text = json.dumps(entry)
    history = store.keys.policy_history
    with translated_errors():
        pipe = store.client.pipeline(transaction=True)
        pipe.set(active_key(store), text)
        pipe.set(digest_key(store), digest)
        pipe.lpush(history, text)
        pipe.ltrim(history, 0, HISTORY_LIMIT - 1)
        pipe.execute()
    return entry


def rollback_target(store: RedisStore, to_digest: str | None = None) -> dict[str, Any]:
    """The history entry to roll back to: the newest one whose digest differs from the
    active one (or the newest with ``to_digest``). Raises PolicyError if there is none."""
    entries = policy_history(store, HISTORY_LIMIT)
    active = read_active(store)
    current = active["digest"] if active else (entries[0]["digest"] if entries else None)
    for entry in entries:
        digest = entry.get("digest")
        if not isinstance(entry.get("policy"), dict):
            continue
        if (to_digest is not None and digest == to_digest) or \
                (to_digest is None and digest != current):
            return entry
    wanted = f"version {to_digest}" if to_digest else "earlier version"
    raise PolicyError(f"policy rollback: the history holds no {wanted} to go back to")


def policy_diff(old: Policy, new: Policy, old_name: str, new_name: str) -> str:
    """A unified diff of the two policies' canonical documents ('' when equal)."""
    def lines(policy: Policy) -> list[str]:
        return json.dumps(policy_document(policy), indent=2, sort_keys=True).splitlines(True)
    return "".join(difflib.unified_diff(lines(old), lines(new), old_name, new_name))


class ActivePolicySource:
    """Live-view source: the active policy's digest (None before any apply)."""

    name = ACTIVE_POLICY_SOURCE
    initial: str | None = None

    def fetch(self, store: RedisStore, previous: Any) -> str | None:
        with translated_errors():
            raw = store.client.get(digest_key(store))
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)
