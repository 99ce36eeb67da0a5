"""Decision latency of another checkout against this one, side by side in one process.

The machine's speed moves in bursts (up to 2x within seconds), so two runs of
``decision_latency.py`` minutes apart cannot tell a 10% change from the weather. This
loads the other checkout's ``celery_aitp`` first and keeps it out of ``sys.modules``
except while its app is set up, then loads this one: two apps, one per version, publish
the same messages, taking turns every 50 messages (the order flips every round). Prints,
per version, the reused path's p50 and the steady state's p50 and p99 (as
``decision_latency.py`` defines them), medians over rounds. Each version's own trainer
makes its model from the same records, so a change of features or training is measured
with the model it produces.

    git worktree add ../before <commit>
    python benchmarks/decision_ab.py ../before --rounds 10

Environment: AITP_BENCH_REDIS_URL (the store; each app uses its own key prefix).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
PATHS = ("reused p50", "steady p50", "steady p99")


def _ours(name: str) -> bool:
    return name == "celery_aitp" or name.startswith("celery_aitp.")


class OtherVersion:
    """Another checkout's ``celery_aitp``, imported, then kept out of ``sys.modules``.

    Its functions import some modules lazily (``install`` does), and such an import finds
    whichever ``celery_aitp`` is in ``sys.modules`` at call time: so its app is set up
    inside :meth:`active`, which puts its modules back meanwhile. The publish path does
    no lazy import, so it is timed outside.
    """

    def __init__(self, root: Path) -> None:
        sys.path.insert(0, str(root))
        try:
            import celery_aitp as package
        finally:
            sys.path.remove(str(root))
        if not Path(package.__file__ or "").resolve().is_relative_to(root.resolve()):
            raise SystemExit(f"{root} holds no celery_aitp package")
        self.package: ModuleType = package
        self.modules = {name: sys.modules.pop(name) for name in list(sys.modules)
                        if _ours(name)}

    @contextmanager
    def active(self) -> Iterator[ModuleType]:
        mine = {name: sys.modules.pop(name) for name in list(sys.modules) if _ours(name)}
        sys.modules.update(self.modules)
        try:
            yield self.package
        finally:
            for name in [name for name in sys.modules if _ours(name)]:
                self.modules[name] = sys.modules.pop(name)
            sys.modules.update(mine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="a checkout of another version")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    other = OtherVersion(args.other)
    sys.path.insert(0, str(HERE))
    import common
    import decision_latency as dl

    from celery_aitp.predict.model_source import MODEL_SOURCE
    from celery_aitp.queues import all_tier_queues

    print("training the benchmark models ...", file=sys.stderr)
    bundles: dict[str, Any] = {}
    runs = {"other": common.tag() + "o", "this": common.tag() + "t"}
    apps: dict[str, Any] = {}
    data: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, list[float]]] = {k: {p: [] for p in PATHS} for k in runs}

    def set_up(label: str, package: ModuleType) -> None:
        run = runs[label]
        app = apps[label] = dl.make_app(run, common.REDIS_URL, package=package)
        tenants = list(common.tenants_for(run).values())
        app.aitp.store.advertise("bench-worker@localhost", all_tier_queues(
            tenants, ("cpu", "gpu"), ("hi", "mid", "lo")), {}, ttl_s=3600)
        app.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        # each version's own trainer makes its model (a feature schema may differ)
        trainer = importlib.import_module("celery_aitp.learn.train")
        bundle = bundles[label] = trainer.train(common.workload(6000, "ab", seed=3)).bundle
        common.install_model(app.aitp, bundle, common.workload(6000, run, seed=3))
        data[label] = {
            "batch": dl.messages(app, common.workload(2000, run, seed=21, compact=False)),
            "warm": dl.messages(app, common.workload(20000, run, seed=5, compact=False)),
            "new": dl.messages(app, common.workload(2000, run, seed=6, compact=False)),
        }
        app.aitp.live._stop.set()  # no refresh from here on, and the view never goes
        app.aitp.live.max_staleness_s = float("inf")  # stale, however slow the machine

    try:
        with other.active() as package:
            set_up("other", package)
        set_up("this", dl.celery_aitp)
        for r in range(args.rounds):
            order = ("other", "this") if r % 2 == 0 else ("this", "other")
            mws = {label: apps[label].aitp for label in order}
            for label, mw in mws.items():  # fill the memo, then time reused decisions
                dl.ship(mw)
                dl.timings(mw.on_publish, data[label]["batch"], repeat=1)
                dl.ship(mw)
            reused = interleaved(mws, {k: d["batch"] * 2 for k, d in data.items()})
            for label, mw in mws.items():  # steady state: warm caches, then new messages
                mw.memo.clear()
                mw.live.current().sources[MODEL_SOURCE].compiled.cache.clear()
                dl.ship(mw)
                dl.timings(mw.on_publish, data[label]["warm"], repeat=1)
                dl.ship(mw)
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
    for label, bundle in bundles.items():
        params = bundle.meta["params"]
        print(f"{label} model: {bundle.meta['target']}, {params['rounds']} + "
              f"{params['p90_rounds']} trees")
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


if __name__ == "__main__":
    main()
