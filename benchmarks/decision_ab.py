"""Decision latency of another checkout against this one, side by side in one process.

The machine's speed moves in bursts (up to 2x within seconds), so two runs of
``decision_latency.py`` minutes apart cannot tell a 10% change from the weather. This
loads the other checkout's ``celery_aitp`` first, sets it aside under another name, then
loads this one: two apps, one per version, publish the same messages, taking turns
every 50 messages (the order flips every round). Prints, per version, the
reused path's p50 and the steady state's p50 and p99 (as ``decision_latency.py``
defines them), medians over rounds.

    git worktree add ../before <commit>
    python benchmarks/decision_ab.py ../before --rounds 10

Environment: AITP_BENCH_REDIS_URL (the store; each app uses its own key prefix).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
PATHS = ("reused p50", "steady p50", "steady p99")


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def load_other(root: Path) -> ModuleType:
    """The other checkout's package, fully imported, then moved out of the way."""
    sys.path.insert(0, str(root))
    import celery_aitp as other

    if not Path(other.__file__ or "").resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"{root} holds no celery_aitp package")
    for name in list(sys.modules):
        if name == "celery_aitp" or name.startswith("celery_aitp."):
            sys.modules[f"_other.{name}"] = sys.modules.pop(name)
    sys.path.remove(str(root))
    return other


def make_app(package: ModuleType, run: str, url: str, policy: Any) -> Any:
    from celery import Celery

    app = Celery(f"ab-{run}", broker="memory://")
    app.conf.task_default_queue = f"bench-{run}"
    package.install(app, policy=policy, store_url=url, key_prefix=f"bench-{run}",
                    refresh_interval_s=1.0)
    for name in ("media.resize", "reports.build", "ml.fit", "etl.batch", "mail.send",
                 "geo.route"):
        app.task(name=name, shared=False)(_noop)
    # everything the publish path builds lazily, built now (before the swap of modules)
    mw = app.aitp
    _ = mw.pipeline, mw.memo, mw.live, mw.layout, mw.decision_log, mw._decision_records
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="a checkout of another version")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    other = load_other(args.other)
    sys.path.insert(0, str(HERE))
    import common
    import decision_latency as dl

    import celery_aitp
    from celery_aitp.predict.model_source import MODEL_SOURCE
    from celery_aitp.queues import all_tier_queues

    runs = {"other": common.tag() + "o", "this": common.tag() + "t"}
    apps = {"other": make_app(other, runs["other"], common.REDIS_URL,
                              common.policy_for(runs["other"], "takeover")),
            "this": make_app(celery_aitp, runs["this"], common.REDIS_URL,
                             common.policy_for(runs["this"], "takeover"))}
    print("training the benchmark model ...", file=sys.stderr)
    bundle = common.trained(common.workload(6000, "ab", seed=3)).bundle
    data: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, list[float]]] = {k: {p: [] for p in PATHS} for k in apps}
    try:
        for label, app in apps.items():
            run = runs[label]
            tenants = list(common.tenants_for(run).values())
            app.aitp.store.advertise("bench-worker@localhost", all_tier_queues(
                tenants, ("cpu", "gpu"), ("hi", "mid", "lo")), {}, ttl_s=3600)
            app.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
            common.install_model(app.aitp, bundle, common.workload(6000, run, seed=3))
            data[label] = {
                "batch": dl.messages(app, common.workload(2000, run, seed=21, compact=False)),
                "warm": dl.messages(app, common.workload(20000, run, seed=5, compact=False)),
                "new": dl.messages(app, common.workload(2000, run, seed=6, compact=False)),
            }
            app.aitp.live._stop.set()  # no refresh from here on
        for r in range(args.rounds):
            order = ("other", "this") if r % 2 == 0 else ("this", "other")
            mws = {label: apps[label].aitp for label in order}
            for label, mw in mws.items():  # fill the memo, then time reused decisions
                ship(mw)
                dl.timings(mw.on_publish, data[label]["batch"], repeat=1)
                ship(mw)
            reused = interleaved(mws, {k: d["batch"] * 2 for k, d in data.items()})
            for label, mw in mws.items():  # steady state: warm caches, then new messages
                mw.memo.clear()
                mw.live.current().sources[MODEL_SOURCE].compiled.cache.clear()
                ship(mw)
                dl.timings(mw.on_publish, data[label]["warm"], repeat=1)
                ship(mw)
            gc.collect()
            steady = interleaved(mws, {k: d["new"] for k, d in data.items()})
            for label in order:
                out = results[label]
                out["reused p50"].append(common.percentile(reused[label], 0.5))
                out["steady p50"].append(common.percentile(steady[label], 0.5))
                out["steady p99"].append(common.percentile(steady[label], 0.99))
            print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for label, app in apps.items():
            common.close(app.aitp)
            common.cleanup(common.REDIS_URL, [f"bench-{runs[label]}*"])

    print(f"\nside by side, {args.rounds} rounds, median over rounds (us); "
          f"other: {args.other}\n")
    print(f"{'version':8}" + "".join(f"{p:>12}" for p in PATHS) + "   steady p99 per round")
    for label, out in results.items():
        print(f"{label:8}" + "".join(f"{common.median(out[p]):12.2f}" for p in PATHS)
              + "   " + " ".join(f"{v:.0f}" for v in out["steady p99"]))


def interleaved(mws: dict[str, Any], batches: dict[str, list[Any]], size: int = 50
                ) -> dict[str, list[float]]:
    """Each version's timings of its batch, the versions taking turns every ``size``
    messages (so a burst of the machine weighs on both alike)."""
    clock = time.perf_counter_ns
    out: dict[str, list[float]] = {label: [] for label in mws}
    n = min(len(batch) for batch in batches.values())
    for start in range(0, n, size):
        for label, mw in mws.items():
            times = out[label]
            publish = mw.on_publish
            for name, message, options in batches[label][start:start + size]:
                opts = dict(options, _aitp_auto=True)
                begin = clock()
                publish(name, message, opts)
                times.append((clock() - begin) / 1000.0)
    return out


def ship(mw: Any) -> None:
    """Drop what the (stopped) refresher would ship, outside the timed part."""
    for buffer in mw.live.buffers.values():
        buffer.take(limit=len(buffer))
    mw.counters.drain()


if __name__ == "__main__":
    main()
