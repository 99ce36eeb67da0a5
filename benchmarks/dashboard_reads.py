"""What one dashboard refresh costs: store reads, page payloads and a /metrics render.

    python benchmarks/dashboard_reads.py [--redis URL] [--runs 5000]

Uses the given Redis (a database you can write to; keys go under a random prefix and are
deleted) or an embedded redis-server. Prints milliseconds per operation.
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import time
import uuid
from collections.abc import Callable

import redis
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from celery_aitp.dashboard import pages
from celery_aitp.dashboard.fleet import Fleet
from celery_aitp.dashboard.metrics import registry_for
from celery_aitp.policy import parse_policy
from celery_aitp.store import Keys, RedisStore
from celery_aitp.stubs import MemoryQueueOps

POLICY = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {f"t{i}": {"weight": 1 + i % 3} for i in range(10)} | {"default": {}},
    "accelerators": ["cpu", "gpu"],
}


def records(n: int, rng: random.Random) -> tuple[list[dict], list[dict]]:
    runs, decisions = [], []
    for i in range(n):
        tenant, tier = f"t{rng.randrange(10)}", rng.choice(["hi", "mid", "lo"])
        common = {"task": f"proj.task{rng.randrange(20)}", "task_id": uuid.uuid4().hex,
                  "tenant": tenant, "tier": tier, "accelerator": "cpu"}
        decisions.append({**common, "queue": f"aitp.{tenant}.cpu.{tier}", "routed": True,
                          "reason": "routed", "stage": "takeover", "decided_at": time.time(),
                          "predicted_runtime_s": 0.1, "factors": {"tier": 0.5, "aging": 0.1}})
        runs.append({**common, "wait_s": rng.expovariate(2), "runtime_s": rng.expovariate(10),
                     "predicted_runtime_s": 0.1, "outcome": "SUCCESS", "worker": f"w{i % 4}"})
    return runs, decisions


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def run(url: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    store = RedisStore(client, Keys(f"aitpbench-{uuid.uuid4().hex[:6]}"))
    policy = parse_policy(POLICY)
    rng = random.Random(1)
    try:
        runs, decisions = records(n, rng)
        store.append_records(store.keys.observations, runs, maxlen=200_000)
        store.append_records(store.keys.decisions, decisions, maxlen=100_000)
        store.add_counts({f"decisions:takeover:t{i}:hi:cpu:routed": 100 for i in range(10)})
        for w in range(4):
            store.advertise(f"w{w}@bench", [f"aitp.t{i}.cpu.hi" for i in range(10)], {}, 60)
        ops = MemoryQueueOps()
        fleet = Fleet(store, policy, "celery", lambda: ops, 10.0, refresh_s=0.0, window_s=3600,
                      tasks=tuple(f"proj.task{i}" for i in range(20)))
        first = timed(lambda: Fleet(store, policy, "celery", lambda: ops, 10.0, refresh_s=0.0,
                                    window_s=3600).snapshot(), repeat=3)
        fleet.snapshot()
        idle = timed(fleet.snapshot)
        new_runs, _ = records(1000, rng)

        def with_new() -> None:
            store.append_records(store.keys.observations, new_runs, maxlen=200_000)
            fleet.snapshot()

        incremental = timed(with_new, repeat=3)  # includes writing the 1000 records
        snap = fleet.snapshot()
        overview = timed(lambda: pages.overview(snap, policy, 10.0))
        tenants = timed(lambda: pages.tenants(snap, policy, 3600))
        registry = registry_for(fleet)
        metrics = timed(lambda: generate_latest(registry))
        text = generate_latest(registry)
        zipped = timed(lambda: gzip.compress(generate_latest(registry)))
        openmetrics = timed(lambda: generate_openmetrics(registry))
        print(f"window: {len(snap.observations)} runs, {len(snap.decisions)} decisions, "
              f"{len(snap.queues)} queues")
        print(f"first snapshot (back-fill {n} + {n} records): {first:8.1f} ms")
        print(f"refresh, nothing new:                       {idle:8.1f} ms")
        print(f"refresh after 1000 new runs (incl. writing):  {incremental:8.1f} ms")
        print(f"overview payload:                           {overview:8.1f} ms")
        print(f"tenants payload:                            {tenants:8.1f} ms")
        print(f"/metrics render ({len(text) / 1024:.0f} KiB):                 {metrics:8.1f} ms")
        print(f"/metrics render + gzip ({len(gzip.compress(text)) / 1024:.0f} KiB):            "
              f"{zipped:8.1f} ms")
        print(f"/metrics render, OpenMetrics:               {openmetrics:8.1f} ms")
    finally:
        keys = list(client.scan_iter(f"{store.keys.prefix}*"))
        if keys:
            client.delete(*keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=None, help="Redis URL (default: embedded server)")
    parser.add_argument("--runs", type=int, default=5000, help="records of each kind")
    args = parser.parse_args()
    if args.redis:
        run(args.redis, args.runs)
        return
    from celery_aitp.demo.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        run(server.url, args.runs)


if __name__ == "__main__":
    main()
