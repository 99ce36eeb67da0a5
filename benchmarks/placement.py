"""Placement with nothing declared: plain Celery FIFO vs celery_aitp, real workers.

    python benchmarks/placement.py [--broker redis://127.0.0.1:6379/15] [--quick]
        [--amqp amqp://guest:guest@127.0.0.1:5672/VHOST] [--tenants N]

One 4-process worker (threads pool: the tasks sleep), one undeclared task ``job(d)``
whose argument decides its runtime, Poisson arrivals at 85% of the worker's capacity,
two tenants (see ``placement_workloads.py``: bimodal, pareto, skewed tenants, bursts).
Each workload's arrivals are published in real time under four runs:

- ``fifo``: plain Celery, no middleware, one queue;
- ``oracle``: celery_aitp in takeover, its ``predict`` stage replaced by one that reads
  the true runtime (the best its placement can do);
- ``cold``: celery_aitp in takeover in a fresh deployment: no model, only the history
  the runs themselves record;
- ``aitp``: the same deployment after ``celery -A app aitp train`` has promoted a model
  trained on the cold run's observations (the warm-up), with the default policy. The
  cold run is the warm-up, so ``--runs fifo,aitp`` runs it too (unreported); a run whose
  training promoted no model is flagged in the notes;
- ``express``: the same deployment and model, plus an express worker: one process more,
  serving only the top tier (``--aitp-express``). The machine keeps its four cores: every
  task of the run shares them, as an operating system time-slices five processes on four
  cores (``placement_app.work``), so a short task that finds the four regular processes
  busy runs at once and slows them by a fifth meanwhile;
- ``fifo+1``: plain Celery with that process more on the same four shared cores (what the
  extra process alone does, without the tiers).

Metrics (one definition, used for every run):

- slowdown of a task = (wait + runtime) / max(runtime, 0.1 s), where the wait includes
  the time a task lost to sharing its core (``express`` and ``fifo+1``);
- short tasks = the fastest 80% by true runtime, long tasks = the slowest 20%;
- targets per workload, for ``aitp``: mean slowdown <= 0.5x FIFO's and <= 1.2x the
  oracle's; short tasks' p95 wait <= 0.3x FIFO's; long tasks' longest wait <= 2x FIFO's;
  and for ``cold``: mean slowdown <= FIFO's; the same three against FIFO for ``express``.

With ``--amqp`` the tasks go through RabbitMQ (give it a vhost of its own: its tier queues
are deleted before and after each deployment), while the store and the timings stay in
the ``--broker`` Redis database; results are written as ``placement-rabbitmq.*``.

With ``--tenants N`` (default 2: acme and globex, as above) the same arrivals come from N
tenants the policy does not list, all taken by ``unlisted_tenants`` into one class
(``CROWD_POLICY``, the layout of [many tenants](../docs/scale.md)); the worker
(``--aitp-tenant '*'``) serves the class. FIFO differs only in the tenant header. Results
are written as ``placement-N.*``.

Prints the table with ratios and met/missed per target; writes
``benchmarks/results/placement.json`` and ``placement.md``. Uses only its own keys in the
given database and refuses one whose tier queues hold messages.
"""

from __future__ import annotations

import argparse
import contextlib
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
from benchmarks.ideal import ideal_starts  # noqa: E402
from benchmarks.placement_app import (  # noqa: E402
    CORES_HEADER,
    RUNTIME_HEADER,
    make_app,
    policy_with,
    results_key,
)
from benchmarks.placement_workloads import (  # noqa: E402
    CROWD_POLICY,
    LOAD,
    SLOTS,
    TASK,
    WORKLOADS,
    Item,
    offered_load,
)
from celery_aitp.policy import load_policy  # noqa: E402
from celery_aitp.queues import lane_class, policy_queues  # noqa: E402
from celery_aitp.redact import redact  # noqa: E402

APP = "benchmarks.placement_app"
RUNS = ("fifo", "oracle", "cold", "aitp", "express", "fifo+1")
#: Runs with one process more than the machine's cores, whose tasks share the cores.
SHARED_RUNS = frozenset({"express", "fifo+1"})
SLOWDOWN_BOUND_S = 0.1
SHORT_SHARE = 0.8
DRAIN_STALL_S = 60.0
#: A run whose tasks' sleeps overran by more than this on average (ms) was disturbed by
#: the machine (other processes starving the worker), not by the order: it is repeated.
DISTURBED_MS = 15.0


