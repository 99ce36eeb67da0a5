"""Decision latency: the whole in-process decision, p50 and p99 per path, in microseconds.

Times ``Middleware.on_publish`` (tenant, features, prediction, profile, priority, route,
gate, then the ``aitp`` header, counters and the buffered record) for real Celery task
messages, one call at a time, on each path: with a model, a decision reused from the
memo (``publish/memo.py``), a memo miss (the pipeline, the prediction from the model's
cache), neither cached (every tree walked), fresh caches over 2,000 distinct messages
(the worst case: a new model or a changed view), and the steady state (2,000 messages
never published before, after 20,000 others of the same workload); cold start (history,
or nothing known); and the fallbacks. The store is only read by the background refresher,
so no call waits on the network. One more path: every tier queue saturated with idle
standard workers, so the spill stage sends up to half the tasks to the default queue.
Also prints what one call of LightGBM's own single-row
``predict`` costs, and checks the publish path never calls it. Every path runs in each of
``--rounds`` rounds (the refresher stopped, so all see one state); the machine's speed
varies by round (up to 2x within seconds), so both the median over rounds and the best
round are printed.

    python benchmarks/decision_latency.py

Budget: p50 <= 10 us and p99 <= 50 us. Environment: AITP_BENCH_REDIS_URL (the store).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from celery import Celery  # noqa: E402

import celery_aitp  # noqa: E402
from celery_aitp.core.view import View  # noqa: E402
from celery_aitp.predict.model_source import MODEL_SOURCE  # noqa: E402
from celery_aitp.queues import all_tier_queues  # noqa: E402
from celery_aitp.scheduling.spill import SPILL_SOURCE, Capacity  # noqa: E402

TASKS = ("media.resize", "reports.build", "ml.fit", "etl.batch", "mail.send", "geo.route")


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def make_app(run: str, store_url: str, stage: str = "takeover", package: Any = celery_aitp
             ) -> Any:
    """A benchmark app with ``package``'s middleware (another version: decision_ab.py)."""
    app = Celery(f"latency-{run}", broker="memory://")
    app.conf.task_default_queue = f"bench-{run}"
    package.install(app, policy=common.policy_for(run, stage), store_url=store_url,
                    key_prefix=f"bench-{run}", refresh_interval_s=1.0)
    for name in TASKS:
        app.task(name=name, shared=False)(_noop)
    return app


def ship(mw: Any) -> None:
    """What the refresher would ship (stopped here, so every round sees one state): drop
    the buffered records and counters outside the timed part."""
    for buffer in mw.live.buffers.values():
        buffer.take(limit=len(buffer))
    mw.counters.drain()


def messages(app: Any, records: list[dict[str, Any]]) -> list[tuple[str, Any, dict[str, Any]]]:
    """Real task messages (as Celery builds them) with the options the router leaves."""
    out = []
    for i, r in enumerate(records):
        message = app.amqp.as_task_v2(f"id-{i}", r["task"], args=r["args"], kwargs=r["kwargs"])
        out.append((r["task"], message, {"headers": {"aitp_tenant": r["tenant"]}}))
    return out


def timings(call: Callable[[str, Any, dict[str, Any]], Any], batch: list[Any],
            before: Callable[[], None] | None = None, repeat: int = 3) -> list[float]:
    """Microseconds of each call (options are copied outside the timed part)."""
    clock = time.perf_counter_ns
    overhead = min(_empty(clock) for _ in range(5))
    out: list[float] = []
    gc.collect()
    for _ in range(repeat):
        for name, message, options in batch:
            opts = dict(options, _aitp_auto=True)
            if before is not None:
                before()
            start = clock()
            call(name, message, opts)
            out.append(max(0, clock() - start - overhead) / 1000.0)
    return out


def _empty(clock: Callable[[], int]) -> int:
    start = clock()
    return clock() - start


