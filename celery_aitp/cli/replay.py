"""``celery -A proj aitp replay`` and ``celery-aitp replay``: try a policy on recorded runs.

Replays observation records (the store's ``obs`` stream, or a JSON-lines file) in a
deterministic discrete-event simulation under each policy, plain FIFO and the oracle;
prints waits, slowdown, SLA hits and fairness per tier and tenant, and writes a
self-contained HTML report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from celery_aitp.cli.output import console, fail, table
from celery_aitp.cli.training import parse_duration, print_result
from celery_aitp.errors import AitpError
from celery_aitp.extras import require
from celery_aitp.policy import Policy
from celery_aitp.replay.metrics import RunStats, Target, ran
from celery_aitp.replay.report import RunSeries, html_report
from celery_aitp.replay.routers import Declarations, recorded_declarations
from celery_aitp.replay.runner import (
    DEFAULT_OVERHEAD_S,
    PolicyUnderTest,
    Replay,
    ReplayConfig,
    ReplayResult,
    estimate_overhead,
    infer_slots,
    offered_load,
    parse_slots,
    slots_for_load,
)
from celery_aitp.replay.trace import Trace, from_records, load_jsonl
from celery_aitp.replay.trainer import TrainerSettings

#: With more tenants than this, their rows are left to the HTML report.
MAX_TENANT_ROWS = 12


def print_stats(stats: Sequence[RunStats], found: Sequence[Target]) -> None:
    """The table shared by the replay and the scheduling benchmark."""
    console.width = max(console.width, 110)
    rows = []
    tenants = {g.name for st in stats for g in st.groups if g.kind == "tenant"}
    for st in stats:
        for g in st.groups:
            if g.kind == "tenant" and len(tenants) > MAX_TENANT_ROWS:
                continue
            hit = "" if g.sla_hit is None else f"{100 * g.sla_hit:.1f}%"
            rows.append((st.run, "all" if g.kind == "all" else f"{g.kind} {g.name}", g.tasks,
                         g.wait_p50_s, g.wait_p95_s, g.wait_max_s, g.mean_slowdown, hit))
    table("waits (seconds), bounded slowdown, SLA hits",
          ["run", "group", "tasks", "wait p50", "wait p95", "wait max", "mean slowdown",
           "SLA hit"], rows)
    table("per run", ["run", "Jain's index (tenant slowdowns)", "tasks lost"],
          [(st.run, st.jain, st.lost) for st in stats])
    if len(tenants) > MAX_TENANT_ROWS:
        console.print(f"{len(tenants)} tenants: their rows are in the HTML report")
    lost_all = [st.run for st in stats if not ran(st)]
    if lost_all:
        console.print(f"[yellow]every task of {', '.join(lost_all)} was lost[/yellow]: no "
                      "worker reads the class its tasks went to (see --workers); nothing "
                      "to compare")
    elif len({st.lost for st in stats}) > 1:
        console.print("[yellow]the runs lost different tasks[/yellow] (no worker for their "
                      "class): their figures, and the ratios below, cover different tasks")
    for t in found:
        verdict = "[green]met[/green]" if t.met else "[red]not met[/red]"
        console.print(f"{t.name}: {t.value:.3f} (target <= {t.limit:g}) {verdict}")


def series_of(result: ReplayResult, count_from: float | None = None) -> list[RunSeries]:
    """The runs for the plots (only the runs that count, after any warm-up)."""
    first = result.runs[0].outcome
    published = result.trace.published
    keep = [i for i in range(len(published)) if count_from is None or published[i] >= count_from]
    tiers = [first.label_of(i) for i in keep]
    return [RunSeries(r.name, [published[i] for i in keep], [r.outcome.started[i] for i in keep],
                      tiers) for r in result.runs]


def report_meta(result: ReplayResult, source: str, config: ReplayConfig) -> list[str]:
    trace = result.trace
    slots = ", ".join(f"{a}={n}" for a, n in result.slots.items())
    load = ", ".join(f"{a} {100 * v:.1f}%" for a, v in offered_load(trace, result.slots).items())
    meta = [f"trace: {source}: {len(trace)} runs over {trace.span_s:.0f}s; "
            f"{trace.skipped_summary()}",
            f"simulated workers (slots per accelerator class): {slots} (offered load {load}); "
            f"consumption '{config.strategy}'; overhead per run {_overhead_text(config)}",
            f"bounded slowdown: runtimes below {config.tau_s:g}s count as {config.tau_s:g}s; "
            "short tasks: the fastest 80% by true runtime, long: the slowest 20%",
            "tiers: every run is grouped by the tier the first policy gives each task"]
    if config.express:
        meta.append(f"express worker: {config.express} process(es) beside each class's worker "
                    "in the policies' runs, sharing its slots as cores (time lost to sharing "
                    "counts as waiting; the reserve stands aside)")
    if config.count_from is not None:
        skipped = sum(1 for p in trace.published if p < config.count_from)
        meta.append(f"warm-up: the first {config.count_from - trace.published[0]:.0f}s "
                    f"({skipped} runs) simulated, not counted")
    for run in result.runs:
        if run.reasons:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(run.reasons.items()))
            sources = ", ".join(f"{k} {v}" for k, v in sorted(run.predictions.items()))
            meta.append(f"{run.name} decisions: {reasons}; predicted by: {sources}")
    trainer = trainer_line(result, config)
    if trainer:
        meta.append(trainer)
    return meta


def trainer_line(result: ReplayResult, config: ReplayConfig) -> str:
    """What the simulated trainer did ("" without one)."""
    if config.trainer is None:
        return ""
    promoted = ", ".join(f"{r.name} {r.models_promoted}" for r in result.runs
                         if r.kind == "policy")
    return (f"trainer: a round every {config.trainer.every_s:g}s once {config.trainer.min_new}"
            f" new runs arrived; models promoted: {promoted}")


def _overhead_text(config: ReplayConfig) -> str:
    per = ", ".join(f"{a} {config.class_overhead_s.get(a, config.overhead_s) * 1000:.2f} ms"
                    for a in config.slots)
    return per + (" (measured from the trace)" if config.class_overhead_s else "")


def execute(trace: Trace, source: str, tests: list[PolicyUnderTest], config: ReplayConfig,
            report: Path) -> ReplayResult:
    """Run the replay, print the tables and write the report."""
    if not report.parent.is_dir():  # said before the simulation, not after it
        fail(f"--report: {report.parent} is not a directory")
    started = time.monotonic()
    result = Replay(trace, config).run(tests)
    print_stats([r.stats for r in result.runs], result.targets)
    meta = report_meta(result, source, config)
    tier_order = result.tier_order
    report.write_text(html_report("celery_aitp replay", meta, [r.stats for r in result.runs],
                                  result.targets, series_of(result, config.count_from),
                                  tier_order))
    lines = [meta[0], trainer_line(result, config),
             f"report: {report} ({time.monotonic() - started:.1f}s)"]
    console.print("\n".join(line for line in lines if line))
    return result


def replay_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options both entry points share."""
    options = [
        click.option("--vs", "versus", multiple=True, type=click.Path(dir_okay=False),
                     help="Another policy file to compare (repeatable)."),
        click.option("--workers", default=None,
                     help="Slots per accelerator class, e.g. cpu=4,gpu=1 (default: as "
                          "recorded: the most runs that overlapped per class)."),
        click.option("--load", "load", default=None, type=float,
                     help="Size the slots from the trace instead: each class's work over "
                          "the trace's span at this load (e.g. 0.85)."),
        click.option("--slowdown-bound-s", "tau_s", default=0.1, show_default=True,
                     type=click.FloatRange(min=0.001),
                     help="Bounded slowdown: runtimes below this count as this (batch "
                          "traces: 10)."),
        click.option("--refresh-s", "refresh_s", default=1.0, show_default=True,
                     type=click.FloatRange(min=0.001),
                     help="Simulated seconds between two refreshes of the pipeline's shared "
                          "state (as the live view's interval; larger is faster on traces "
                          "whose tasks run for minutes or hours)."),
        click.option("--trainer-every", "trainer_every", default=None,
                     help="Retrain the runtime model during the replay as `celery aitp "
                          "trainer --every` would (e.g. 10m): on the replayed runs, once "
                          "100 new ones arrived, promoting only a better model. Default: "
                          "the model stays as it started."),
        click.option("--express", "express", default=0, show_default=True,
                     type=click.IntRange(min=0),
                     help="Processes of an express worker (--aitp-express) beside each "
                          "class's worker, sharing its slots as cores (0: none)."),
        click.option("--consumption", default="policy", show_default=True,
                     help="Workers' queue order: 'policy' (as the policy's tier_order makes "
                          "workers read), or a kombu strategy name or module:Class."),
        click.option("--overhead-ms", default="auto", show_default=True,
                     help="Slot time per run beyond its runtime (ack, next fetch), in ms; "
                          f"'auto': measured from the trace per class (else "
                          f"{DEFAULT_OVERHEAD_S * 1000:g})."),
        click.option("--count-from-s", "count_from_s", default=0.0, show_default=True,
                     help="Simulate but do not count runs published in the first SECONDS of "
                          "the trace (a warm-up while fair-share usage and profiles build)."),
        click.option("--report", "report", default="aitp-replay.html", show_default=True,
                     type=click.Path(dir_okay=False, path_type=Path), help="HTML report path."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@dataclass(frozen=True)
class Sizing:
    """How the simulated fleet and the figures are sized, and how often the trainer runs
    (the options both commands share)."""

    workers: str | None = None
    load: float | None = None
    tau_s: float = 0.1
    refresh_s: float = 1.0
    trainer_every: str | None = None
    express: int = 0


def _slots(trace: Trace, sizing: Sizing, default_accelerator: str) -> dict[str, int]:
    if sizing.workers and sizing.load is not None:
        fail("--workers and --load: give one of them")
    try:
        if sizing.load is not None:
            return slots_for_load(trace, sizing.load, default_accelerator)
        if sizing.workers:
            return parse_slots(sizing.workers)
        return infer_slots(trace, default_accelerator)
    except ValueError as exc:
        fail(str(exc))


def config_for(trace: Trace, sizing: Sizing, consumption: str, overhead_ms: str,
               declarations: Declarations, default_queue: str = "celery",
               default_accelerator: str = "cpu", count_from_s: float = 0.0) -> ReplayConfig:
    from kombu.utils.scheduling import cycle_by_name

    slots = _slots(trace, sizing, default_accelerator)
    try:
        if consumption != "policy":
            cycle_by_name(consumption)
    except (ImportError, AttributeError, ValueError):
        fail(f"--consumption: {consumption!r} is neither 'policy', a kombu queue order "
             "strategy (priority, round_robin, sorted) nor an importable module:Class")
    overhead_s, per_class = _overheads(trace, overhead_ms, default_accelerator)
    if count_from_s < 0 or count_from_s > trace.span_s:
        fail(f"--count-from-s: must be >= 0 and within the trace ({trace.span_s:.0f}s)")
    return ReplayConfig(slots=slots, default_queue=default_queue, overhead_s=overhead_s,
                        class_overhead_s=per_class, strategy=consumption,
                        declarations=declarations, tau_s=sizing.tau_s,
                        refresh_interval_s=sizing.refresh_s, size_targets=True,
                        count_from=trace.published[0] + count_from_s if count_from_s else None,
                        trainer=_trainer(sizing.trainer_every), express=sizing.express)


def _trainer(every: str | None) -> TrainerSettings | None:
    """The simulated trainer for ``--trainer-every`` (None: no trainer)."""
    if every is None:
        return None
    try:
        return TrainerSettings(every_s=parse_duration(every))
    except click.BadParameter as exc:
        fail(f"--trainer-every: {exc.message}")


def _overheads(trace: Trace, text: str, default_accelerator: str
               ) -> tuple[float, dict[str, float]]:
    """(default, per class) slot overhead in seconds from ``--overhead-ms``."""
    if text.strip().lower() == "auto":
        return DEFAULT_OVERHEAD_S, estimate_overhead(trace, default_accelerator)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        fail(f"--overhead-ms: {text!r} is neither 'auto' nor a number of ms >= 0")
    return value / 1000, {}


def _load(path: str) -> Trace:
    try:
        trace = load_jsonl(path)
    except OSError as exc:
        fail(f"{path}: cannot read trace ({exc.strerror or exc})")
    if not len(trace):
        fail(f"{path}: no replayable records ({trace.skipped_summary()})")
    return trace


@click.command("replay")
@click.argument("trace", required=False, type=click.Path(dir_okay=False))
@click.option("--policy", "policy", default=None, type=click.Path(dir_okay=False),
              help="Policy file to try (default: the app's policy and pipeline).")
@replay_options
@click.pass_context
def command(ctx: click.Context, trace: str | None, policy: str | None, versus: tuple[str, ...],
            workers: str | None, load: float | None, tau_s: float, refresh_s: float,
            trainer_every: str | None, express: int, consumption: str, overhead_ms: str,
            count_from_s: float, report: Path) -> None:
    """Replay TRACE (a JSON-lines file; default: the store's observations) under a policy."""
    from celery_aitp.cli.celery_command import middleware_of
    from celery_aitp.replay.app import (
        app_declarations,
        app_model,
        embedded_stores,
        policies_for_app,
    )

    mw = middleware_of(ctx)
    try:
        require("replay", "celery aitp replay")
        if trace:
            loaded, source = _load(trace), trace
        else:
            loaded = from_records(mw.store.read_records(mw.store.keys.observations))
            source = "the store's observations"
        tests = policies_for_app(mw, [p for p in (policy, *versus) if p])
    except AitpError as exc:
        fail(str(exc))
    if not len(loaded):
        fail(f"{source}: no replayable records ({loaded.skipped_summary()})")
    config = config_for(loaded, Sizing(workers, load, tau_s, refresh_s, trainer_every, express),
                        consumption, overhead_ms, app_declarations(mw),
                        str(mw.app.conf.task_default_queue), mw.policy.default_accelerator,
                        count_from_s)
    model = app_model(mw)
    console.print(f"runtime model: {model.version if model else 'none (cold start)'}")
    with embedded_stores(model=model) as stores:
        config.store_factory = stores
        execute(loaded, source, tests, config, report)


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--policy", "policy", default=None, type=click.Path(dir_okay=False),
              help="Policy file to try (default: the product's default policy).")
@click.option("--model", "model_dir", default=None, type=click.Path(file_okay=False),
              help="Runtime model directory (from `celery-aitp train --out`); default: none, "
                   "predictions start cold from the replayed runs' history.")
@click.option("--train-share", "train_share", default=None,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Train a runtime model on this first share of the runs (by publish "
                   "time) and count only the rest; a cold-start run (no model, history "
                   "only) is replayed beside it.")
@click.option("--cold-start", "cold_start", is_flag=True,
              help="Also replay the policy with no model at all (history only) and compare "
                   "it with FIFO.")
@replay_options
def offline_command(trace: str, policy: str | None, model_dir: str | None,
                    train_share: float | None, cold_start: bool, versus: tuple[str, ...],
                    workers: str | None, load: float | None, tau_s: float, refresh_s: float,
                    trainer_every: str | None, express: int, consumption: str,
                    overhead_ms: str, count_from_s: float, report: Path) -> None:
    """Replay TRACE (observation records, JSON lines) under a policy, FIFO and the oracle.

    Without an app the tasks' declarations are unknown: each record's accelerator and
    tier are taken as declared.
    """
    from celery_aitp.replay.app import embedded_stores

    try:
        require("replay", "celery-aitp replay")
    except AitpError as exc:
        fail(str(exc))
    if model_dir and train_share is not None:
        fail("--model and --train-share: give one of them")
    loaded = _load(trace)
    tests = _offline_policies(policy, versus)
    model = _read_model(model_dir) if model_dir else None
    if train_share is not None:
        model, count_from_s = _train_on_first(loaded, train_share, tests[0].policy)
        cold_start = True
    config = config_for(loaded, Sizing(workers, load, tau_s, refresh_s, trainer_every, express),
                        consumption, overhead_ms, recorded_declarations,
                        default_accelerator=tests[0].policy.default_accelerator,
                        count_from_s=count_from_s)
    with embedded_stores(model=model) as stores, \
            embedded_stores("aitp-replay-cold") as cold_stores:
        config.store_factory = stores
        if cold_start:
            first = tests[0]
            tests.append(PolicyUnderTest(_unique("cold", tests), first.policy, first.build,
                                         stores=cold_stores, kind="cold"))
        execute(loaded, trace, tests, config, report)


def _offline_policies(policy: str | None, versus: Sequence[str]) -> list[PolicyUnderTest]:
    from celery_aitp.policy import parse_policy
    from celery_aitp.replay.app import pipeline_factory, policies_from_files

    try:
        tests = policies_from_files([p for p in (policy, *versus) if p])
    except AitpError as exc:
        fail(str(exc))
    if policy is None:
        default = parse_policy({})
        tests.insert(0, PolicyUnderTest(_unique("aitp", tests), default,
                                        pipeline_factory(default)))
    return tests


def _unique(name: str, tests: Sequence[PolicyUnderTest]) -> str:
    taken = {t.name for t in tests}
    while name in taken:
        name += "'"
    return name


def _read_model(model_dir: str) -> Any:
    from celery_aitp.predict.bundle import ModelBundle, load_bundle

    try:
        bundle = ModelBundle.read(model_dir)
        load_bundle(bundle)  # a model asked for by name is refused here, not replaced by
    except AitpError as exc:  # the cold start the producers would fall back to
        fail(f"--model: {exc}")
    return bundle


def _train_on_first(trace: Trace, share: float, policy: Policy) -> tuple[Any, float]:
    """(model trained on the first ``share`` of the runs, as ``policy``'s workers would
    have recorded them, seconds from the trace's start to the first run that counts)."""
    from celery_aitp.learn.train import train
    from celery_aitp.replay.app import as_recorded

    cut = int(len(trace) * share)
    if cut < 1 or cut >= len(trace):
        fail(f"--train-share: {share:g} of {len(trace)} runs leaves nothing to train on "
             "or to count")
    try:
        require("train", "celery-aitp replay --train-share")
        result = train(as_recorded(trace.records[:cut], policy))
    except AitpError as exc:
        fail(str(exc))
    console.print(f"runtime model: trained on the first {cut} runs")
    print_result(result)
    if result.bundle is None:
        fail(f"--train-share: no model ({result.reason})")
    return result.bundle, trace.published[cut] - trace.published[0]
