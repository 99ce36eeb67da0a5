"""Scheduling quality on real Celery: plain FIFO vs celery_aitp takeover vs an oracle.

    python benchmarks/scheduling.py --redis redis://127.0.0.1:6379/15

Real Redis, real worker processes (a CPU class with 6 slots, a simulated accelerator
class with 2), three tenants with different tiers and weights, sleep-based tasks whose
runtime depends on their argument, Poisson arrivals at about 90% of capacity with a
bursty tenant (see ``workload.py``). The same arrivals are published, in real time, in
three runs:

- fifo: plain Celery (no middleware), one queue per class;
- oracle: celery_aitp in takeover, its ``predict`` stage replaced by one that reads the
  true runtime from the ``bench_runtime_s`` header;
- aitp: celery_aitp in takeover as shipped (a warm-up first, then ``aitp train`` when the
  app has that command, so predictions come from observed runs).

Prints waits per tier and tenant, slowdown, SLA hits, Jain's index, lost tasks and the
targets; writes the takeover run's observation records (the trace the replay simulator
takes), the figures as JSON and two SVG plots under ``--out``. Uses only its own keys in
the given Redis database and refuses a database whose tier queues hold messages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_workers import ROOT, BenchWorker, running  # noqa: E402
from benchmarks.sched_app import RUNTIME_HEADER, gpu_queue, make_app, results_key, use_oracle  # noqa: E402
from benchmarks.workload import KINDS, POLICY, SLOTS, Item, offered_load, schedule  # noqa: E402
from celery_aitp.cli.output import console  # noqa: E402
from celery_aitp.cli.replay import print_stats  # noqa: E402
from celery_aitp.policy import load_policy  # noqa: E402
from celery_aitp.queues import all_tier_queues  # noqa: E402
from celery_aitp.replay.metrics import RunStats, Target, run_stats, targets  # noqa: E402
from celery_aitp.replay.report import RunSeries, depth_svg, wait_cdf_svg  # noqa: E402
from celery_aitp.replay.trace import write_jsonl  # noqa: E402

RUN_ORDER = ("fifo", "oracle", "aitp")
DRAIN_STALL_S = 60.0


@dataclass
class Measured:
    """One real run: per workload item, when it was published, started and finished."""

    mode: str
    published: list[float]
    started: list[float]
    finished: list[float]
    tiers: list[str | None]
    observations: list[dict[str, Any]] = field(default_factory=list)
    model: Any = None  # the runtime model the run predicted with (a ModelBundle), if any
    reasons: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(1 for s in self.started if math.isnan(s))


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.broker = args.redis
        self.client = redis.Redis.from_url(args.redis)
        self.items = schedule(args.duration, args.load, args.seed)
        self.warm_items = schedule(args.warmup, args.load, args.seed + 1000) \
            if args.warmup > 0 else []
        self.tag = f"aitp-bench-{os.getpid()}"
        self.policy = load_policy(POLICY)
        self.tier_queues = all_tier_queues(self.policy.tenants, self.policy.accelerators,
                                           self.policy.tier_names)

    # --- keys --------------------------------------------------------------------

    def names(self, mode: str) -> tuple[str, str]:
        """(store key prefix, default queue) of one run."""
        return f"{self.tag}-{mode}", f"{self.tag}-{mode}-q"

    def check_free(self) -> None:
        busy = {q: self.client.llen(q) for q in self.tier_queues}
        busy = {q: n for q, n in busy.items() if n}
        if busy:
            raise SystemExit(f"error: {self.broker} is in use (tier queues hold messages: "
                             f"{busy}); give the benchmark a database of its own with --redis")

    def cleanup(self, mode: str) -> None:
        prefix, queue = self.names(mode)
        patterns = [f"{prefix}*", f"{queue}*"]
        patterns += [f"{q}*" for q in self.tier_queues]
        for binding in ("_kombu.binding", "_kombu.binding_permanent"):
            patterns += [f"{binding}.{queue}*"] + [f"{binding}.{q}" for q in self.tier_queues]
        for pattern in patterns:
            keys = list(self.client.scan_iter(pattern, count=1000))
            if keys:
                self.client.delete(*keys)

    # --- one run -------------------------------------------------------------------

    def workers(self, mode: str) -> list[BenchWorker]:
        prefix, queue = self.names(mode)
        env = {"AITP_BENCH_MODE": mode, "AITP_BENCH_BROKER": self.broker,
               "AITP_BENCH_PREFIX": prefix, "AITP_BENCH_QUEUE": queue}
        if mode == "fifo":
            cpu_flags, gpu_flags = ["-Q", queue], ["-Q", gpu_queue(queue)]
        else:
            cpu_flags = ["--aitp-tenant", "*", "--aitp-accelerator", "cpu"]
            gpu_flags = ["--aitp-tenant", "*", "--aitp-accelerator", "gpu",
                         "--aitp-no-default-queue"]
        return [BenchWorker(f"cpu-{mode}-{os.getpid()}", SLOTS["cpu"], cpu_flags, env),
                BenchWorker(f"gpu-{mode}-{os.getpid()}", SLOTS["gpu"], gpu_flags, env)]

    def run(self, mode: str) -> Measured:
        self.cleanup(mode)
        prefix, queue = self.names(mode)
        app = make_app(mode, self.broker, prefix, queue)
        if mode == "oracle":
            use_oracle(app)
        if mode != "fifo":
            app.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        try:
            with running(self.workers(mode)):
                if mode != "fifo":
                    self.wait_live(app)
                    notes = self.warm_up(app, mode)
                else:
                    notes = []
                model = self.current_model(app) if mode == "aitp" else None
                measured = self.measure(app, mode)
                measured.notes += notes
                measured.model = model
            if mode != "fifo":
                self.collect_observations(app, measured)
                app.aitp.close()
        finally:
            self.cleanup(mode)
        return measured

    @staticmethod
    def current_model(app: Any) -> Any:
        from celery_aitp.predict.model_store import ModelStore

        return ModelStore(app.aitp.store).read()

    def wait_live(self, app: Any, timeout_s: float = 30.0) -> None:
        """Until the producer's view lists every tier queue as served."""
        expected = set(self.tier_queues)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            app.aitp.live.refresh()
            if expected <= app.aitp.live.current().live_queues:
                return
            time.sleep(0.2)
        raise RuntimeError("workers did not advertise their tier queues in time")

    def warm_up(self, app: Any, mode: str) -> list[str]:
        notes = []
        if self.warm_items:
            self.publish(app, self.warm_items, f"{self.names(mode)[0]}-w")
            self.wait_done(app, len(self.warm_items))
            self.client.delete(results_key(self.names(mode)[1]))
            notes.append(f"warm-up: {len(self.warm_items)} tasks")
        if mode == "aitp":
            notes.append(self.train(mode))
        return notes

    def train(self, mode: str) -> str:
        from celery_aitp.cli.celery_command import aitp

        if "train" not in aitp.commands:
            return "no 'aitp train' command: predictions are the cold-start estimate"
        prefix, queue = self.names(mode)
        env = dict(os.environ, AITP_BENCH_MODE=mode, AITP_BENCH_BROKER=self.broker,
                   AITP_BENCH_PREFIX=prefix, AITP_BENCH_QUEUE=queue, PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-m", "celery", "-A", "benchmarks.sched_app",
                               "aitp", "train"], env=env, cwd=str(ROOT), capture_output=True,
                              text=True, timeout=300, check=False)
        time.sleep(2.5)  # producers pick a new model up on their next refresh
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        return f"aitp train exit {done.returncode}: {tail[0][:200]}"

    def publish(self, app: Any, items: list[Item], id_prefix: str) -> list[float]:
        published = [math.nan] * len(items)
        tasks = {name: app.tasks[name] for name in KINDS}
        t0 = time.time() + 0.2
        for item in items:
            delay = t0 + item.at - time.time()
            if delay > 0:
                time.sleep(delay)
            published[item.index] = time.time()
            tasks[item.task].apply_async(
                (item.size,), task_id=f"{id_prefix}{item.index:06d}",
                headers={"aitp_tenant": item.tenant, RUNTIME_HEADER: item.runtime_s})
        return published

    def wait_done(self, app: Any, n: int) -> int:
        key = results_key(app.conf.task_default_queue)
        last, last_change = -1, time.monotonic()
        while True:
            done = int(self.client.llen(key))
            if done >= n:
                return done
            if done != last:
                last, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > DRAIN_STALL_S:
                return done
            time.sleep(0.2)

    def measure(self, app: Any, mode: str) -> Measured:
        id_prefix = f"{self.names(mode)[0]}-m"
        console.print(f"[bold]{mode}[/bold]: publishing {len(self.items)} tasks "
                      f"over {self.items[-1].at:.0f}s")
        published = self.publish(app, self.items, id_prefix)
        self.wait_done(app, len(self.items))
        n = len(self.items)
        started, finished = [math.nan] * n, [math.nan] * n
        tiers: list[str | None] = [None] * n
        for raw in self.client.lrange(results_key(app.conf.task_default_queue), 0, -1):
            rec = json.loads(raw)
            task_id = str(rec["id"])
            if not task_id.startswith(id_prefix):
                continue
            i = int(task_id[len(id_prefix):])
            started[i], finished[i], tiers[i] = rec["started"], rec["finished"], rec["tier"]
        return Measured(mode, published, started, finished, tiers)

    def collect_observations(self, app: Any, measured: Measured, timeout_s: float = 15.0) -> None:
        """The workers' observation records of the measured tasks (shipped in the background)."""
        store = app.aitp.store
        id_prefix = f"{self.names(measured.mode)[0]}-m"
        want = len(self.items) - measured.lost
        deadline = time.monotonic() + timeout_s
        records: list[dict[str, Any]] = []
        every: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            every = store.read_records(store.keys.observations)
            records = [r for r in every if str(r.get("task_id", "")).startswith(id_prefix)]
            if len(records) >= want:
                break
            time.sleep(0.5)
        # the trace keeps the warm-up runs too: their usage and profiles shaped the decisions
        every.sort(key=lambda r: (r.get("published_at") or 0.0))
        measured.observations = every
        for r in records:
            reason = str(r.get("reason"))
            measured.reasons[reason] = measured.reasons.get(reason, 0) + 1
        if len(records) < want:
            measured.notes.append(f"only {len(records)} of {want} observation records arrived")