class Paths:
    """Every measured path, each a callable that sets its state up and times one batch."""

    def __init__(self, app: Any, cold: Any, fresh: Any, batch: list[Any], cold_batch: list[Any],
                 unknown: list[Any], warm: list[Any], new: list[Any]) -> None:
        self.mw, self.cold, self.fresh = app.aitp, cold.aitp, fresh.aitp
        self.batch, self.cold_batch, self.unknown = batch, cold_batch, unknown
        self.warm, self.new = warm, new
        self.model = self.mw.live.current().sources[MODEL_SOURCE]
        self.memo = self.mw.memo
        self.reused: dict[str, tuple[int, int]] = {}

    def kept(self) -> int:
        """Decisions kept: each one the pipeline made (with a key the memo had not)."""
        return len(self.memo)

    def count(self, n: int, before: int) -> tuple[int, int]:
        """(published, reused) since ``before``."""
        return n, n - (self.kept() - before)

    def forget_all(self) -> None:
        self.memo.clear()
        self.model.compiled.cache.clear()

    def ship(self) -> None:
        for mw in (self.mw, self.cold, self.fresh):
            ship(mw)

    def timed(self, *args: Any, **kwargs: Any) -> list[float]:
        self.ship()
        return timings(*args, **kwargs)

    def run(self) -> list[tuple[str, list[float]]]:
        mw, batch, memo, timings = self.mw, self.batch, self.memo, self.timed
        rows = [("model, no cache (trees)",
                 timings(mw.on_publish, batch, self.forget_all, repeat=1))]
        timings(mw.on_publish, batch, repeat=1)  # fill the caches
        rows.append(("model, memo miss", timings(mw.on_publish, batch, memo.clear)))
        timings(mw.on_publish, batch, repeat=1)
        rows.append(("model, memo hit", timings(mw.on_publish, batch)))
        self.forget_all()
        rows.append(("model, fresh caches", timings(mw.on_publish, batch, repeat=1)))
        self.reused["fresh caches"] = self.count(len(batch), 0)
        # steady state: caches warmed by earlier traffic, then messages never seen before
        self.forget_all()
        timings(mw.on_publish, self.warm, repeat=1)
        before = self.kept()
        rows.append(("model, steady state", timings(mw.on_publish, self.new, repeat=1)))
        self.reused["steady state"] = self.count(len(self.new), before)
        rows.append(("cold start: history", timings(self.cold.on_publish, self.cold_batch)))
        rows.append(("cold start: nothing known", timings(self.fresh.on_publish,
                                                          self.unknown)))
        live = mw.live
        view = live._view
        live._view = View(frozenset(), view.stage, view.split, True, view.model_version,
                          view.fetched_at, view.sources)  # nobody serves a tier queue
        rows.append(("fallback: no live worker", timings(mw.on_publish, batch)))
        live._view = view.stale()
        rows.append(("fallback: store unreachable", timings(mw.on_publish, batch)))
        # every tier queue saturated, idle standard workers: up to half the tasks spill
        # (publish/spill_stage.py); the memo keeps one decision per key and spill share
        saturated = Capacity({q: 1000.0 for q in view.live_queues},
                             mw.policy.default_accelerator, 8)
        live._view = View(view.live_queues, view.stage, view.split, True, view.model_version,
                          view.fetched_at, MappingProxyType({**view.sources,
                                                             SPILL_SOURCE: saturated}))
        timings(mw.on_publish, batch, repeat=1)  # the memo starts over with a new capacity
        rows.append(("spill: every tier saturated", timings(mw.on_publish, batch)))
        live._view = view

        def explicit(name: str, message: Any, options: dict[str, Any]) -> Any:
            options.pop("_aitp_auto")
            options["queue"] = "hand-picked"
            return mw.on_publish(name, message, options)

        rows.append(("fallback: explicit queue", timings(explicit, batch)))
        return rows