# --- metrics -----------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (NaN for no values)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Figures:
    """One run's figures over the tasks that ran."""

    run: str
    tasks: int
    lost: int
    mean_slowdown: float
    short_p95_wait_s: float
    short_mean_wait_s: float
    long_max_wait_s: float
    long_mean_wait_s: float
    overrun_ms: float  # how much longer the tasks' sleeps took than asked (machine stalls)
    tiers: dict[str, int] = field(default_factory=dict)


def figures(run: str, items: list[Item], published: list[float], started: list[float],
            finished: list[float], tiers: list[str | None],
            shared: list[float] | None = None) -> Figures:
    """Slowdown, short/long waits (short: the fastest 80% by true runtime).

    ``shared``: per task, the seconds it lost to sharing a core (none: 0); they count as
    waiting, not as running, so a task slowed by a neighbour is not credited for it."""
    by_runtime = sorted(items, key=lambda i: i.runtime_s)
    short = {i.index for i in by_runtime[:round(SHORT_SHARE * len(items))]}
    done = [i.index for i in items if not math.isnan(started[i.index])]
    lost = shared or [0.0] * len(items)
    ran = {i: finished[i] - started[i] - lost[i] for i in done}
    wait = {i: started[i] - published[i] + lost[i] for i in done}
    slow = [(wait[i] + ran[i]) / max(ran[i], SLOWDOWN_BOUND_S) for i in done]
    short_w = [wait[i] for i in done if i in short]
    long_w = [wait[i] for i in done if i not in short]
    overrun = _mean([ran[i] - items[i].runtime_s for i in done]) * 1000
    counts: dict[str, int] = {}
    for i in done:
        name = tiers[i] or "-"
        counts[name] = counts.get(name, 0) + 1
    return Figures(run, len(done), len(items) - len(done), _mean(slow), quantile(short_w, 0.95),
                   _mean(short_w), max(long_w, default=math.nan), _mean(long_w), overrun,
                   counts)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class Target:
    name: str
    value: float  # the ratio
    limit: float

    @property
    def met(self) -> bool:
        return self.value <= self.limit


def targets_of(runs: dict[str, Figures]) -> list[Target]:
    """The issue's targets, as ratios (only for the runs that were made)."""
    found = []
    fifo, oracle, aitp, cold = (runs.get(name) for name in ("fifo", "oracle", "aitp", "cold"))
    if fifo and aitp:
        found += [
            Target("aitp mean slowdown / fifo", aitp.mean_slowdown / fifo.mean_slowdown, 0.5),
            Target("aitp short p95 wait / fifo",
                   aitp.short_p95_wait_s / fifo.short_p95_wait_s, 0.3),
            Target("aitp long max wait / fifo",
                   aitp.long_max_wait_s / fifo.long_max_wait_s, 2.0)]
    if oracle and aitp:
        found.append(Target("aitp mean slowdown / oracle",
                            aitp.mean_slowdown / oracle.mean_slowdown, 1.2))
    if fifo and cold:
        found.append(Target("cold mean slowdown / fifo",
                            cold.mean_slowdown / fifo.mean_slowdown, 1.0))
    express = runs.get("express")
    if fifo and express:
        found += [
            Target("express mean slowdown / fifo",
                   express.mean_slowdown / fifo.mean_slowdown, 0.5),
            Target("express short p95 wait / fifo",
                   express.short_p95_wait_s / fifo.short_p95_wait_s, 0.3),
            Target("express long max wait / fifo",
                   express.long_max_wait_s / fifo.long_max_wait_s, 2.0)]
    return found


def simulated(items: list[Item], shortest_first: bool) -> Figures:
    """The same arrivals on an ideal worker (``SLOTS`` processes, no overhead, exact
    runtimes, non-preemptive), served first come first served or shortest job first:
    what any order that cannot interrupt a running task could do on these arrivals."""
    published = [i.at for i in items]
    runtime = [i.runtime_s for i in items]
    started = ideal_starts(published, runtime, runtime if shortest_first else published, SLOTS)
    finished = [s + r for s, r in zip(started, runtime, strict=True)]
    return figures("ideal SJF" if shortest_first else "ideal FIFO", items, published,
                   started, finished, [None] * len(items))


