"""Runtime models in the shared store: the current one and a short history of promotions.

``<prefix>:model`` (hash)          version, meta (JSON), p50 and p90 (LightGBM text);
                                   ``pinned``: set while an operator pinned the model
``<prefix>:model:history`` (list)  metadata of the last promotions, newest first (capped)
``<prefix>:model:kept`` (list)     versions of the last :data:`KEEP` models, newest first
``<prefix>:model:bundles`` (hash)  version -> the whole model (JSON), for those versions
``<prefix>:model:audit`` (list)    pins, unpins and rollbacks: who, when, why, from where

Publishers only read the version (each refresh) and, when it changed, the whole hash.
The trainer promotes (never over a pin: the pin is checked in the promoting transaction);
operators pin, unpin and roll back. Each change replaces the current model's fields in one
transaction.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from celery_aitp.errors import ModelError, StoreError
from celery_aitp.predict.bundle import ModelBundle, load_bundle, parse_meta
from celery_aitp.predict.drift import DriftStore
from celery_aitp.store import RedisStore

HISTORY_LIMIT = 20
#: Models kept for pinning and rollback.
KEEP = 5
AUDIT_LIMIT = 200


@dataclass(frozen=True)
class Actor:
    """Who changes the model, why and from where (the audit trail's entry)."""

    who: str
    why: str
    where: str
    at: float = field(default_factory=time.time)

    @classmethod
    def here(cls, why: str, who: str | None = None) -> Actor:
        """This process: the login user (or ``who``), host name and process id."""
        if not who:
            try:
                who = getpass.getuser()
            except (KeyError, OSError):  # no login name (some containers)
                who = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
        return cls(who, why, f"{socket.gethostname()} pid {os.getpid()}")


def _json(item: Any) -> Any:
    try:
        return json.loads(item)
    except (TypeError, ValueError, RecursionError):
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ModelStore:
    """Read and promote runtime models in one deployment's store."""

    def __init__(self, store: RedisStore, keep: int = KEEP) -> None:
        self.store = store
        self.client = store.client
        self.key = store.keys.model
        self.history_key = store.keys.any("model", "history")
        self.kept_key = store.keys.any("model", "kept")
        self.bundles_key = store.keys.any("model", "bundles")
        self.audit_key = store.keys.any("model", "audit")
        self.keep = max(1, keep)
        self._drift = DriftStore(store)

    def version(self) -> str | None:
        """The current model version, or None when no model was promoted."""
        try:
            raw = self.client.hget(self.key, "version")
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return _text(raw) if raw else None

    def read(self) -> ModelBundle | None:
        """The current model, or None; ModelError if its metadata is unreadable."""
        try:
            raw = self.client.hgetall(self.key)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        meta = parse_meta(fields.get("meta", ""))
        return ModelBundle(meta, fields.get("p50", ""), fields.get("p90", ""))

    def promote(self, bundle: ModelBundle, *, unless_pinned: bool = False) -> str | None:
        """Make ``bundle`` the current model for every producer and worker, and keep it
        among the last :data:`KEEP` models (older ones are dropped).

        With ``unless_pinned`` (the trainers), nothing is written if a model is pinned
        when the write happens, and the pinned version is returned (None: promoted). The
        check and the write are one optimistic transaction (WATCH on the model hash): a
        pin that lands between them makes the write retry, and the retry sees the pin.
        """
        summary = {k: bundle.meta.get(k) for k in ("version", "trained_at", "window",
                                                   "metrics", "records")}
        try:
            with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(self.key, self.kept_key)
                        if unless_pinned:
                            pinned = pipe.hget(self.key, "pinned")
                            if pinned:
                                pipe.unwatch()
                                return _text(pinned)
                        dropped = [_text(v) for v in pipe.lrange(self.kept_key,
                                                                 self.keep - 1, -1)]
                        pipe.multi()
                        self._write_promotion(pipe, bundle, summary, dropped)
                        pipe.execute()
                        return None
                    except redis.WatchError:
                        continue  # the model or the kept list changed meanwhile: again
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc

    def _write_promotion(self, pipe: Any, bundle: ModelBundle, summary: dict[str, Any],
                         dropped: list[str]) -> None:
        self._make_current(pipe, bundle)
        pipe.lpush(self.history_key, json.dumps(summary, default=str))
        pipe.ltrim(self.history_key, 0, HISTORY_LIMIT - 1)
        pipe.lrem(self.kept_key, 0, bundle.version)
        pipe.lpush(self.kept_key, bundle.version)
        pipe.ltrim(self.kept_key, 0, self.keep - 1)
        pipe.hset(self.bundles_key, bundle.version, json.dumps(
            {"meta": bundle.meta, "p50": bundle.p50_text, "p90": bundle.p90_text},
            sort_keys=True))
        for version in dropped:
            if version != bundle.version:
                pipe.hdel(self.bundles_key, version)

    def _make_current(self, pipe: Any, bundle: ModelBundle) -> None:
        self._drift.reset(pipe)  # the live errors were the previous model's
        pipe.hset(self.key, mapping={
            "version": bundle.version,
            "meta": json.dumps(bundle.meta, sort_keys=True),
            "p50": bundle.p50_text,
            "p90": bundle.p90_text,
        })

    def kept(self) -> list[str]:
        """Versions that can be pinned or rolled back to, newest first."""
        try:
            return [_text(v) for v in self.client.lrange(self.kept_key, 0, -1)]
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc

    def kept_bundle(self, version: str) -> ModelBundle:
        """A kept model; ModelError if it is not (or no longer) kept."""
        try:
            raw = self.client.hget(self.bundles_key, version)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        if raw is None:
            raise ModelError(f"model {version} is not kept (kept: "
                             f"{', '.join(self.kept()) or 'none'})")
        doc = parse_meta(_text(raw))
        meta = doc.get("meta")
        if not isinstance(meta, dict):
            raise ModelError(f"kept model {version} is unreadable")
        return ModelBundle(meta, str(doc.get("p50", "")), str(doc.get("p90", "")))

    def pinned(self) -> str | None:
        """The pinned version (the trainer does not promote over it), or None."""
        try:
            raw = self.client.hget(self.key, "pinned")
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return _text(raw) if raw else None

    def pin(self, version: str, actor: Actor, action: str = "pin") -> str | None:
        """Make kept ``version`` current and pinned; returns the version it replaced.

        ModelError if the version is not kept or does not load (checked before it is
        published, so a broken model never reaches producers)."""
        bundle = self.kept_bundle(version)
        load_bundle(bundle)  # verifies it compiles and agrees with its own check rows
        previous = self.version()
        try:
            pipe = self.client.pipeline(transaction=True)
            self._make_current(pipe, bundle)
            pipe.hset(self.key, "pinned", version)
            self._audit(pipe, action, version, previous, actor)
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return previous

    def rollback(self, actor: Actor) -> str:
        """Pin the kept model before the current one; returns its version."""
        kept = self.kept()
        current = self.version()
        if current not in kept:
            raise ModelError("the current model is not among the kept ones: pin a version")
        position = kept.index(current)
        if position + 1 >= len(kept):
            raise ModelError(f"no kept model older than {current} to roll back to")
        target = kept[position + 1]
        self.pin(target, actor, action="rollback")
        return target

    def unpin(self, actor: Actor) -> str | None:
        """Let the trainer promote again; returns the version that was pinned."""
        pinned = self.pinned()
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.hdel(self.key, "pinned")
            self._audit(pipe, "unpin", pinned, pinned, actor)
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return pinned

    def _audit(self, pipe: Any, action: str, version: str | None, previous: str | None,
               actor: Actor) -> None:
        entry = {"action": action, "version": version, "from_version": previous,
                 "who": actor.who, "why": actor.why, "where": actor.where, "at": actor.at}
        pipe.lpush(self.audit_key, json.dumps(entry, sort_keys=True))
        pipe.ltrim(self.audit_key, 0, AUDIT_LIMIT - 1)

    def audit(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest audit entries first."""
        try:
            raw = self.client.lrange(self.audit_key, 0, max(0, limit - 1))
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        return [doc for doc in (_json(item) for item in raw) if isinstance(doc, dict)]

    def history(self) -> list[dict[str, Any]]:
        """Summaries of the last promotions, newest first."""
        try:
            raw = self.client.lrange(self.history_key, 0, HISTORY_LIMIT - 1)
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc
        out = []
        for item in raw:
            try:
                doc = json.loads(item)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out
