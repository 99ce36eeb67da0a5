"""Helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import os
import statistics
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from celery_aitp.learn import synthetic
from celery_aitp.learn.train import TrainConfig, TrainResult, train
from celery_aitp.predict.bundle import ModelBundle
from celery_aitp.predict.features import argument_features, call_signature
from celery_aitp.predict.history import HistoryStore, Run
from celery_aitp.predict.model_source import MODEL_SOURCE
from celery_aitp.predict.model_store import ModelStore

REDIS_URL = os.environ.get("AITP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
AMQP_URL = os.environ.get("AITP_BENCH_AMQP_URL", "")


def tag() -> str:
    return uuid.uuid4().hex[:6]


def tenants_for(run: str) -> dict[str, str]:
    """Synthetic tenant name -> a name unique to this run (so queues never collide)."""
    return {name: f"{name}-{run}" for name in synthetic.TENANTS}


def policy_for(run: str, stage: str = "takeover", percent: float = 50.0) -> dict[str, Any]:
    names = tenants_for(run)
    return {
        "tenants": {new: {} for new in names.values()} | {"default": {}},
        "stage": stage,
        "split": {"percent": percent},
    }


def workload(n: int, run: str, seed: int = 0, compact: bool = True) -> list[dict[str, Any]]:
    """Synthetic observation records whose tenants carry this run's names."""
    names = tenants_for(run)
    out = []
    for record in synthetic.records(n, seed=seed, compact_lists=compact):
        record["tenant"] = names[record["tenant"]]
        out.append(record)
    return out


def trained(records: Iterable[dict[str, Any]], config: TrainConfig | None = None) -> TrainResult:
    result = train(records, config)
    if result.bundle is None:
        raise SystemExit(f"training failed: {result.reason}")
    return result


def install_model(middleware: Any, bundle: ModelBundle | None,
                  history: Sequence[dict[str, Any]] = ()) -> None:
    """Promote ``bundle`` (if any) and runs into a deployment, and load them now."""
    if bundle is not None:
        ModelStore(middleware.store).promote(bundle)
    if history:  # with each run's call, as a worker records it
        HistoryStore(middleware.store).add_runs(
            Run(r["tenant"], r["task"], r["runtime_s"], None,
                call_signature(argument_features(r.get("args"), r.get("kwargs"))))
            for r in history)
    for src in middleware.pipeline.sources():
        if hasattr(src, "interval_s"):
            src.interval_s = 0.0  # re-read the history at once
    middleware.live.refresh()
    loaded = middleware.live.current().sources.get(MODEL_SOURCE)
    if bundle is not None and (loaded is None or loaded.version != bundle.version):
        raise SystemExit("the benchmark model was not picked up")


def close(middleware: Any) -> None:
    """Stop a benchmark app's refresher for good: no flush at exit recreates its keys."""
    import atexit

    middleware.close()
    if "live" in middleware.__dict__:
        atexit.unregister(middleware.live.flush)


def cleanup(url: str, patterns: Iterable[str]) -> None:
    """Delete this run's keys (only those matching ``patterns``)."""
    import redis

    from celery_aitp.store.redis_store import redis_url_for

    client = redis.Redis.from_url(redis_url_for(url))
    for pattern in patterns:
        keys = list(client.scan_iter(pattern, count=1000))
        if keys:
            client.delete(*keys)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
