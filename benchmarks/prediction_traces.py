"""Prediction accuracy on real batch-job logs (SWF), online, against history baselines.

For each trace: convert it as ``celery-aitp import-swf`` does, train exactly as
``celery aitp train`` does on the first 70% of the jobs by submit time, then predict the
other 30% online: the model stays fixed, while the history features of each job come
from the runs that had finished when it was submitted (a leak probe recounts a sample by
brute force). Prints MAE, median absolute error, share within 2x and p90 coverage of the
model and of the baselines: last two per user, last two per (user, task), and the
user's requested time. The generated workload (``celery_aitp.learn.synthetic``) is a
second set, scored the same way.

    python benchmarks/prediction_traces.py TRACE.swf.gz [TRACE.swf ...] [--generated 100000]
    python benchmarks/prediction_traces.py --dir TRACES_DIR          # every *.swf[.gz] there

Done when, on every set: model MAE <= 0.85x the better last-two baseline's, its within-2x
at least that baseline's, and its p90 covering 85-95% of runs.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from celery_aitp.jsonl import open_text  # noqa: E402
from celery_aitp.learn import synthetic  # noqa: E402
from celery_aitp.learn.dataset import Observation, build_dataset  # noqa: E402
from celery_aitp.learn.swf import SwfResult, swf_records  # noqa: E402
from celery_aitp.learn.train import TrainConfig, bundle_seconds, train  # noqa: E402
from celery_aitp.predict.features import HISTORY_FEATURES  # noqa: E402

TRAIN_SHARE = 0.7
MAE_TARGET = 0.85
COVERAGE = (0.85, 0.95)
PROBE_SAMPLE = 300
_TENANT = HISTORY_FEATURES.index("t_last2")


@dataclass
class Score:
    name: str
    mae: float
    median_ae: float
    within_2x: float
    p90_coverage: float | None


def score(name: str, truth: Sequence[float], predicted: Sequence[float],
          upper: Sequence[float] | None = None) -> Score:
    errors = [abs(p - t) for p, t in zip(predicted, truth, strict=True)]
    within = sum(1 for p, t in zip(predicted, truth, strict=True)
                 if p > 0 and 0.5 <= p / max(t, 1e-4) <= 2.0)
    covered = (None if upper is None else
               sum(1 for u, t in zip(upper, truth, strict=True) if t <= u) / len(truth))
    return Score(name, sum(errors) / len(errors), statistics.median(errors),
                 within / len(truth), covered)


def _known(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value and value > 0


def last_two(candidates: list[Observation], at: float) -> float | None:
    """Brute force: mean of the two runs that finished last, no later than ``at``."""
    done = [o for o in candidates if o.finished_at is not None and o.finished_at <= at]
    if not done:
        return None
    done.sort(key=lambda o: (o.finished_at or 0.0, o.published_at, o.index))
    newest = [o.runtime_s or 0.0 for o in done[-2:]]
    return sum(newest) / len(newest)


def leak_probe(observations: list[Observation], test: list[Observation],
               seed: int = 1) -> tuple[int, int]:
    """(matching, probed): recount a sample's history from every run by brute force.

    A history that used a run finished after the task's publication (a leak) would
    differ from the recount."""
    by_pair: dict[tuple[str, str], list[Observation]] = {}
    by_tenant: dict[str, list[Observation]] = {}
    for o in observations:
        by_pair.setdefault((o.tenant, o.task), []).append(o)
        by_tenant.setdefault(o.tenant, []).append(o)
    sample = random.Random(seed).sample(test, min(PROBE_SAMPLE, len(test)))
    matching = 0
    for o in sample:
        pair = last_two(by_pair[(o.tenant, o.task)], o.published_at)
        tenant = last_two(by_tenant[o.tenant], o.published_at)
        history = o.history
        got_pair = history[0] if history is not None and history[0] == history[0] else None
        got_tenant = history[_TENANT] if history is not None else None
        got_tenant = got_tenant if got_tenant == got_tenant else None
        if _close(pair, got_pair) and _close(tenant, got_tenant):
            matching += 1
    return matching, len(sample)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@dataclass
class SetResult:
    name: str
    records: int
    skipped: str
    train_s: float
    scores: list[Score]
    probe: tuple[int, int]
    trees: int

    def best_last_two(self) -> Score:
        pair, user = self.scores[1], self.scores[2]
        return pair if pair.mae <= user.mae else user

    def verdict(self) -> tuple[float, float, bool]:
        model, best = self.scores[0], self.best_last_two()
        ratio = model.mae / best.mae if best.mae else math.inf
        gain = model.within_2x - best.within_2x
        cov = model.p90_coverage or 0.0
        met = ratio <= MAE_TARGET and gain >= 0 and COVERAGE[0] <= cov <= COVERAGE[1]
        return ratio, gain, met


def evaluate(name: str, records: list[Any], skipped: str, config: TrainConfig) -> SetResult:
    dataset = build_dataset(records)  # history rebuilt online, in time order
    observations = dataset.observations
    cut = int(len(observations) * TRAIN_SHARE)
    head, test = observations[:cut], observations[cut:]
    started = time.perf_counter()
    result = train([records[o.index] for o in head], config)
    train_s = time.perf_counter() - started
    if result.bundle is None:
        raise SystemExit(f"{name}: {result.reason}")
    meta = result.bundle.meta
    p50, p90 = bundle_seconds(result.bundle, test)
    median = statistics.median(o.runtime_s or 0.0 for o in head)
    truth = [o.runtime_s or 0.0 for o in test]
    user = [h[_TENANT] if h is not None and _known(h[_TENANT]) else median
            for h in (o.history for o in test)]
    pair = [h[0] if h is not None and _known(h[0]) else u
            for h, u in zip((o.history for o in test), user, strict=True)]
    scores = [score("model", truth, p50.tolist(), p90.tolist()),
              score("last two (user, task)", truth, pair),
              score("last two (user)", truth, user)]
    requested = [o.arguments.get("kw.requested_time_s") for o in test]
    if sum(1 for r in requested if _known(r)) >= 0.5 * len(test):
        asked = [float(r) if _known(r) else median for r in requested]
        scores.append(score("requested time", truth, asked, asked))
    return SetResult(name, len(observations), skipped, train_s, scores,
                     leak_probe(observations, test), int(meta["params"]["rounds"]))


def print_set(res: SetResult) -> None:
    print(f"\n{res.name}: {res.records:,} jobs ({res.skipped}); trained on the first "
          f"{TRAIN_SHARE:.0%} in {res.train_s:.1f} s ({res.trees} p50 trees), "
          f"predicted the rest online")
    print(f"  {'predictor':24} {'MAE s':>10} {'median AE s':>12} {'within 2x':>10} "
          f"{'p90 covers':>11}")
    for s in res.scores:
        cov = "" if s.p90_coverage is None else f"{s.p90_coverage:.1%}"
        print(f"  {s.name:24} {s.mae:10.1f} {s.median_ae:12.1f} {s.within_2x:10.1%} {cov:>11}")
    ratio, gain, met = res.verdict()
    matching, probed = res.probe
    print(f"  model MAE / better last-two: {ratio:.3f} (target <= {MAE_TARGET}); within 2x "
          f"{gain * 100:+.1f} points; {'met' if met else 'NOT MET'}")
    print(f"  leak probe: {matching} of {probed} sampled histories match a brute-force "
          f"recount of runs finished before publication"
          + ("" if matching == probed else "  LEAK"))


def trace_sets(paths: list[Path]) -> list[tuple[str, list[Any], str]]:
    out = []
    for path in paths:
        result = SwfResult()
        with open_text(path) as handle:
            records = list(swf_records(handle, result))
        name = path.name.split(".swf")[0]
        skipped = sum(result.skipped.values())
        reasons = ", ".join(f"{why}: {n}" for why, n in result.skipped.most_common())
        out.append((name, records, f"skipped {skipped} ({reasons})" if skipped
                    else "none skipped"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help="SWF files (.swf or .swf.gz)")
    parser.add_argument("--dir", type=Path, help="Also every *.swf / *.swf.gz in this folder.")
    parser.add_argument("--generated", type=int, default=100_000,
                        help="Records of the generated workload (0: skip it).")
    parser.add_argument("--threads", type=int, default=1,
                        help="LightGBM threads (0: all cores; on a busy machine 1 is faster).")
    args = parser.parse_args()
    paths = list(args.traces)
    if args.dir:
        paths += sorted(p for p in args.dir.iterdir() if p.name.endswith((".swf", ".swf.gz")))
    config = TrainConfig(threads=args.threads)
    results = []
    for name, records, skipped in trace_sets(paths):
        results.append(evaluate(name, records, skipped, config))
        print_set(results[-1])
    if args.generated:
        records = list(synthetic.records(args.generated, seed=0))
        results.append(evaluate("generated", records, "none skipped", config))
        print_set(results[-1])
    print("\n| set | model MAE / better last-two | within 2x: model / last-two | p90 covers |")
    print("| --- | ---: | ---: | ---: |")
    for res in results:
        ratio, _, _ = res.verdict()
        best = res.best_last_two()
        print(f"| {res.name} | {ratio:.2f} | {res.scores[0].within_2x:.0%} / "
              f"{best.within_2x:.0%} | {res.scores[0].p90_coverage or 0:.0%} |")
    failed = [r.name for r in results if not r.verdict()[2]]
    print("targets met on every set" if not failed else f"TARGETS NOT MET: {', '.join(failed)}")


if __name__ == "__main__":
    main()
