"""Prediction accuracy on a generated workload, against the baselines; training time.

Generates observation records whose runtimes depend non-linearly on the arguments and on
the tenant (``celery_aitp.learn.synthetic``), trains exactly as ``celery aitp train``
does (chronological split: the newest 20% held out) and prints the comparison table, then
checks the compiled publish-path model against LightGBM on the held-out records.

    python benchmarks/prediction_accuracy.py            # 100,000 records

Done when: the model's MAE is at most 0.7x the last-two baseline's, at least 70% of its
predictions are within 2x of the truth, and training 100,000 records takes under 30 s.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from celery_aitp.learn import synthetic  # noqa: E402
from celery_aitp.learn.train import Matrix, TrainConfig, predict_log, train  # noqa: E402
from celery_aitp.predict.bundle import booster_from_text, load_bundle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0,
                        help="LightGBM threads (0: all cores, as the trainer does; on a busy "
                             "machine 1 is steadier)")
    args = parser.parse_args()

    started = time.perf_counter()
    records = list(synthetic.records(args.records, seed=args.seed))
    generated_s = time.perf_counter() - started
    cpu = time.process_time()
    result = train(records, TrainConfig(threads=args.threads))
    cpu = time.process_time() - cpu
    if result.bundle is None:
        raise SystemExit(result.reason)

    print(f"\nprediction accuracy: {args.records:,} generated records "
          f"({len(synthetic.TASKS)} tasks, {len(synthetic.TENANTS)} tenants), newest 20% held out")
    print(result.dataset.summary())
    print(f"\n{'predictor':16} {'MAE s':>9} {'median AE s':>12} {'within 2x':>10}")
    for s in result.scores:
        print(f"{s.name:16} {s.mae:9.4f} {s.median_ae:12.4f} {s.within_2x:10.1%}")
    model, last_two = result.score("model"), result.score("last two")
    ratio = model.mae / last_two.mae
    print(f"\nmodel MAE / last-two MAE: {ratio:.3f} (target <= 0.7); "
          f"within 2x: {model.within_2x:.1%} (target >= 70%)")
    print(f"p90: {result.p90_coverage:.1%} of held-out runs finished within the predicted p90")
    print(f"training {len(result.dataset):,} records: {result.seconds:.1f} s (target < 30 s; "
          f"{cpu:.1f} s of this process's CPU; generating them took {generated_s:.1f} s)")

    loaded = load_bundle(result.bundle)
    held_out = result.dataset.observations[-2000:]
    matrix = Matrix(loaded.spec, held_out)
    boosters = (booster_from_text(result.bundle.p50_text, "p50"),
                booster_from_text(result.bundle.p90_text, "p90"))
    low, high = predict_log(boosters, matrix.x)
    worst = max(max(abs(loaded.compiled.raw(row)[0] - lo), abs(loaded.compiled.raw(row)[1] - hi))
                for row, lo, hi in zip(matrix.x.tolist(), low.tolist(), high.tolist(),
                                       strict=True))
    print(f"compiled publish-path model vs LightGBM on {len(held_out):,} held-out rows: "
          f"largest score difference {worst:.1e}")
    met = ratio <= 0.7 and model.within_2x >= 0.7 and result.seconds < 30
    print("targets met" if met else "TARGETS NOT MET")
    if not math.isfinite(ratio):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