def lightgbm_predict(model: Any, bundle: Any) -> list[float]:
    """Microseconds of LightGBM's own single-row ``predict`` (one forest), 500 calls."""
    import numpy as np

    from celery_aitp.predict.bundle import booster_from_text

    one = model.spec.vector("mail.send", "acme", (5,), {}, 4, 2, None, 0, time.time(), None)
    row = np.array([one], dtype=np.float64)
    booster = booster_from_text(bundle.p50_text, "p50 model")
    out = []
    for _ in range(500):
        start = time.perf_counter_ns()
        booster.predict(row)
        out.append((time.perf_counter_ns() - start) / 1000.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=common.REDIS_URL, help="Redis URL of the store")
    parser.add_argument("--tasks", type=int, default=2000, help="messages per path")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every path")
    args = parser.parse_args()

    run = common.tag()
    records = common.workload(8000, run, seed=3)
    print("training the benchmark model ...", file=sys.stderr)
    bundle = common.trained(records[:6000]).bundle
    sample = common.workload(args.tasks, run, seed=21, compact=False)
    tenants = list(common.tenants_for(run).values())
    queues = all_tier_queues(tenants, ("cpu", "gpu"), ("hi", "mid", "lo"))

    import lightgbm

    predict_calls = {"n": 0}
    original_predict = lightgbm.Booster.predict

    def counting_predict(self: Any, *a: Any, **k: Any) -> Any:
        predict_calls["n"] += 1
        return original_predict(self, *a, **k)

    apps = [make_app(run + suffix, args.redis) for suffix in ("", "c", "n")]
    app, cold, fresh = apps
    by_path: dict[str, list[tuple[float, float]]] = {}
    lgb: list[float] = []
    try:
        for a in (app, cold):
            a.aitp.store.advertise("bench-worker@localhost", queues, {}, ttl_s=3600)
            a.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        common.install_model(app.aitp, bundle, records[:6000])
        common.install_model(cold.aitp, None, records[:6000])
        fresh.aitp.live.current()
        unknown = [dict(r, task="mail.send", tenant="default") for r in sample]
        paths = Paths(app, cold, fresh, messages(app, sample), messages(cold, sample),
                      messages(fresh, unknown),
                      messages(app, common.workload(args.tasks * 10, run, seed=5,
                                                    compact=False)),
                      messages(app, common.workload(args.tasks, run, seed=6, compact=False)))
        for a in apps:  # no refresh from here on: every round sees the same state
            a.aitp.live._stop.set()
            a.aitp.live.max_staleness_s = float("inf")  # the view never goes stale
        lightgbm.Booster.predict = counting_predict
        calls: dict[str, int] = {}
        for r in range(args.rounds):
            for name, values in paths.run():
                by_path.setdefault(name, []).append(
                    (common.percentile(values, 0.5), common.percentile(values, 0.99)))
                calls[name] = calls.get(name, 0) + len(values)
            lightgbm.Booster.predict = original_predict
            lgb.append(common.percentile(lightgbm_predict(paths.model, bundle), 0.5))
            lightgbm.Booster.predict = counting_predict
            print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        for path, (n, reused) in paths.reused.items():
            print(f"{path}: of {n} decisions, {reused} reused, {n - reused} made (last round)",
                  file=sys.stderr)
    finally:
        lightgbm.Booster.predict = original_predict
        for a in apps:
            common.close(a.aitp)
        common.cleanup(args.redis, [f"bench-{run}*"])

    print(f"\ndecision latency (Middleware.on_publish, one call at a time, {args.tasks} "
          f"synthetic messages per path, {args.rounds} rounds; p50 and p99 per round)\n")
    print(f"{'path':28} {'p50 median':>10} {'p50 best':>9} {'p99 median':>10} "
          f"{'p99 best':>9} {'calls':>7}")
    for name, stats in by_path.items():
        p50s = [p50 for p50, _ in stats]
        p99s = [p99 for _, p99 in stats]
        print(f"{name:28} {common.median(p50s):10.2f} {min(p50s):9.2f} "
              f"{common.median(p99s):10.2f} {min(p99s):9.2f} {calls[name]:7d}")
    print(f"\nLightGBM's own single-row predict (one forest), p50 per round: median "
          f"{common.median(lgb):.1f} us, best {min(lgb):.1f} us")
    print(f"LightGBM predict calls on the publish path: {predict_calls['n']}")
    model = paths.model
    print(f"model: {len(model.spec.names)} features, {len(model.compiled.used_features)} used, "
          f"{bundle.meta['params']['rounds']} + {bundle.meta['params']['p90_rounds']} trees; "
          "budget p50 <= 10 us, p99 <= 50 us")


if __name__ == "__main__":
    main()