def ideal_targets(items: list[Item]) -> list[Target]:
    """The aitp targets' ratios for ideal SJF against ideal FIFO (see :func:`simulated`)."""
    fifo, sjf = simulated(items, False), simulated(items, True)
    return [Target("ideal SJF mean slowdown / FIFO", sjf.mean_slowdown / fifo.mean_slowdown,
                   0.5),
            Target("ideal SJF short p95 wait / FIFO",
                   sjf.short_p95_wait_s / fifo.short_p95_wait_s, 0.3),
            Target("ideal SJF long max wait / FIFO",
                   sjf.long_max_wait_s / fifo.long_max_wait_s, 2.0)]


# --- one workload's runs ---------------------------------------------------------------


def learned_runs(modes: list[str]) -> list[str]:
    """The runs of the learned deployment for the requested ``modes``: ``aitp``'s model is
    trained on the ``cold`` run's observations, so ``cold`` always runs before it, and
    ``express`` uses the same model after ``aitp`` (each reported only if requested)."""
    if "express" in modes:
        return ["cold", "aitp", "express"]
    if "aitp" in modes:
        return ["cold", "aitp"]
    return ["cold"] if "cold" in modes else []


class Bench:
    """The runs of one workload on one broker."""

    def __init__(self, broker: str, workload: str, items: list[Item],
                 policy: str | None = None, attempts: int = 2, amqp: str | None = None,
                 express: int = 1) -> None:
        self.store = broker  # celery_aitp's store and the timings: always Redis
        self.amqp = amqp
        self.broker = amqp or broker
        self.attempts = attempts
        self.express = express  # processes of the express run's express worker
        self.policy = policy
        self.workload = workload
        self.items = items
        self.client = redis.Redis.from_url(self.store)
        self.tag = f"aitp-place-{os.getpid()}-{workload}"
        parsed = load_policy(policy_with(policy))
        self.tier_queues = policy_queues(parsed)
        self.cpu_queues = {q for q in self.tier_queues if q.split(".")[2] == "cpu"}
        self.notes: list[str] = []
        self.raw: dict[str, list[dict[str, Any]]] = {}  # per run, per task (--raw)

    def names(self, deployment: str) -> tuple[str, str]:
        """(store key prefix, default queue) of one deployment."""
        return f"{self.tag}-{deployment}", f"{self.tag}-{deployment}-q"

    def check_free(self) -> None:
        if self.amqp:
            return  # a vhost of its own; cleanup() deletes the tier queues
        busy = {q: n for q in self.tier_queues if (n := self.client.llen(q))}
        if busy:
            raise SystemExit(f"error: {self.broker} is in use (tier queues hold messages: "
                             f"{busy}); give the benchmark a database of its own")

    def cleanup(self, deployment: str) -> None:
        prefix, queue = self.names(deployment)
        patterns = [f"{prefix}*", f"{queue}*", *(f"{q}*" for q in self.tier_queues)]
        for binding in ("_kombu.binding", "_kombu.binding_permanent"):
            patterns += [f"{binding}.{queue}*", *(f"{binding}.{q}" for q in self.tier_queues)]
        for pattern in patterns:
            keys = list(self.client.scan_iter(pattern, count=1000))
            if keys:
                self.client.delete(*keys)
        if self.amqp:
            self.delete_amqp_queues([queue, *self.tier_queues])

    def delete_amqp_queues(self, queues: list[str]) -> None:
        """Delete the run's queues from the RabbitMQ vhost (absent ones are fine)."""
        from kombu import Connection

        with Connection(self.amqp) as conn:
            for name in queues:
                channel = conn.channel()
                try:
                    channel.queue_delete(name)
                except Exception:  # noqa: BLE001 - absent: the channel is closed
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()

    def env(self, mode: str, deployment: str) -> dict[str, str]:
        prefix, queue = self.names(deployment)
        return {"AITP_BENCH_MODE": mode, "AITP_BENCH_BROKER": self.broker,
                "AITP_BENCH_STORE": self.store,
                "AITP_BENCH_PREFIX": prefix, "AITP_BENCH_QUEUE": queue,
                "AITP_BENCH_POLICY": self.policy or ""}

    def worker(self, mode: str, deployment: str, slots: int = SLOTS,
               extra: tuple[str, ...] = ()) -> BenchWorker:
        flags = ["-Q", self.names(deployment)[1]] if mode == "fifo" else \
            ["--aitp-tenant", "*", "--aitp-accelerator", "cpu"]
        name = f"{deployment.replace('+', 'p')}{'-express' if extra else ''}-{os.getpid()}"
        return BenchWorker(name, slots, [*flags, *extra],
                           self.env(mode, deployment), app=APP)

    def run(self, modes: list[str]) -> dict[str, Figures]:
        found: dict[str, Figures] = {}
        for mode in ("fifo", "oracle", "fifo+1"):
            if mode in modes:
                found.update(self.deployment(mode, [mode]))
        learned = learned_runs(modes)
        if learned:
            out = self.deployment("learned", learned)
            found.update({run: out[run] for run in learned if run in modes})
        return found

    def deployment(self, name: str, runs: list[str]) -> dict[str, Figures]:
        """One deployment (fresh keys, one worker) and its runs, in order."""
        mode = "fifo" if name.startswith("fifo") else "oracle" if name == "oracle" else "aitp"
        self.cleanup(name)
        app = make_app(mode, self.broker, *self.names(name), policy_with(self.policy),
                       store=self.store)
        if mode != "fifo":
            app.aitp.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        out: dict[str, Figures] = {}
        try:
            slots = SLOTS + 1 if name == "fifo+1" else SLOTS
            with running([self.worker(mode, name, slots)]):
                if mode != "fifo":
                    self.wait_live(app)
                for run in runs:
                    if run == "aitp":
                        self.train(name)
                    if run == "express":
                        with running([self.worker(mode, name, self.express,
                                                  ("--aitp-express",))]):
                            time.sleep(5.0)  # advertised, and seen by the other (ttl / 3)
                            out[run] = self.measure_undisturbed(app, run)
                        continue
                    out[run] = self.measure_undisturbed(app, run)
            if mode != "fifo":
                app.aitp.close()
        finally:
            self.cleanup(name)
        return out

    def wait_live(self, app: Any, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            app.aitp.live.refresh()
            if self.cpu_queues <= app.aitp.live.current().live_queues:
                return
            time.sleep(0.2)
        raise RuntimeError("the worker did not advertise its tier queues in time")

    def train(self, deployment: str) -> None:
        env = dict(os.environ, **self.env("aitp", deployment), PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "aitp", "train"],
                              env=env, cwd=str(ROOT), capture_output=True, text=True,
                              timeout=300, check=False)
        time.sleep(3.0)  # producers pick a new model up on their next refresh
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        self.notes.append(f"aitp train exit {done.returncode}: "
                          + " | ".join(line.strip() for line in lines[-4:])[:400])
        if "promoted model" not in done.stdout + done.stderr:
            self.notes.append("WARNING: no model was promoted: the aitp run is measured "
                              "with the history only, as the cold start")

    def measure_undisturbed(self, app: Any, run: str) -> Figures:
        """Measure; again (up to ``attempts`` in all) while the machine disturbed the run."""
        for attempt in range(1, self.attempts + 1):
            found = self.measure(app, run, attempt)
            if found.overrun_ms <= DISTURBED_MS:
                return found
            self.notes.append(f"{run}: attempt {attempt} disturbed (the tasks' sleeps overran "
                              f"by {found.overrun_ms:.0f} ms on average)"
                              + ("; repeated" if attempt < self.attempts else "; kept"))
            print(self.notes[-1], flush=True)
        return found  # the last attempt's, disturbed (noted)

    def measure(self, app: Any, run: str, attempt: int = 1) -> Figures:
        id_prefix = f"{self.tag}-{run}{attempt}-"
        task = app.tasks[TASK]
        published = [math.nan] * len(self.items)
        sent = [math.nan] * len(self.items)  # when apply_async returned (--raw only)
        headers: dict[str, Any] = {CORES_HEADER: SLOTS} if run in SHARED_RUNS else {}
        t0 = time.time() + 0.2
        for item in self.items:
            delay = t0 + item.at - time.time()
            if delay > 0:
                time.sleep(delay)
            published[item.index] = time.time()
            task.apply_async((item.units,), task_id=f"{id_prefix}{item.index:06d}",
                             headers={"aitp_tenant": item.tenant,
                                      RUNTIME_HEADER: item.runtime_s, **headers})
            sent[item.index] = time.time()
        key = results_key(app.conf.task_default_queue)
        self.wait_done(key, id_prefix)
        n = len(self.items)
        started, finished, shared = [math.nan] * n, [math.nan] * n, [0.0] * n
        tiers: list[str | None] = [None] * n
        routes: list[dict[str, Any]] = [{}] * n  # queue and prediction source (--raw)
        for raw in self.client.lrange(key, 0, -1):
            rec = json.loads(raw)
            task_id = str(rec["id"])
            if task_id.startswith(id_prefix):
                i = int(task_id[len(id_prefix):])
                started[i], finished[i], tiers[i] = rec["started"], rec["finished"], rec["tier"]
                shared[i] = rec.get("shared_s") or 0.0
                routes[i] = {"queue": rec.get("queue"), "source": rec.get("source")}
                if _in_lane(rec.get("queue")):
                    tiers[i] = "lane"  # the class's over-share lane (its tier: the lowest)
        self.raw[run] = [{"tenant": i.tenant, "units": i.units, "runtime_s": i.runtime_s,
                          "published": published[i.index], "sent": sent[i.index],
                          "started": started[i.index],
                          "finished": finished[i.index], "shared_s": shared[i.index],
                          "tier": tiers[i.index],
                          **routes[i.index]}
                         for i in self.items]
        return figures(run, self.items, published, started, finished, tiers, shared)

    def wait_done(self, key: str, id_prefix: str) -> None:
        last, last_change = -1, time.monotonic()
        while True:
            done = sum(1 for raw in self.client.lrange(key, 0, -1)
                       if json.loads(raw)["id"].startswith(id_prefix))
            if done >= len(self.items):
                return
            if done != last:
                last, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > DRAIN_STALL_S:
                return
            time.sleep(0.5)


