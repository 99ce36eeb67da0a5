"""How the cost of celery_aitp follows the number of tenants: 1, 100, 1,000 (10,000).

For each tenant count, in one run, against a real Redis and a real worker process:

- **publish**: ``apply_async`` of tiny tasks spread round-robin over the tenants, taking
  turns every 100 tasks with a plain Celery app publishing the same task (microseconds
  per task, and the ratio of medians over the blocks);
- **drain**: the queued tasks, then one worker ``--aitp-tenant '*' -c 2`` (prefork) is
  started; throughput = tasks / (last finish - first finish), from the tasks' own times;
- **idle**: main-process CPU over ``--idle-s`` seconds of the same worker started before
  any task was published (and, in brackets, of the draining worker once drained);
- **dashboard**: ``/api/queues`` and ``/metrics`` of an in-process dashboard
  (``refresh_s`` 1): the median of 5 warm requests, the first request (the server builds
  the first snapshot as it starts), and the slowest of 3 requests each made past
  ``refresh_s`` (answered from the last snapshot while the next is built); and one
  snapshot build timed on its own;
- **store**: bytes of the deployment's keys (``MEMORY USAGE``) per tenant;
- **Redis CPU** per task over publish and drain (``INFO cpu``; the whole server's, so
  other clients of a shared Redis count too): how many tasks a second one Redis core
  carries;
- **broker queues**: the queues the worker reads (tier queues as the broker holds them,
  and the default); on RabbitMQ (``--broker amqp://...``, the store stays on
  ``--redis``) also the consumers the broker counts on them (``rabbitmqctl``).

    python benchmarks/tenant_scale.py --redis redis://127.0.0.1:6379/14 \
        --tenants 1,100,1000,10000:class --layouts dedicated,class --tasks 2000
    python benchmarks/tenant_scale.py --redis redis://127.0.0.1:6379/14 \
        --broker amqp://guest:guest@127.0.0.1:5672/VHOST --tenants 1:dedicated,10000:class

Layouts (``benchmarks/tenant_app.py``): ``dedicated``, every tenant listed with tier queues
of its own (the only layout before tenant classes); ``class``, every tenant listed in one
tenant class sharing its queues; ``unlisted``, no tenant listed, the ``unlisted_tenants``
class takes them. ``N:layout`` runs one layout only at that count.

Every key a run creates (tenants, class, prefix, queues) carries its random tag and is
deleted at the end. Targets (issue
"scale"): drain at least 0.8x the one-tenant figure at 1,000 tenants and 0.6x at 10,000;
idle at most 1% of a core; publish at most 1.05x plain Celery; dashboard under 300 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402
import psutil  # noqa: E402
import redis  # noqa: E402

from benchmarks.bench_workers import ROOT, BenchWorker  # noqa: E402
from benchmarks.tenant_app import LAYOUTS, TASK, done_key, make_app, tenant_names  # noqa: E402

BLOCK = 100


@dataclass
class Figures:
    tenants: int
    layout: str
    publish_us: float = float("nan")
    plain_us: float = float("nan")
    fallbacks: int = 0
    startup_s: float = float("nan")
    drain_s: float = float("nan")
    drained: int = 0
    idle_cpu: float = float("nan")
    idle_after_cpu: float = float("nan")
    #: (median of warm requests, the first request, the slowest request past refresh_s)
    queues_ms: tuple[float, float, float] = (float("nan"),) * 3
    metrics_ms: tuple[float, float, float] = (float("nan"),) * 3
    build_ms: float = float("nan")  # one snapshot build, timed in the request's place
    store_bytes: int = 0
    #: Redis CPU (user + sys, ``INFO cpu``) per task over publish and drain, in us: the
    #: whole server's, so other clients of a shared Redis count too (an upper bound)
    redis_us: float = float("nan")
    queues: int = 0  # broker queues one worker serving every tenant reads
    broker_consumers: int = -1  # consumers the broker counts on them (RabbitMQ only)
    notes: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.drained / self.drain_s if self.drain_s > 0 else float("nan")


class ScaleWorker(BenchWorker):
    """``celery worker`` of ``benchmarks.tenant_app``, prefork, serving every tenant."""

    def __init__(self, name: str, env: dict[str, str], concurrency: int) -> None:
        super().__init__(name, concurrency, [], env)
        self.cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.tenant_app", "worker",
                    "-n", f"{name}@%h", "-c", str(concurrency), "--loglevel", "WARNING",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "--aitp-tenant", "*"]


def cpu_share(pid: int, seconds: float) -> float:
    """Share of one core the process used over ``seconds`` (its own threads only)."""
    proc = psutil.Process(pid)
    before = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(proc.cpu_times()[:2]) - before) / seconds


def get_ms(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        response.read()
    return (time.perf_counter() - start) * 1000


class Run:
    def __init__(self, args: argparse.Namespace, n: int, layout: str, index: int) -> None:
        self.args = args
        self.n = n
        self.layout = layout
        self.tag = common.tag()
        self.prefix = f"scale-{self.tag}"
        self.queue = f"scale-{self.tag}-q"
        self.client = redis.Redis.from_url(args.redis)
        self.broker = args.broker or args.redis
        self.amqp = self.broker.startswith(("amqp", "pyamqp"))
        self.app = make_app(n, self.tag, self.broker, self.prefix, self.queue, layout=layout,
                            store=args.redis)
        self.plain = make_app(n, self.tag, self.broker, self.prefix, f"{self.queue}-plain",
                              plain=True, store=args.redis)
        self.port = args.port + index
        self.figures = Figures(n, layout)

    def queue_names(self) -> list[str]:
        from celery_aitp.worker.bootstep import WorkerPlan

        return WorkerPlan(self.app.aitp.policy, "*", None, None, False).queue_names()

    def broker_queues(self) -> list[str]:
        """The broker queues a worker ``--aitp-tenant '*'`` reads (tier queues as the
        broker holds them: one per owner and accelerator on RabbitMQ), and the default."""
        layout = self.app.aitp.layout
        return sorted({layout.physical(q) for q in self.queue_names()}) + [self.queue]

    def purge(self, name: str) -> None:
        if not self.amqp:
            self.client.delete(name)
            return
        with self.app.connection_for_write() as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_purge(name)

    def depth(self, name: str) -> int:
        if not self.amqp:
            return int(self.client.llen(name))
        with self.app.connection_for_write() as conn:
            try:
                return int(conn.default_channel.queue_declare(name, passive=True).message_count)
            except Exception:
                return 0

    def rabbit_counts(self) -> None:
        """Queues and consumers the broker reports for the vhost (``rabbitmqctl``), with
        the idle worker running: what the worker costs the broker."""
        vhost = urllib.parse.unquote(urllib.parse.urlparse(self.broker).path[1:]) or "/"
        try:
            out = subprocess.run(["rabbitmqctl", "-q", "-p", vhost, "list_queues", "name",
                                  "consumers"], capture_output=True, text=True, timeout=60,
                                 check=True).stdout
        except (OSError, subprocess.SubprocessError):
            self.figures.notes.append("rabbitmqctl unavailable: broker counts not read")
            return
        mine = set(self.broker_queues())
        rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
        self.figures.broker_consumers = sum(int(c) for name, c in rows if name in mine
                                            and c.isdigit())

    def publish(self) -> None:
        """Interleaved blocks of plain Celery and celery_aitp publishes (routed: a fake
        advertisement makes every tier queue live without consuming anything)."""
        mw = self.app.aitp
        mw.store.write_stage({"stage": "takeover", "split": {}}, who="benchmark")
        mw.store.advertise(f"fake-{self.tag}@bench", self.queue_names(), {}, ttl_s=3600)
        mw.live.refresh()
        tenants = tenant_names(self.n, self.tag)
        aitp_task, plain_task = self.app.tasks[TASK], self.plain.tasks[TASK]
        for i in range(50):  # warm both paths (connections, caches)
            aitp_task.apply_async(headers={"aitp_tenant": tenants[i % self.n]})
            plain_task.apply_async()
        self.purge(self.queue + "-plain")
        aitp_blocks, plain_blocks = [], []
        sent = 50
        while sent < self.args.tasks:
            start = time.perf_counter()
            for i in range(sent, sent + BLOCK):
                aitp_task.apply_async(headers={"aitp_tenant": tenants[i % self.n]})
            aitp_blocks.append((time.perf_counter() - start) / BLOCK * 1e6)
            start = time.perf_counter()
            for _ in range(BLOCK):
                plain_task.apply_async()
            plain_blocks.append((time.perf_counter() - start) / BLOCK * 1e6)
            sent += BLOCK
        self.sent = sent
        self.purge(self.queue + "-plain")
        mw.store.withdraw(f"fake-{self.tag}@bench")
        f = self.figures
        f.publish_us, f.plain_us = statistics.median(aitp_blocks), statistics.median(plain_blocks)
        f.fallbacks = self.depth(self.queue)

    def worker(self) -> ScaleWorker:
        env = {"AITP_SCALE_TENANTS": str(self.n), "AITP_SCALE_RUN": self.tag,
               "AITP_SCALE_BROKER": self.broker, "AITP_SCALE_STORE": self.args.redis,
               "AITP_SCALE_PREFIX": self.prefix,
               "AITP_SCALE_QUEUE": self.queue, "AITP_SCALE_LAYOUT": self.layout}
        return ScaleWorker(f"scale-{self.tag}", env, self.args.concurrency)

    def idle_before(self) -> None:
        """A worker that never saw a task: main-process CPU once it advertises."""
        worker = self.worker()
        worker.start()
        try:
            deadline = time.monotonic() + self.args.timeout_s
            while not self.app.aitp.store.workers() and time.monotonic() < deadline:
                if worker.proc is not None and worker.proc.poll() is not None:
                    raise RuntimeError(f"worker exited:\n{worker.output()[-3000:]}")
                time.sleep(0.1)
            time.sleep(self.args.settle_s)  # past start-up and the janitor's first pass
            assert worker.proc is not None
            self.figures.idle_cpu = cpu_share(worker.proc.pid, self.args.idle_s)
            self.figures.queues = len(self.broker_queues())
            if self.amqp:
                self.rabbit_counts()
        finally:
            worker.stop()
            self.app.aitp.store.withdraw(f"scale-{self.tag}@{socket.gethostname()}")

    def drain(self) -> ScaleWorker:
        worker = self.worker()
        started = time.monotonic()
        worker.start()
        key = done_key(self.queue)
        deadline = started + self.args.timeout_s
        while time.monotonic() < deadline and self.client.llen(key) == 0:
            if worker.proc is not None and worker.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{worker.output()[-3000:]}")
            time.sleep(0.05)
        self.figures.startup_s = time.monotonic() - started
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            done = int(self.client.llen(key))
            if done >= self.sent:
                break
            if done != last:
                last, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > 60:
                self.figures.notes.append(f"drain stalled at {done}/{self.sent}")
                break
            time.sleep(0.1)
        times = sorted(float(t) for t in self.client.lrange(key, 0, -1))
        self.figures.drained = len(times) - 1
        self.figures.drain_s = times[-1] - times[0] if len(times) > 1 else float("nan")
        return worker

    def idle_after(self, worker: ScaleWorker) -> None:
        time.sleep(5.0)
        assert worker.proc is not None
        self.figures.idle_after_cpu = cpu_share(worker.proc.pid, self.args.idle_s)

    def dashboard(self) -> None:
        from celery_aitp.dashboard.config import DashboardConfig
        from celery_aitp.dashboard.server import BackgroundServer

        refresh_s = 1.0
        server = BackgroundServer(self.app.aitp, DashboardConfig(port=self.port,
                                                                 refresh_s=refresh_s)).start()
        try:
            base = f"http://127.0.0.1:{server.port}"
            for path, attr in (("/api/queues", "queues_ms"), ("/metrics", "metrics_ms")):
                first = get_ms(base + path)
                warm = [get_ms(base + path) for _ in range(5)]
                stale = []
                for _ in range(3):  # each past refresh_s: the snapshot is rebuilt
                    time.sleep(refresh_s * 1.2)
                    stale.append(get_ms(base + path))
                setattr(self.figures, attr, (statistics.median(warm), first, max(stale)))
            fleet = server.server.dashboard.fleet
            start = time.perf_counter()
            fleet.snapshot(max_age_s=0)
            self.figures.build_ms = (time.perf_counter() - start) * 1000
        finally:
            server.stop()

    def store_bytes(self) -> None:
        total = 0
        for key in self.client.scan_iter(f"{self.prefix}*", count=1000):
            total += int(self.client.memory_usage(key) or 0)
        self.figures.store_bytes = total

    def cleanup(self) -> None:
        if self.amqp:  # the run's queues (the default tenant's are every run's)
            with self.app.connection_for_write() as conn:
                for name in [*self.broker_queues(), self.queue + "-plain"]:
                    with contextlib.suppress(Exception):
                        conn.default_channel.queue_delete(name)
        common.close(self.app.aitp)
        common.cleanup(self.args.redis, [f"*{self.tag}*"])  # every key of the run has it

    def redis_cpu_s(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def __call__(self) -> Figures:
        worker = None
        try:
            self.idle_before()
            cpu = self.redis_cpu_s()
            self.publish()
            worker = self.drain()
            self.figures.redis_us = (self.redis_cpu_s() - cpu) / max(1, self.sent) * 1e6
            self.idle_after(worker)
            self.dashboard()
            self.store_bytes()
        finally:
            if worker is not None:
                worker.stop()
            with contextlib.suppress(Exception):
                self.cleanup()
                time.sleep(1.0)  # a stopping process's last flush may land late
                self.cleanup()
        return self.figures


def table(all_figures: list[Figures]) -> str:
    """One row per run; ratios against the first run's throughput and store size."""
    base = all_figures[0]
    lines = [
        "| tenants | layout | broker queues (consumers) | publish us (plain) | ratio "
        "| fallbacks | worker start s "
        "| drain tasks/s | vs first | idle CPU % (after drain) "
        "| /api/queues ms warm (first, stale) | /metrics ms warm (first, stale) "
        "| snapshot build ms | store KiB | B per extra tenant | Redis CPU us per task |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in all_figures:
        extra = f.tenants - base.tenants
        per_tenant = f"{(f.store_bytes - base.store_bytes) / extra:.0f}" if extra > 0 else "-"
        consumers = f" ({f.broker_consumers})" if f.broker_consumers >= 0 else ""
        lines.append(
            f"| {f.tenants:,} | {f.layout} | {f.queues:,}{consumers} "
            f"| {f.publish_us:.0f} ({f.plain_us:.0f}) "
            f"| {f.publish_us / f.plain_us:.2f}x | {f.fallbacks} | {f.startup_s:.1f} "
            f"| {f.throughput:.0f} | {f.throughput / base.throughput:.2f}x "
            f"| {f.idle_cpu * 100:.1f} ({f.idle_after_cpu * 100:.1f}) "
            f"| {f.queues_ms[0]:.0f} ({f.queues_ms[1]:.0f}, {f.queues_ms[2]:.0f}) "
            f"| {f.metrics_ms[0]:.0f} ({f.metrics_ms[1]:.0f}, {f.metrics_ms[2]:.0f}) "
            f"| {f.build_ms:.0f} | {f.store_bytes / 1024:.0f} "
            f"| {per_tenant} | {f.redis_us:.0f} |")
    for f in all_figures:
        for note in f.notes:
            lines.append(f"\n{f.tenants} tenants ({f.layout}): {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=common.REDIS_URL)
    parser.add_argument("--tenants", default="1,100,1000",
                        help="comma-separated tenant counts (e.g. 1,100,1000,10000)")
    parser.add_argument("--layouts", default="dedicated,class",
                        help=f"comma-separated tenant layouts, each run at every count "
                             f"({', '.join(LAYOUTS)}); a run 'N:layout' in --tenants "
                             f"overrides")
    parser.add_argument("--broker", default=None,
                        help="the broker's URL when not the Redis of --redis (RabbitMQ: "
                             "amqp://...; --redis stays the store)")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=12.0,
                        help="seconds between the worker's start and the idle measurement: "
                             "past the janitor's first pass, which looks at every classed "
                             "tenant's former queues once (on RabbitMQ about 20 s at 10,000 "
                             "tenants: use 40)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--port", type=int, default=int(os.environ.get("AITP_SCALE_PORT",
                                                                       "18500")))
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    results = []
    runs = []
    for value in args.tenants.split(","):
        count, _, layout = value.partition(":")
        for name in [layout] if layout else args.layouts.split(","):
            runs.append((int(count), name))
    for index, (n, layout) in enumerate(runs):
        print(f"{n} tenants, {layout} ...", flush=True)
        figures = Run(args, n, layout, index)()
        print(table([figures]), flush=True)
        results.append(figures)
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
