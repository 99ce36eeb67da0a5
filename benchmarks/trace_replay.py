"""Issue 17's targets on public batch traces: the default policy vs FIFO vs the oracle.

    python benchmarks/trace_replay.py TRACE.swf.gz [TRACE.swf.gz ...] [--jobs 10000]

Each Standard Workload Format log is converted with ``celery-aitp import-swf`` (one job,
one task; the user is the tenant the task claims, the requested processors and time are
keyword arguments). The default policy lists no tenant, so every job is the default
tenant's, and the runs are recorded, and the model trained, under that name, as a
deployment's workers would record them. ``--jobs`` consecutive jobs from the middle
of the log are replayed, so the four traces take minutes, not hours, on a small
machine. The slots are sized from that slice so its offered load is ``--load`` (0.85
by default; a whole number of slots gets as close as it can, the table says what it
got), and the slowdown is bounded at 10 s.

Per trace, with the default policy:

- ``aitp``: a runtime model trained on the first ``--train-share`` of the slice, the rest
  replayed and counted (the first part is simulated as a warm-up in every run); the
  trainer retrains it beside the workers as ``celery aitp trainer`` does (every 600
  simulated seconds once 100 new runs arrived; ``--trainer-every 0``: never);
- ``cold``: the same, with no model at all (predictions from the replayed history only);
- ``fifo``: one FIFO queue, as plain Celery; ``oracle``: the true runtimes as predictions.

With ``--express N`` every run but FIFO has an express worker of N processes beside each
worker (``--aitp-express``), sharing its slots as cores: runs on a machine time-share
them, and the time a run loses that way counts as waiting.

Targets (issue 17): mean bounded slowdown <= 0.5x FIFO's and <= 1.2x the oracle's; short
tasks' (the fastest 80% by true runtime) p95 wait <= 0.3x FIFO's; long tasks' longest
wait <= 2x FIFO's; cold start's mean slowdown <= FIFO's. Writes
``benchmarks/results/trace-replay.json`` and ``.md`` (``--out`` for another directory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_aitp.cli.output import console, table  # noqa: E402
from celery_aitp.learn.train import train  # noqa: E402
from celery_aitp.policy import Policy, parse_policy, read_policy_file  # noqa: E402
from celery_aitp.replay.app import as_recorded, embedded_stores, pipeline_factory  # noqa: E402
from celery_aitp.replay.runner import (  # noqa: E402
    PolicyUnderTest,
    Replay,
    ReplayConfig,
    ReplayResult,
    offered_load,
    slots_for_load,
)
from celery_aitp.replay.trace import Trace, from_records, load_jsonl  # noqa: E402
from celery_aitp.replay.trainer import TrainerSettings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TAU_S = 10.0
#: Simulated seconds between two refreshes of the pipeline's shared state. Jobs arrive
#: minutes apart and run for minutes to days, so a refresh per simulated minute decides
#: as a 1 s refresh would, at a fraction of the cost.
REFRESH_S = 60.0


def convert(swf: Path, out: Path) -> Trace:
    """The log as observation records, by the product's own converter."""
    done = subprocess.run([sys.executable, "-m", "celery_aitp", "import-swf", str(swf),
                           "--out", str(out)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"import-swf {swf.name} failed:\n{done.stdout}{done.stderr}")
    return load_jsonl(out)


def log_name(swf: Path) -> str:
    """The log's name without the archive's suffixes (``-cln``, ``.swf``, ``.gz``)."""
    return swf.name.split("-cln")[0].split(".swf")[0]


def middle_slice(trace: Trace, jobs: int) -> Trace:
    """``jobs`` consecutive jobs from the middle of the log (all of it if shorter)."""
    if len(trace) <= jobs:
        return trace
    start = (len(trace) - jobs) // 2
    return from_records(trace.records[start:start + jobs])


def replay_trace(name: str, trace: Trace, policy: Policy, load: float,
                 train_share: float, trainer: TrainerSettings | None,
                 express: int = 0, tau_s: float = TAU_S,
                 refresh_s: float = REFRESH_S) -> dict[str, Any]:
    """One trace: train on its first part, replay aitp, cold, FIFO and the oracle
    (``tau_s``: the slowdown's bound; ``refresh_s``: simulated seconds between two
    refreshes of the pipeline's shared state)."""
    cut = int(len(trace) * train_share)
    started = time.perf_counter()
    trained = train(as_recorded(trace.records[:cut], policy))
    if trained.bundle is None:
        raise SystemExit(f"{name}: no model ({trained.reason})")
    scores = {s.name: {"mae_s": s.mae, "within_2x": s.within_2x} for s in trained.scores}
    slots = slots_for_load(trace, load, policy.default_accelerator)
    config = ReplayConfig(slots=slots, tau_s=tau_s, size_targets=True,
                          refresh_interval_s=refresh_s, count_from=trace.published[cut],
                          trainer=trainer, express=express)
    build = pipeline_factory(policy)
    with embedded_stores(model=trained.bundle) as stores, \
            embedded_stores("aitp-replay-cold") as cold_stores:
        config.store_factory = stores
        result = Replay(trace, config).run([
            PolicyUnderTest("aitp", policy, build),
            PolicyUnderTest("cold", policy, build, stores=cold_stores, kind="cold")])
    return summary(name, trace, result, cut, scores, time.perf_counter() - started)


def summary(name: str, trace: Trace, result: ReplayResult, cut: int,
            scores: dict[str, Any], seconds: float) -> dict[str, Any]:
    runs = {}
    for run in result.runs:
        groups = {g.name: g for g in run.stats.groups if g.kind in ("size", "all")}
        runs[run.name] = {
            "mean_slowdown": groups["all"].mean_slowdown,
            "short_wait_p95_s": groups["short"].wait_p95_s,
            "long_wait_max_s": groups["long"].wait_max_s,
            "wait_p50_s": groups["all"].wait_p50_s,
            "tiers": ({} if run.kind == "fifo"
                      else dict(sorted(_tier_counts(run.outcome, cut).items()))),
            "predicted_by": run.predictions, "models_promoted": run.models_promoted}
    load = offered_load(trace, result.slots)
    return {"trace": name, "jobs": len(trace), "trained_on": cut, "counted": len(trace) - cut,
            "days": trace.span_s / 86400, "slots": result.slots, "offered_load": load,
            "model_validation": scores, "runs": runs, "seconds": seconds,
            "targets": [{"name": t.name, "value": t.value, "limit": t.limit, "met": t.met}
                        for t in result.targets]}


def _tier_counts(outcome: Any, cut: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in range(cut, len(outcome.started)):
        label = outcome.label_of(i)
        counts[label] = counts.get(label, 0) + 1
    return counts


def print_tables(found: list[dict[str, Any]]) -> None:
    rows = []
    for item in found:
        for run, fig in item["runs"].items():
            rows.append((item["trace"], run, f"{fig['mean_slowdown']:.1f}",
                         f"{fig['short_wait_p95_s'] / 3600:.1f}",
                         f"{fig['long_wait_max_s'] / 3600:.1f}",
                         " ".join(f"{k} {v}" for k, v in fig["tiers"].items())))
    table("per trace and run (counted jobs; waits in hours)",
          ["trace", "run", "mean bounded slowdown", "short p95 wait h", "long max wait h",
           "tiers given"], rows)
    rows = []
    for item in found:
        for t in item["targets"]:
            rows.append((item["trace"], t["name"], f"{t['value']:.3f}", f"<= {t['limit']:g}",
                         "met" if t["met"] else "NOT met"))
    table("targets", ["trace", "target", "value", "limit", "verdict"], rows)


def markdown(found: list[dict[str, Any]], command: str) -> str:
    names = [t["name"] for t in found[0]["targets"]]
    lines = [f"Command: `{command}`", "",
             "| trace | jobs counted | slots (load) | " + " | ".join(names) + " |",
             "|---|---:|---|" + "---:|" * len(names)]
    for item in found:
        load = ", ".join(f"{n} ({100 * item['offered_load'][a]:.0f}%)"
                         for a, n in item["slots"].items())
        cells = [f"{t['value']:.2f} {'met' if t['met'] else '**not met**'}"
                 for t in item["targets"]]
        lines.append(f"| {item['trace']} | {item['counted']:,} | {load} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| trace | run | mean bounded slowdown | short p95 wait (h) | "
              "long max wait (h) | tiers given | models promoted |",
              "|---|---|---:|---:|---:|---|---:|"]
    for item in found:
        for run, fig in item["runs"].items():
            tiers = ", ".join(f"{k} {v}" for k, v in fig["tiers"].items())
            lines.append(f"| {item['trace']} | {run} | {fig['mean_slowdown']:.1f} | "
                         f"{fig['short_wait_p95_s'] / 3600:.1f} | "
                         f"{fig['long_wait_max_s'] / 3600:.1f} | {tiers} | "
                         f"{fig['models_promoted']} |")
    return "\n".join(lines) + "\n"


def trace_arguments(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the options every trace benchmark shares: the logs, the slice, the
    load and the share trained on (the same defaults, so their figures compare)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path, help="SWF logs (.swf or .swf.gz)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--train-share", type=float, default=0.3)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = trace_arguments(__doc__)
    parser.add_argument("--policy", type=Path, default=None,
                        help="a policy file instead of the default policy")
    parser.add_argument("--trainer-every", type=float, default=600.0,
                        help="simulated seconds between trainer rounds (0: no trainer)")
    parser.add_argument("--express", type=int, default=0,
                        help="processes of an express worker beside each worker, sharing "
                             "its slots as cores (aitp, cold and oracle runs; 0: none)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    policy = read_policy_file(str(args.policy)) if args.policy else parse_policy({})
    trainer = TrainerSettings(every_s=args.trainer_every) if args.trainer_every > 0 else None
    found = []
    with tempfile.TemporaryDirectory(prefix="aitp-trace-replay-") as tmp:
        for swf in args.traces:
            name = log_name(swf)
            trace = middle_slice(convert(swf, Path(tmp) / f"{name}.jsonl"), args.jobs)
            console.print(f"{name}: {len(trace)} jobs over {trace.span_s / 86400:.1f} days")
            found.append(replay_trace(name, trace, policy, args.load, args.train_share,
                                      trainer, args.express))
            console.print(f"  replayed in {found[-1]['seconds']:.0f}s")
    print_tables(found)
    command = ("python benchmarks/trace_replay.py " + " ".join(p.name for p in args.traces)
               + f" --jobs {args.jobs} --load {args.load:g} --train-share {args.train_share:g}"
               + f" --trainer-every {args.trainer_every:g}"
               + (f" --policy {args.policy.name}" if args.policy else "")
               + (f" --express {args.express}" if args.express else ""))
    suffix = (f"-{args.policy.stem}" if args.policy else "") \
        + ("-express" if args.express else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"trace-replay{suffix}.json").write_text(json.dumps(found, indent=1) + "\n")
    (args.out / f"trace-replay{suffix}.md").write_text(markdown(found, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