def _in_lane(queue: Any) -> bool:
    """Whether a task went to a class's over-share lane (``aitp.<class>~over.<acc>.<tier>``)."""
    parts = queue.split(".") if isinstance(queue, str) else []
    return len(parts) == 4 and lane_class(parts[1]) is not None


# --- output ----------------------------------------------------------------------------


def table(results: dict[str, dict[str, Figures]]) -> str:
    """The figures of every workload and run, with the ratios to FIFO (Markdown)."""
    lines = ["| workload | run | tasks | mean slowdown | x FIFO | short p95 wait s | x FIFO "
             "| long max wait s | x FIFO | overrun ms | tiers |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for workload, runs in results.items():
        fifo = runs.get("fifo")
        for f in runs.values():
            tiers = ", ".join(f"{k} {v}" for k, v in sorted(f.tiers.items()))
            lost = f" ({f.lost} lost)" if f.lost else ""
            lines.append(
                f"| {workload} | {f.run} | {f.tasks}{lost} | {f.mean_slowdown:.2f} | "
                f"{_ratio(f, fifo, 'mean_slowdown')} | {f.short_p95_wait_s:.3f} | "
                f"{_ratio(f, fifo, 'short_p95_wait_s')} | {f.long_max_wait_s:.2f} | "
                f"{_ratio(f, fifo, 'long_max_wait_s')} | {f.overrun_ms:.1f} | {tiers} |")
    return "\n".join(lines) + "\n"


def _ratio(f: Figures, fifo: Figures | None, name: str) -> str:
    base = getattr(fifo, name) if fifo is not None else 0.0
    return f"{getattr(f, name) / base:.2f}" if base else ""


def targets_table(found: dict[str, list[Target]]) -> str:
    lines = ["| workload | target | ratio | limit | |", "|---|---|---:|---:|---|"]
    for workload, targets in found.items():
        lines += [f"| {workload} | {t.name} | {t.value:.2f} | {t.limit:g} | "
                  f"{'met' if t.met else 'MISSED'} |" for t in targets]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("AITP_BENCH_REDIS_URL",
                                                           "redis://127.0.0.1:6379/14"),
                        help="Redis database the benchmark may use (broker and store)")
    parser.add_argument("--amqp", default=None,
                        help="RabbitMQ URL (a vhost of its own) to use as the broker; the "
                             "store and timings stay in --broker")
    parser.add_argument("--quick", action="store_true", help="short runs (for iteration)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of arrivals per run (default 60; 20 with --quick)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default=None,
                        help="JSON object replacing top-level fields of the workload's policy "
                             "(e.g. to compare a setting); default: celery_aitp's defaults")
    parser.add_argument("--tenants", type=int, default=2,
                        help="spread the tasks over this many unlisted tenants of one class "
                             "(default 2: acme and globex, listed)")
    parser.add_argument("--attempts", type=int, default=2,
                        help="measure a run the machine disturbed again, up to this many times")
    parser.add_argument("--express", type=int, default=1,
                        help="processes of the express run's express worker (default 1)")
    parser.add_argument("--raw", type=Path, default=None,
                        help="also write every task's timings here (JSON lines)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if not args.broker.startswith("redis"):
        raise SystemExit("error: --broker must be a redis:// URL (the tasks' timings and the "
                         "store live in Redis)")
    duration = args.duration or (20.0 if args.quick else 60.0)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in args.runs.split(",") if m.strip()]
    policy = args.policy
    if args.tenants != 2:
        policy = json.dumps({**CROWD_POLICY, **json.loads(args.policy or "{}")})
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, Figures]] = {}
    found: dict[str, list[Target]] = {}
    notes: dict[str, list[str]] = {}
    ideal: dict[str, list[Target]] = {}
    meta: dict[str, Any] = {}
    for name in workloads:
        items = WORKLOADS[name].schedule(duration, args.seed + list(WORKLOADS).index(name),
                                         tenants=args.tenants)
        bench = Bench(args.broker, name, items, policy, max(1, args.attempts), args.amqp,
                      args.express)
        bench.check_free()
        # the window the arrivals were scaled to (the last arrival may come before its end)
        span = sum(i.runtime_s for i in items) / (SLOTS * LOAD) if items else duration
        print(f"{name}: {len(items)} tasks over {span:.0f}s, offered load "
              f"{offered_load(items, span):.0%} of {SLOTS} processes", flush=True)
        results[name] = bench.run(modes)
        found[name] = targets_of(results[name])
        ideal[name] = ideal_targets(items)
        notes[name] = bench.notes
        if args.raw is not None:
            with args.raw.open("a") as raw:
                for run, rows in bench.raw.items():
                    raw.writelines(json.dumps({"workload": name, "run": run, **row}) + "\n"
                                   for row in rows)
        meta[name] = {"tasks": len(items), "span_s": span,
                      "offered_load": offered_load(items, span)}
        print(table({name: results[name]}) + targets_table({name: found[name]})
              + targets_table({name: ideal[name]}), flush=True)
    elapsed = time.monotonic() - began
    md = (table(results) + "\n" + targets_table(found)
          + "\nThe same ratios for an ideal non-preemptive worker (simulated: exact runtimes, "
          "no overhead, shortest job first against first come first served, same arrivals):"
          "\n\n" + targets_table(ideal))
    print(md)
    for name, lines in notes.items():
        for line in lines:
            print(f"{name}: {line}")
    print(f"done in {elapsed:.0f}s")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("placement" + ("-rabbitmq" if args.amqp else "")
            + (f"-{args.tenants}" if args.tenants != 2 else "") + ("-quick" if args.quick else ""))
    (args.out / f"{stem}.md").write_text(md)
    doc = {
        "command": "python benchmarks/placement.py " + " ".join(
            # no path of the machine it ran on, no password of a broker URL
            Path(a).name if os.path.isabs(a) else redact(a)
            for a in (sys.argv[1:] if argv is None else argv)),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m_before_after": (load_before, os.getloadavg()[0])},
        "config": {"broker": "rabbitmq" if args.amqp else "redis", "duration_s": duration,
                   "load": LOAD, "processes": SLOTS, "tenants": args.tenants,
                   "seed": args.seed, "slowdown_bound_s": SLOWDOWN_BOUND_S,
                   "short_share": SHORT_SHARE},
        "workloads": {name: {**meta[name], "notes": notes[name],
                             "runs": {r: f.__dict__ for r, f in results[name].items()},
                             "targets": [{**t.__dict__, "met": t.met} for t in found[name]],
                             "ideal": [{**t.__dict__, "met": t.met} for t in ideal[name]]}
                      for name in results},
        "elapsed_s": elapsed,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(t.met for ts in found.values() for t in ts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
