"""Runtime models in the shared store: the current one and a short history of promotions.

``<prefix>:model`` (hash)          version, meta (JSON), p50 and p90 (LightGBM text)
``<prefix>:model:history`` (list)  metadata of the last promotions, newest first (capped)

Publishers only read the version (each refresh) and, when it changed, the whole hash.
Only the trainer writes; a promotion replaces all fields in one transaction.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from celery_aitp.errors import StoreError
from celery_aitp.predict.bundle import ModelBundle, parse_meta
from celery_aitp.store import RedisStore

HISTORY_LIMIT = 20


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ModelStore:
    """Read and promote runtime models in one deployment's store."""

    def __init__(self, store: RedisStore) -> None:
        self.client = store.client
        self.key = store.keys.model
        self.history_key = store.keys.any("model", "history")

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

    def promote(self, bundle: ModelBundle) -> None:
        """Make ``bundle`` the current model for every producer and worker."""
        summary = {k: bundle.meta.get(k) for k in ("version", "trained_at", "window",
                                                   "metrics", "records")}
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(self.key, mapping={
                "version": bundle.version,
                "meta": json.dumps(bundle.meta, sort_keys=True),
                "p50": bundle.p50_text,
                "p90": bundle.p90_text,
            })
            pipe.lpush(self.history_key, json.dumps(summary, default=str))
            pipe.ltrim(self.history_key, 0, HISTORY_LIMIT - 1)
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            raise StoreError(f"store unreachable: {exc}") from exc

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