# --- figures ----------------------------------------------------------------------


def tier_labels(bench: Bench, runs: dict[str, Measured]) -> list[str]:
    """Each item's tier as the takeover run decided it (else the oracle's, else declared)."""
    labels = []
    names = bench.policy.tier_names
    for item in bench.items:
        found = next((runs[m].tiers[item.index] for m in ("aitp", "oracle")
                      if m in runs and runs[m].tiers[item.index]), None)
        if found is None:
            cap = bench.policy.tenants[item.tenant].max_tier or names[0]
            found = names[max(names.index(KINDS[item.task].tier), names.index(cap))]
        labels.append(found)
    return labels


def stats_of(bench: Bench, m: Measured, labels: list[str]) -> RunStats:
    done = [i for i, s in enumerate(m.started) if not math.isnan(s)]
    sla = {t.name: t.sla_s for t in bench.policy.tiers}
    return run_stats(m.mode, [m.started[i] - m.published[i] for i in done],
                     [m.finished[i] - m.started[i] for i in done], [labels[i] for i in done],
                     [bench.items[i].tenant for i in done], sla, bench.policy.tier_names,
                     lost=m.lost)


def markdown(all_stats: list[RunStats], found: list[Target]) -> str:
    """The figures as Markdown tables (pasted into docs/performance.md)."""
    lines = ["| group | run | tasks | wait p50 s | wait p95 s | wait max s | mean slowdown "
             "| SLA hit |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    keys = [(g.kind, g.name) for g in all_stats[0].groups]
    for kind, name in keys:
        for st in all_stats:
            g = st.group(kind, name)
            if g is None:
                continue
            hit = "" if g.sla_hit is None else f"{100 * g.sla_hit:.1f}%"
            label = "all" if kind == "all" else f"{kind} {name}"
            lines.append(f"| {label} | {st.run} | {g.tasks} | {g.wait_p50_s:.3f} | "
                         f"{g.wait_p95_s:.3f} | {g.wait_max_s:.2f} | {g.mean_slowdown:.2f} | "
                         f"{hit} |")
    lines += ["", "| run | Jain's index (tenant slowdowns) | tasks lost |", "|---|---:|---:|"]
    lines += [f"| {st.run} | {'' if st.jain is None else format(st.jain, '.3f')} | {st.lost} |"
              for st in all_stats]
    lines += ["", "| target | measured | limit | |", "|---|---:|---:|---|"]
    lines += [f"| {t.name} | {t.value:.3f} | {t.limit:g} | {'met' if t.met else 'NOT met'} |"
              for t in found]
    return "\n".join(lines) + "\n"


def trace_name(mode: str) -> str:
    """The takeover run's trace is *the* trace; the others let each run be replayed."""
    return "scheduling-trace.jsonl.gz" if mode == "aitp" else f"scheduling-trace-{mode}.jsonl.gz"


def fifo_records(bench: Bench, m: Measured, labels: list[str]) -> list[dict[str, Any]]:
    """Plain Celery records no observations: the same schema, from the tasks' own timings."""
    records = []
    for item in bench.items:
        i = item.index
        if math.isnan(m.started[i]):
            continue
        records.append({
            "task": item.task, "task_id": f"fifo-{i:06d}", "tenant": item.tenant,
            "tier": labels[i], "accelerator": KINDS[item.task].accelerator,
            "args": [item.size], "kwargs": {}, "published_at": m.published[i],
            "started_at": m.started[i], "wait_s": m.started[i] - m.published[i],
            "runtime_s": m.finished[i] - m.started[i], "outcome": "SUCCESS", "retries": 0,
        })
    return records


def series(m: Measured, labels: list[str]) -> RunSeries:
    return RunSeries(m.mode, m.published, m.started, labels)


def write_outputs(out: Path, bench: Bench, runs: dict[str, Measured], all_stats: list[RunStats],
                  found: list[Target], labels: list[str], args: argparse.Namespace,
                  elapsed: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for mode, m in runs.items():
        path = out / trace_name(mode)
        records = m.observations if mode != "fifo" else fifo_records(bench, m, labels)
        n = write_jsonl(records, path)
        console.print(f"trace: {n} observation records of the {mode} run -> {path}")
    doc = {
        "command": "python benchmarks/scheduling.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(terse=True),
                    "load_average_1m_before_after": args.load_average},
        "config": {"duration_s": args.duration, "load": args.load, "seed": args.seed,
                   "warmup_s": args.warmup, "slots": SLOTS, "tasks": len(bench.items),
                   "offered_load": offered_load(bench.items, args.duration)},
        "runs": {st.run: {"jain": st.jain, "lost": st.lost,
                          "measured_from": min(runs[st.run].published),
                          "groups": [g.__dict__ for g in st.groups],
                          "reasons": runs[st.run].reasons, "notes": runs[st.run].notes}
                 for st in all_stats},
        "targets": [{"name": t.name, "value": t.value, "limit": t.limit, "met": t.met}
                    for t in found],
        "elapsed_s": elapsed,
    }
    model_dir = out / "scheduling-model"
    if "aitp" in runs and runs["aitp"].model is not None:
        runs["aitp"].model.save(model_dir)
        console.print(f"model {runs['aitp'].model.version} -> {model_dir}")
    (out / "scheduling.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "scheduling.md").write_text(markdown(all_stats, found))
    ordered = [series(runs[m], labels) for m in RUN_ORDER if m in runs]
    tiers = bench.policy.tier_names
    (out / "scheduling-waits.svg").write_text(wait_cdf_svg(ordered, tiers))
    (out / "scheduling-depth.svg").write_text(depth_svg(ordered, tiers))
    console.print(f"figures: {out / 'scheduling.json'}, plots: scheduling-waits.svg, "
                  "scheduling-depth.svg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("AITP_BENCH_REDIS_URL",
                                                          "redis://127.0.0.1:6379/15"),
                        help="Redis database the benchmark may use (broker and store)")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals")
    parser.add_argument("--load", type=float, default=0.9, help="offered utilisation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds of warm-up traffic before the celery_aitp runs")
    parser.add_argument("--runs", default=",".join(RUN_ORDER), help="which runs, in order")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.runs.split(",") if m.strip()]
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        console.print(f"[yellow]warning[/yellow]: load average {load_before:.2f} before the run: "
                      "other processes compete for the 2 cores; waits will be noisier")
    bench = Bench(args)
    bench.check_free()
    offered = offered_load(bench.items, args.duration)
    console.print(f"{len(bench.items)} tasks over {args.duration:g}s; offered load "
                  + ", ".join(f"{a} {v:.0%}" for a, v in sorted(offered.items()))
                  + f"; slots {SLOTS}; broker {args.redis}")
    runs = {mode: bench.run(mode) for mode in modes}
    labels = tier_labels(bench, runs)
    all_stats = [stats_of(bench, runs[m], labels) for m in modes]
    by_mode = {st.run: st for st in all_stats}
    found = targets(by_mode["fifo"], by_mode["aitp"], by_mode["oracle"],
                    bench.policy.tier_names) if set(RUN_ORDER) <= set(by_mode) else []
    print_stats(all_stats, found)
    for m in runs.values():
        for note in m.notes:
            console.print(f"{m.mode}: {note}")
        if m.reasons:
            console.print(f"{m.mode}: decisions {m.reasons}")
    elapsed = time.monotonic() - started
    args.load_average = (load_before, os.getloadavg()[0])
    write_outputs(args.out, bench, runs, all_stats, found, labels, args, elapsed)
    console.print(f"done in {elapsed:.0f}s")
    return 1 if any(st.lost for st in all_stats) else 0


if __name__ == "__main__":
    raise SystemExit(main())
