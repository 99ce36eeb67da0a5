"""Decision latency: the whole in-process decision, p50 and p99 per path, in microseconds.

Times ``Middleware.on_publish`` (tenant, features, prediction, profile, priority, route,
gate, then the ``aitp`` header, counters and the buffered record) for real Celery task
messages, one call at a time, on each path: with a model, a decision reused from the
memo (``publish/memo.py``), a memo miss (the pipeline, the prediction from the model's
cache), neither cached (every tree walked), and fresh caches over 2,000 distinct
messages (what a new view meets); cold start (history, or nothing known); and the
fallbacks. The store is only read by the background refresher, so no call waits on the
network. Also prints what one call of LightGBM's own single-row ``predict`` costs, and
checks the publish path never calls it.

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from celery import Celery  # noqa: E402

import celery_aitp  # noqa: E402
from celery_aitp.predict.model_source import MODEL_SOURCE  # noqa: E402
from celery_aitp.queues import all_tier_queues  # noqa: E402

TASKS = ("media.resize", "reports.build", "ml.fit", "etl.batch", "mail.send", "geo.route")


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def make_app(run: str, store_url: str, stage: str = "takeover") -> Any:
    app = Celery(f"latency-{run}", broker="memory://")
    app.conf.task_default_queue = f"bench-{run}"
    celery_aitp.install(app, policy=common.policy_for(run, stage), store_url=store_url,
                        key_prefix=f"bench-{run}", refresh_interval_s=1.0)
    for name in TASKS:
        app.task(name=name, shared=False)(_noop)
    return app


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=common.REDIS_URL, help="Redis URL of the store")
    parser.add_argument("--tasks", type=int, default=2000, help="messages per path")
    args = parser.parse_args()

    run = common.tag()
    records = common.workload(8000, run, seed=3)
    print("training the benchmark model ...", file=sys.stderr)
    result = common.trained(records[:6000])
    bundle = result.bundle
    sample = common.workload(args.tasks, run, seed=21, compact=False)
    tenants = list(common.tenants_for(run).values())
    queues = all_tier_queues(tenants, ("cpu", "gpu"), ("hi", "mid", "lo"))

    import lightgbm

    predict_calls = {"n": 0}
    original_predict = lightgbm.Booster.predict

    def counting_predict(self: Any, *a: Any, **k: Any) -> Any:
        predict_calls["n"] += 1
        return original_predict(self, *a, **k)

    rows: list[tuple[str, list[float]]] = []
    app = make_app(run, args.redis)
    cold = make_app(run + "c", args.redis)
    try:
        mw, cold_mw = app.aitp, cold.aitp
        for m in (mw, cold_mw):
            m.store.advertise("bench-worker@localhost", queues, {}, ttl_s=3600)
            m.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        common.install_model(mw, bundle, records[:6000])
        model = mw.live.current().sources[MODEL_SOURCE]
        batch = messages(app, sample)
        lightgbm.Booster.predict = counting_predict

        memo = mw.memo

        def forget_all() -> None:
            memo.clear()
            model.compiled.cache.clear()

        rows.append(("model, no cache (trees)", timings(mw.on_publish, batch, forget_all,
                                                        repeat=1)))
        timings(mw.on_publish, batch, repeat=1)  # fill the caches
        rows.append(("model, memo miss", timings(mw.on_publish, batch, memo.clear)))
        timings(mw.on_publish, batch, repeat=1)
        rows.append(("model, memo hit", timings(mw.on_publish, batch)))
        forget_all()
        rows.append(("model, fresh caches", timings(mw.on_publish, batch, repeat=1)))
        hits = len(batch) - len(memo)
        print(f"fresh caches: {hits} of {len(batch)} decisions reused", file=sys.stderr)
        common.install_model(cold_mw, None, records[:6000])
        rows.append(("cold start: history", timings(cold_mw.on_publish, messages(cold, sample))))
        unknown = [dict(r, task="mail.send", tenant="default") for r in sample]
        fresh = make_app(run + "n", args.redis)
        fresh.aitp.live.current()
        rows.append(("cold start: nothing known", timings(fresh.aitp.on_publish,
                                                          messages(fresh, unknown))))
        common.close(fresh.aitp)
        common.cleanup(args.redis, [f"bench-{run}n*"])

        mw.store.withdraw("bench-worker@localhost")
        mw.live.refresh()
        rows.append(("fallback: no live worker", timings(mw.on_publish, batch)))
        mw.live._stop.set()  # no refresh from here on: the snapshot only ages
        view = mw.live._view
        mw.live._view = view.stale()
        rows.append(("fallback: store unreachable", timings(mw.on_publish, batch)))
        mw.live._view = view

        def explicit(name: str, message: Any, options: dict[str, Any]) -> Any:
            options.pop("_aitp_auto")
            options["queue"] = "hand-picked"
            return mw.on_publish(name, message, options)

        rows.append(("fallback: explicit queue", timings(explicit, batch)))
        lightgbm.Booster.predict = original_predict
        one = model.spec.vector("mail.send", tenants[0], (5,), {}, 4, 2, None, 0, time.time(),
                                None)
        import numpy as np

        row = np.array([one], dtype=np.float64)
        booster = lightgbm.Booster(model_str=bundle.p50_text)
        lgb_times = []
        for _ in range(500):
            start = time.perf_counter_ns()
            booster.predict(row)
            lgb_times.append((time.perf_counter_ns() - start) / 1000.0)
    finally:
        lightgbm.Booster.predict = original_predict
        for a in (app, cold):
            common.close(a.aitp)
        common.cleanup(args.redis, [f"bench-{run}*"])

    print(f"\ndecision latency (Middleware.on_publish, one call at a time, {args.tasks} "
          "synthetic messages per path)\n")
    print(f"{'path':30} {'p50 us':>8} {'p99 us':>8} {'calls':>7}")
    for name, values in rows:
        print(f"{name:30} {common.percentile(values, 0.5):8.2f} "
              f"{common.percentile(values, 0.99):8.2f} {len(values):7d}")
    print(f"\nLightGBM's own single-row predict (one forest): p50 "
          f"{common.percentile(lgb_times, 0.5):.1f} us, "
          f"p99 {common.percentile(lgb_times, 0.99):.1f} us")
    print(f"LightGBM predict calls on the publish path: {predict_calls['n']}")
    print(f"model: {len(model.spec.names)} features, {len(model.compiled.used_features)} used, "
          f"{bundle.meta['params']['rounds']} + {bundle.meta['params']['p90_rounds']} trees; "
          "budget p50 <= 10 us, p99 <= 50 us")


if __name__ == "__main__":
    main()
