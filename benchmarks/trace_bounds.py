"""What any queue order could do with each runtime predictor on the public batch logs.

    python benchmarks/trace_bounds.py TRACE.swf.gz [TRACE.swf.gz ...] [--jobs 10000]

``trace_replay.py`` measures the product's placement. This benchmark measures the ceiling
it works under: the same slice of each log (``--jobs`` from the middle), the same slots
(offered load ``--load``), the same first ``--train-share`` trained on and simulated as a
warm-up, the same metrics over the rest (bounded slowdown at 10 s; short tasks: the
fastest 80% by true runtime), on an *ideal* worker (:mod:`benchmarks.ideal`: exact
runtimes, no overhead, non-preemptive, one queue served shortest first as the predictor
sees it). No tiers, no weights, no reserve: a predictor's row is the best any order
driven by its predictions could do; the oracle's (true runtimes) is the best any
non-preemptive order could do at all.

Predictors: ``fifo`` (publish order), ``requested time`` (what the user asked the batch
system for), ``last two`` (mean of the last two finished runs of the task's history),
``model p50`` and ``model p90`` (the product's model, trained as ``celery aitp train``
does), ``oracle``. Each with the runs recorded two ways:

- ``default policy``: as ``trace_replay.py`` replays them, a policy that lists none of
  the logs' users, so every run is the default tenant's (the model and the history see
  no user);
- ``users``: a policy whose ``unlisted_tenants`` gives each user a tenant of its own (a
  class, ``tenant_classes``), so the model and the history see who submitted each job.

Writes ``benchmarks/results/trace-bounds.json`` and ``.md`` (``--out`` for another
directory). Takes a few minutes per log (two trainings).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ideal import ideal_starts  # noqa: E402
from benchmarks.trace_replay import (  # noqa: E402
    TAU_S,
    convert,
    log_name,
    middle_slice,
    trace_arguments,
)
from celery_aitp.learn.dataset import Observation, build_dataset  # noqa: E402
from celery_aitp.learn.train import bundle_seconds, train  # noqa: E402
from celery_aitp.numbers import finite_number  # noqa: E402
from celery_aitp.policy import Policy, parse_policy  # noqa: E402
from celery_aitp.replay.app import as_recorded  # noqa: E402
from celery_aitp.replay.metrics import bounded_slowdown, short_mask  # noqa: E402
from celery_aitp.replay.runner import slots_for_load  # noqa: E402
from celery_aitp.replay.trace import Trace  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: How the runs are recorded: the product's default policy, and one that keeps users.
VIEWS: dict[str, dict[str, Any]] = {
    "default policy": {},
    "users": {"tenants": {"default": {}}, "tenant_classes": {"users": {}},
              "unlisted_tenants": "users"},
}
PREDICTORS = ("fifo", "requested time", "last two", "model p50", "model p90", "oracle")


def predictions(trace: Trace, policy: Policy, cut: int) -> dict[str, list[float]]:
    """Each predictor's runtime for every job of ``trace`` (the model is trained on the
    first ``cut`` jobs as the policy's workers record them; history features come only
    from runs finished before each job was published)."""
    records = as_recorded(trace.records, policy)
    observations = build_dataset(records).observations
    if len(observations) != len(trace):
        raise SystemExit(f"{len(trace) - len(observations)} jobs are not usable records")
    trained = train(records[:cut])
    if trained.bundle is None:
        raise SystemExit(f"no model: {trained.reason}")
    p50, p90 = bundle_seconds(trained.bundle, observations)
    typical = statistics.median(trace.runtime[:cut])
    return {"fifo": list(trace.published),
            "requested time": [_known(o.arguments.get("kw.requested_time_s"), typical)
                               for o in observations],
            "last two": [_last_two(o, typical) for o in observations],
            "model p50": p50.tolist(), "model p90": p90.tolist(),
            "oracle": list(trace.runtime)}


def _known(value: Any, fallback: float) -> float:
    found = finite_number(value)
    return fallback if found is None else found


def _last_two(observation: Observation, fallback: float) -> float:
    history = observation.history
    return _known(history[0] if history is not None else None, fallback)


def figures(trace: Trace, key: Sequence[float], slots: int, cut: int) -> dict[str, float]:
    """Mean bounded slowdown, short tasks' p95 wait and long tasks' longest wait of the
    counted jobs, served shortest ``key`` first on the ideal worker."""
    import numpy as np

    started = ideal_starts(trace.published, trace.runtime, key, slots)
    wait = np.array(started[cut:]) - np.array(trace.published[cut:])
    runtime = np.array(trace.runtime[cut:])
    short = np.array(short_mask(runtime.tolist()))
    return {"mean_slowdown": float(bounded_slowdown(wait, runtime, TAU_S).mean()),
            "short_wait_p95_s": float(np.percentile(wait[short], 95)),
            "long_wait_max_s": float(wait[~short].max())}


def bounds(name: str, trace: Trace, load: float, train_share: float) -> dict[str, Any]:
    started = time.perf_counter()
    cut = int(len(trace) * train_share)
    slots = slots_for_load(trace, load)
    if len(slots) != 1:
        raise SystemExit(f"{name}: one accelerator class expected, got {sorted(slots)}")
    (count,) = slots.values()
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for view, policy in VIEWS.items():
        found = predictions(trace, parse_policy(policy), cut)
        rows[view] = {p: figures(trace, found[p], count, cut) for p in PREDICTORS}
    return {"trace": name, "jobs": len(trace), "counted": len(trace) - cut, "slots": count,
            "rows": rows, "seconds": time.perf_counter() - started}


def markdown(found: list[dict[str, Any]], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Ideal non-preemptive worker, one queue served shortest first as each predictor "
             "sees it (waits in hours; ratios to FIFO's and to the oracle's mean slowdown).",
             "", "| log | runs recorded | predictor | mean bounded slowdown | x FIFO | "
             "x oracle | short p95 wait h | long max wait h |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for item in found:
        for view, rows in item["rows"].items():
            fifo, oracle = rows["fifo"]["mean_slowdown"], rows["oracle"]["mean_slowdown"]
            for predictor, fig in rows.items():
                if view != "default policy" and predictor in ("fifo", "oracle"):
                    continue  # the same order whatever is recorded
                slow = fig["mean_slowdown"]
                lines.append(f"| {item['trace']} | {view} | {predictor} | {slow:.1f} | "
                             f"{slow / fifo:.2f} | {slow / oracle:.2f} | "
                             f"{fig['short_wait_p95_s'] / 3600:.1f} | "
                             f"{fig['long_wait_max_s'] / 3600:.1f} |")
    return "\n".join(lines) + "\n"


def print_rows(found: list[dict[str, Any]]) -> None:
    for item in found:
        print(f"\n{item['trace']}: {item['counted']:,} jobs counted, {item['slots']} slots, "
              f"{item['seconds']:.0f} s")
        for view, rows in item["rows"].items():
            oracle = rows["oracle"]["mean_slowdown"]
            for predictor, fig in rows.items():
                print(f"  {view:15} {predictor:15} slowdown {fig['mean_slowdown']:8.1f} "
                      f"({fig['mean_slowdown'] / oracle:5.2f}x oracle)  short p95 "
                      f"{fig['short_wait_p95_s'] / 3600:6.1f} h  long max "
                      f"{fig['long_wait_max_s'] / 3600:6.1f} h")


def main(argv: list[str] | None = None) -> int:
    parser = trace_arguments(__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.traces:
            name = log_name(path)
            trace = middle_slice(convert(path, Path(tmp) / f"{name}.jsonl"), args.jobs)
            found.append(bounds(name, trace, args.load, args.train_share))
            print_rows(found[-1:])
    args.out.mkdir(parents=True, exist_ok=True)
    command = (f"python benchmarks/trace_bounds.py {' '.join(p.name for p in args.traces)} "
               f"--jobs {args.jobs} --load {args.load} --train-share {args.train_share}")
    (args.out / "trace-bounds.json").write_text(json.dumps(found, indent=1) + "\n")
    (args.out / "trace-bounds.md").write_text(markdown(found, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
