"""``celery-aitp demo``: the whole product on an embedded broker, start to finish.

Starts an embedded Redis (unless ``--broker`` is given), a CPU worker and a GPU worker
with AITP flags and a standard worker, publishes a mixed multi-tenant workload, prints
where tasks went and how long they waited, and stops every process it started.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import click
from rich.progress import Progress

from celery_aitp.cli.output import console, table
from celery_aitp.demo.embedded import EmbeddedRedis
from celery_aitp.errors import MissingExtra
from celery_aitp.redact import redact

WORKERS = {
    "cpu": ["--aitp-tenant", "*", "--aitp-accelerator", "cpu", "--aitp-no-default-queue",
            "-c", "4"],
    "gpu": ["--aitp-tenant", "acme", "--aitp-accelerator", "gpu", "--aitp-no-default-queue",
            "-c", "2"],
    "standard": ["-c", "2"],
}

#: (task, tenant, argument range, weight in the mix)
MIX = [
    ("score", "acme", 40, 4), ("score", "globex", 40, 2), ("report", "globex", 100, 2),
    ("report", "initech", 100, 2), ("embed", "acme", 20, 2), ("embed", "globex", 20, 1),
    ("cleanup", "initech", 5, 1), ("cleanup", None, 5, 1),
]


@contextmanager
def worker(name: str, args: list[str], env: dict[str, str],
           app: str = "celery_aitp.demo.app") -> Iterator[subprocess.Popen[bytes]]:
    """A Celery worker process of the demo app, stopped (by its pid) on exit."""
    cmd = [sys.executable, "-m", "celery", "-A", app, "worker",
           "-n", f"{name}@demo", "--pool", "threads", "--loglevel", "WARNING",
           "--without-gossip", "--without-mingle", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_workers(store: Any, expected: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(store.workers()) >= expected:
            return
        time.sleep(0.2)
    raise click.ClickException("workers did not come up in time")


def publish(demo: Any, count: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    weights = [m[3] for m in MIX]
    results = []
    with Progress(console=console, transient=False) as progress:
        sent = progress.add_task("publishing", total=count)
        for _ in range(count):
            task, tenant, top, _w = rng.choices(MIX, weights)[0]
            headers = {"aitp_tenant": tenant} if tenant else {}
            results.append(getattr(demo, task).apply_async((rng.randint(1, top),), headers=headers))
            progress.advance(sent)
        done = progress.add_task("running", total=count)
        pending = list(results)
        deadline = time.monotonic() + 90
        while pending and time.monotonic() < deadline:
            still = [r for r in pending if not r.ready()]
            progress.advance(done, len(pending) - len(still))
            pending = still
            time.sleep(0.05)
    if pending:
        raise click.ClickException(f"{len(pending)} task(s) did not finish in time")
    return results


def serve_dashboard(stack: ExitStack, middleware: Any, port: int) -> None:
    """The dashboard on 127.0.0.1:port for the demo's app, stopped with the demo."""
    try:
        from celery_aitp.dashboard.config import DashboardConfig
        from celery_aitp.dashboard.server import BackgroundServer
    except ImportError as exc:
        raise click.ClickException(
            f"--dashboard needs the extra: pip install 'celery-aitp[dashboard]' ({exc})") from None
    server = BackgroundServer(middleware, DashboardConfig(port=port, refresh_s=1.0)).start()
    stack.callback(server.stop)
    console.print(f"dashboard: [bold]http://127.0.0.1:{server.port}/[/bold]")


def trickle(demo: Any, seed: int, per_second: float = 8.0) -> None:
    """Keep publishing the mix (without waiting for results) until Ctrl-C."""
    rng = random.Random(seed + 1)
    weights = [m[3] for m in MIX]
    console.print("publishing a steady trickle of tasks; watch the dashboard, Ctrl-C to stop")

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)  # stop cleanly on SIGTERM too
    try:
        while True:
            task, tenant, top, _w = rng.choices(MIX, weights)[0]
            headers = {"aitp_tenant": tenant} if tenant else {}
            getattr(demo, task).apply_async((rng.randint(1, top),), headers=headers)
            time.sleep(1.0 / per_second)
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)


