"""Does the replay simulator reproduce what really happened? Measured vs simulated waits.

    python benchmarks/replay_validation.py            # after benchmarks/scheduling.py

Replays each run of the scheduling benchmark from its own trace (the observation
records of the takeover and oracle runs; the FIFO run's timings in the same schema) with
the benchmark app's real pipeline and declarations and the same slots (the warm-up runs
simulated, not counted), and compares the simulated run of the same kind (policy, FIFO,
oracle) with the measured p50/p95 waits per tier and overall in ``scheduling.json``, over
the same tasks in the same groups (the tier the takeover run gave each task). Target:
within 15%. Waits of a few milliseconds are Redis and thread wake-up jitter, so a
difference under 5 ms also counts as reproduced; groups of fewer than 100 tasks are shown
but not counted (their p95 is one or two values). The per-run overhead is measured from
each trace (``--overhead-ms auto``). Writes the replay's HTML report next to the results.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sched_app import make_app  # noqa: E402
from benchmarks.scheduling import trace_name  # noqa: E402
from benchmarks.workload import SLOTS  # noqa: E402
from celery_aitp.cli.output import console, table  # noqa: E402
from celery_aitp.cli.replay import execute  # noqa: E402
from celery_aitp.predict.bundle import ModelBundle  # noqa: E402
from celery_aitp.replay.app import app_declarations, embedded_stores, policies_for_app  # noqa: E402
from celery_aitp.replay.metrics import RunStats, run_stats  # noqa: E402
from celery_aitp.replay.runner import (  # noqa: E402
    DEFAULT_OVERHEAD_S,
    ReplayConfig,
    ReplayResult,
    estimate_overhead,
    infer_slots,
)
from celery_aitp.replay.trace import Trace, load_jsonl  # noqa: E402

TOLERANCE = 0.15
ABSOLUTE_FLOOR_S = 0.005
#: Groups smaller than this are shown but not counted: the p95 of 37 waits is the second
#: largest of them, a sampling accident rather than a property of the scheduler.
MIN_GROUP = 100
RESULTS = Path(__file__).resolve().parent / "results"


def verdict(measured: float, simulated: float) -> tuple[float, bool]:
    err = (simulated - measured) / measured if measured > 0 else 0.0
    return err, abs(err) <= TOLERANCE or abs(simulated - measured) <= ABSOLUTE_FLOOR_S


ITEM = re.compile(r"(?:-m|^fifo-)(\d+)$")


def item_labels(trace: Trace) -> dict[int, str]:
    """Workload item -> the tier the takeover run gave it (how the measurement groups)."""
    out = {}
    for record in trace.records:
        found = ITEM.search(record["task_id"] or "")
        if found and record["tier"]:
            out[int(found.group(1))] = record["tier"]
    return out


def same_groups(result: ReplayResult, run: str, labels: dict[int, str],
                measured_from: float) -> RunStats:
    """The simulated run's figures over the measured tasks, grouped as measured."""
    trace, out = result.trace, result.run(run).outcome
    waits, runtimes, tiers, tenants = [], [], [], []
    for i, record in enumerate(trace.records):
        found = ITEM.search(record["task_id"] or "")
        if not found or trace.published[i] < measured_from or math.isnan(out.started[i]):
            continue
        waits.append(out.started[i] - trace.published[i])
        runtimes.append(trace.runtime[i])
        tiers.append(labels.get(int(found.group(1)), "?"))
        tenants.append(record["tenant"] or "(none)")
    return run_stats(run, waits, runtimes, tiers, tenants, result.sla, result.tier_order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--overhead-ms", default="auto",
                        help="ms per run beyond its runtime; 'auto': measured from each trace")
    args = parser.parse_args(argv)
    measured = json.loads((args.results / "scheduling.json").read_text())
    app = make_app("aitp", "redis://127.0.0.1:6379/15", "aitp-replay-validation", "celery")
    mw = app.aitp
    fixed = None if args.overhead_ms == "auto" else float(args.overhead_ms) / 1000
    config = ReplayConfig(slots=SLOTS, default_queue=str(app.conf.task_default_queue),
                          overhead_s=DEFAULT_OVERHEAD_S if fixed is None else fixed,
                          declarations=app_declarations(mw))
    labels = item_labels(load_jsonl(args.results / trace_name("aitp")))
    rows: list[list[object]] = []
    big_tally, small_tally = [0, 0], [0, 0]  # figures checked, figures off
    model_dir = args.results / "scheduling-model"
    model = ModelBundle.read(model_dir) if model_dir.is_dir() else None
    console.print(f"runtime model: {model.version if model else 'none (cold start)'}")
    with embedded_stores(model=model) as stores, tempfile.TemporaryDirectory() as scratch:
        config.store_factory = stores
        for run in ("fifo", "aitp", "oracle"):
            trace = load_jsonl(args.results / trace_name(run))
            console.print(f"[bold]{run}[/bold] run's trace; slots: benchmark {SLOTS}, "
                          f"inferred {infer_slots(trace)}")
            config.count_from = measured["runs"][run]["measured_from"]  # after the warm-up
            config.class_overhead_s = estimate_overhead(trace) if fixed is None else {}
            report = args.results / "replay-report.html" if run == "aitp" \
                else Path(scratch) / f"replay-{run}.html"
            result = execute(trace, trace_name(run), policies_for_app(mw, []), config, report)
            sim = same_groups(result, run, labels, measured["runs"][run]["measured_from"])
            for group in measured["runs"][run]["groups"]:
                mine = sim.group(group["kind"], group["name"])
                if group["kind"] == "tenant" or mine is None:
                    continue
                small = group["tasks"] < MIN_GROUP
                cells: list[object] = [run, group["name"], group["tasks"]]
                for key in ("wait_p50_s", "wait_p95_s"):
                    err, ok = verdict(group[key], getattr(mine, key))
                    tally = small_tally if small else big_tally
                    tally[0] += 1
                    tally[1] += not ok
                    mark = "" if ok else (" (small)" if small else " !")
                    cells += [group[key], getattr(mine, key), f"{100 * err:+.0f}%{mark}"]
                rows.append(cells)
    table("measured vs simulated waits (s)", ["run", "group", "tasks", "p50 measured",
          "p50 simulated", "error", "p95 measured", "p95 simulated", "error"], rows)
    (checked, failures), (small_checked, small_failures) = big_tally, small_tally
    console.print(f"groups of {MIN_GROUP}+ tasks: {checked - failures} of {checked} figures "
                  f"within {TOLERANCE:.0%} (or {ABSOLUTE_FLOOR_S * 1000:g} ms)")
    if small_checked:
        console.print(f"groups under {MIN_GROUP} tasks (percentiles of few values; not "
                      f"counted): {small_checked - small_failures} of {small_checked} within")
    (args.results / "replay-validation.json").write_text(json.dumps(
        {"checked": checked, "failures": failures, "small_groups_checked": small_checked,
         "small_groups_failures": small_failures, "rows": rows}, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
