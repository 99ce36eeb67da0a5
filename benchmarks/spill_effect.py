"""What spilling does for a saturated top tier: waits with ``spill`` off and on.

Real worker processes on Redis: one AITP worker serving tenant ``acme``'s tier queues
(threads pool, ``--tier-slots``) and one standard worker on the default queue
(``--standard-slots``). The producer publishes ``--tasks`` top-tier tasks of
``--runtime-s`` each at ``--rate`` per second, above what the tier worker can serve, in
takeover, once with ``spill.enabled: false`` and once with the default spill settings.
Prints, per run, the wait (start - publish) p50, p95 and max, the share of tasks that
ran from the default queue, and how many were lost (none may be).

    python benchmarks/spill_effect.py

Environment: AITP_BENCH_REDIS_URL (broker, store and sink; keys under a fresh prefix,
deleted afterwards).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from benchmarks.bench_workers import BenchWorker, running  # noqa: E402
from benchmarks.common import REDIS_URL  # noqa: E402

POLICY: dict[str, Any] = {
    "tiers": [{"name": "hi", "sla_s": 1}, {"name": "mid", "sla_s": 10},
              {"name": "lo", "sla_s": 60}],
    "tenants": {"acme": {"max_tier": "hi"}, "default": {}},
    "stage": "takeover",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def run(args: argparse.Namespace, spill: bool) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    prefix, queue = f"spill-bench-{tag}", f"spill-bench-{tag}"
    policy = {**POLICY, "spill": {"enabled": spill}}
    env = {"AITP_SPILL_BROKER": args.redis, "AITP_SPILL_PREFIX": prefix,
           "AITP_SPILL_QUEUE": queue, "AITP_SPILL_POLICY": json.dumps(policy)}
    os.environ.update(env)
    sys.modules.pop("benchmarks.spill_app", None)  # the app reads its run from the env
    spill_app = importlib.import_module("benchmarks.spill_app")

    workers = [
        BenchWorker(f"tier-{tag}", args.tier_slots,
                    ["--aitp-tenant", "acme", "--aitp-no-default-queue"], env,
                    app="benchmarks.spill_app"),
        BenchWorker(f"std-{tag}", args.standard_slots, [], env, app="benchmarks.spill_app"),
    ]
    client = redis.Redis.from_url(args.redis)
    try:
        with running(workers):
            app = spill_app.app
            deadline = time.monotonic() + 30
            while "aitp.acme.cpu.hi" not in app.aitp.store.live_queues():
                if time.monotonic() > deadline:
                    raise RuntimeError("the tier worker never advertised")
                time.sleep(0.1)
            app.aitp.live.refresh()
            time.sleep(2 * POLICY_REPORT_S)  # both workers' first occupancy reports
            gap = 1.0 / args.rate
            start = time.monotonic()
            for i in range(args.tasks):
                delay = start + i * gap - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                spill_app.urgent.apply_async((time.time(), args.runtime_s),
                                             headers={"aitp_tenant": "acme"})
            deadline = time.monotonic() + args.tasks * args.runtime_s + 60
            while client.llen(spill_app.runs_key()) < args.tasks:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            runs = [json.loads(r) for r in client.lrange(spill_app.runs_key(), 0, -1)]
            app.aitp.close()
    finally:
        keys = list(client.scan_iter(f"{prefix}*")) + [queue]
        keys += list(client.scan_iter("aitp.acme.*")) + \
            list(client.scan_iter("_kombu.binding.aitp.acme*"))
        client.delete(*keys)
    waits = [r["started"] - r["published"] for r in runs]
    spilled = sum(r["queue"] == queue for r in runs)
    return {"spill": "on" if spill else "off", "runs": len(runs),
            "lost": args.tasks - len({r["id"] for r in runs}),
            "p50": percentile(waits, 0.5), "p95": percentile(waits, 0.95),
            "max": max(waits), "spilled": spilled / len(runs) if runs else 0.0}


POLICY_REPORT_S = 1.0  # spill.report_interval_s's default


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=REDIS_URL, help="Redis URL (broker and store)")
    parser.add_argument("--tasks", type=int, default=80)
    parser.add_argument("--rate", type=float, default=12.0, help="tasks published per second")
    parser.add_argument("--runtime-s", type=float, default=0.25)
    parser.add_argument("--tier-slots", type=int, default=2)
    parser.add_argument("--standard-slots", type=int, default=2)
    args = parser.parse_args()
    rows = [run(args, spill=False), run(args, spill=True)]
    capacity = args.tier_slots / args.runtime_s
    print(f"\n{args.tasks} hi tasks of {args.runtime_s:g} s at {args.rate:g}/s; the tier "
          f"worker serves {capacity:g}/s, the standard worker {args.standard_slots} slots; "
          f"hi SLA 1 s\n")
    print("spill  runs  lost  wait p50  wait p95  wait max  ran from default queue")
    for r in rows:
        print(f"{r['spill']:<5} {r['runs']:>5} {r['lost']:>5} {r['p50']:>8.2f}s "
              f"{r['p95']:>8.2f}s {r['max']:>8.2f}s  {r['spilled']:>6.0%}")
    off, on = rows
    print(f"\nwith spill: p95 wait x{on['p95'] / off['p95']:.2f}, max wait "
          f"x{on['max'] / off['max']:.2f} of without")
    return 0 if off["lost"] == on["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