def summarise(records: list[dict[str, Any]]) -> None:
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for r in records:
        key = (str(r.get("tenant")), str(r.get("tier")), str(r.get("accelerator")),
               str(r.get("queue")))
        groups[key].append(float(r.get("wait_s") or 0.0) * 1000)
    rows = []
    for (tenant, tier, accel, queue), waits in sorted(groups.items()):
        waits.sort()
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))]
        rows.append((tenant, tier, accel, queue, len(waits), statistics.median(waits), p95))
    table("where tasks ran (wait in ms)",
          ["tenant", "tier", "accel", "queue", "tasks", "wait p50", "wait p95"], rows)


@click.command("demo")
@click.option("--tasks", default=300, show_default=True, help="How many tasks to publish.")
@click.option("--broker", default=None, help="Use this Redis URL instead of an embedded one.")
@click.option("--seed", default=7, show_default=True, help="Seed of the workload mix.")
@click.option("--dashboard", "dashboard_port", type=int, default=None, metavar="PORT",
              help="Also serve the dashboard on 127.0.0.1:PORT (0: any free port) and keep "
                   "publishing after the summary until Ctrl-C.")
@click.option("--tour", is_flag=True,
              help="Instead of the comparison: one run of a mixed multi-tenant workload "
                   "(declared tiers, a GPU class) and where each task went (implied by "
                   "--dashboard).")
@click.option("--seconds", default=15.0, show_default=True,
              help="How long each run of the comparison publishes.")
def command(tasks: int, broker: str | None, seed: int, dashboard_port: int | None,
            tour: bool, seconds: float) -> None:
    """Run one workload of undeclared short and long tasks under plain Celery, then under
    celery_aitp, on an embedded broker, and print the difference side by side."""
    compare = not tour and dashboard_port is None
    started = time.monotonic()
    with ExitStack() as stack:
        try:
            url = broker or stack.enter_context(EmbeddedRedis()).url
        except MissingExtra as exc:
            raise click.ClickException(str(exc)) from None
        if compare:
            from celery_aitp.demo.versus import compare as run_compare

            console.print(f"broker: {'embedded Redis' if broker is None else redact(url)}")
            run_compare(lambda app, args, env: worker(app.rsplit(":", 1)[-1], args, env, app),
                        url, seconds, seed)
            console.print(f"done in {time.monotonic() - started:.1f}s")
            return
        env = dict(os.environ, AITP_DEMO_BROKER=url, AITP_DEMO_PREFIX=f"aitp-demo-{os.getpid()}")
        os.environ.update(AITP_DEMO_BROKER=url, AITP_DEMO_PREFIX=env["AITP_DEMO_PREFIX"])
        from celery_aitp.demo import app as demo

        console.print(f"broker: {'embedded Redis' if broker is None else redact(url)}")
        for name, args in WORKERS.items():
            stack.enter_context(worker(name, args, env))
        store = demo.app.aitp.store
        store.write_stage({"stage": "takeover", "split": {}}, who="celery-aitp demo")
        wait_for_workers(store, expected=2)
        if dashboard_port is not None:
            serve_dashboard(stack, demo.app.aitp, dashboard_port)
        publish(demo, tasks, seed)
        deadline = time.monotonic() + 10
        records = []
        while time.monotonic() < deadline:
            records = store.read_records(store.keys.observations)
            if len(records) >= tasks:
                break
            time.sleep(0.2)
        summarise(records)
        counts = demo.app.aitp.counters.totals
        routed = sum(n for k, n in counts.items() if k.endswith(":routed"))
        console.print(f"{tasks} tasks: {routed} routed to tier queues, "
                      f"{tasks - routed} on the standard path; "
                      f"{len(records)} runs recorded; {time.monotonic() - started:.1f}s")
        if dashboard_port is not None:
            trickle(demo, seed)
        demo.app.aitp.close()
