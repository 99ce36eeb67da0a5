"""``celery-aitp demo``: one workload under plain Celery, then under celery_aitp.

The same seeded stream of undeclared tasks (80% short ``thumbnail`` calls of 10-50 ms,
20% long ``transcode`` calls of 0.5-1.5 s, Poisson arrivals at about 85% of one
four-thread worker's capacity) is published twice on one broker: first to a plain
Celery worker, then to a worker started with ``--aitp-tenant '*'`` while the app places
each task by its predicted runtime (learned from the runs it sees; nothing declared, no
model trained beforehand). Each task returns when it started, so both runs measure waits
the same way; the figures are printed side by side.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import click

from celery_aitp.cli.output import console, table

SLOTS = 4
SHORT_MS = (10, 50)
LONG_MS = (500, 1500)
LONG_SHARE = 0.2
#: Runtime floor of the bounded slowdown, seconds (as the replay's default).
TAU_S = 0.1
PLAIN_WORKER = ["-c", str(SLOTS)]
AITP_WORKER = ["--aitp-tenant", "*", "-c", str(SLOTS)]


@dataclass(frozen=True)
class Item:
    at: float  # seconds after the start of the run
    task: str  # 'thumbnail' or 'transcode'
    ms: int


@dataclass(frozen=True)
class Figures:
    """What one run measured."""

    tasks: int
    lost: int
    short_p50_s: float
    short_p95_s: float
    mean_slowdown: float
    long_max_s: float


def workload(seconds: float, load: float, seed: int) -> list[Item]:
    """Poisson arrivals whose offered load on ``SLOTS`` slots is ``load``."""
    rng = random.Random(seed)
    mean_s = ((1 - LONG_SHARE) * sum(SHORT_MS) / 2 + LONG_SHARE * sum(LONG_MS) / 2) / 1000
    rate = load * SLOTS / mean_s
    items: list[Item] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return items
        long = rng.random() < LONG_SHARE
        low, high = LONG_MS if long else SHORT_MS
        items.append(Item(at, "transcode" if long else "thumbnail", rng.randint(low, high)))


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def figures(items: Sequence[Item], waits: Sequence[float | None]) -> Figures:
    """Short tasks' waits, mean bounded slowdown and long tasks' longest wait."""
    done = [(i, w) for i, w in zip(items, waits, strict=True) if w is not None]
    short = [w for i, w in done if i.task == "thumbnail"]
    long = [w for i, w in done if i.task != "thumbnail"]
    slowdowns = [max(1.0, (w + i.ms / 1000) / max(i.ms / 1000, TAU_S)) for i, w in done]
    return Figures(len(items), sum(1 for w in waits if w is None), _percentile(short, 0.5),
                   _percentile(short, 0.95),
                   sum(slowdowns) / len(slowdowns) if slowdowns else math.nan,
                   max(long) if long else math.nan)


def wait_until_ready(app: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.control.inspect(timeout=0.5).ping():
            return
    raise click.ClickException("the worker did not come up in time")


def publish_and_wait(app: Any, items: Sequence[Item], timeout_s: float = 120.0
                     ) -> list[float | None]:
    """Publish ``items`` on schedule; each one's wait (None: it never finished)."""
    start = time.time()
    sent = []
    for item in items:
        delay = start + item.at - time.time()
        if delay > 0:
            time.sleep(delay)
        published = time.time()
        sent.append((published, app.tasks[f"demo.{item.task}"].apply_async((item.ms,))))
    deadline = time.monotonic() + timeout_s
    waits: list[float | None] = []
    for published, result in sent:
        try:
            started = result.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # a lost or failed task: counted, never hidden
            waits.append(None)
            continue
        waits.append(max(0.0, float(started) - published))
    return waits


def run_once(stack_worker: Any, app: Any, app_ref: str, args: list[str], env: dict[str, str],
             items: Sequence[Item]) -> Figures:
    with ExitStack() as stack:
        stack.enter_context(stack_worker(app_ref, args, env))
        wait_until_ready(app)
        return figures(items, publish_and_wait(app, items))


def print_side_by_side(plain: Figures, aitp: Figures) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "-"

    rows = [
        ("short tasks' wait p50 (ms)", f"{plain.short_p50_s * 1000:.0f}",
         f"{aitp.short_p50_s * 1000:.0f}", ratio(aitp.short_p50_s, plain.short_p50_s)),
        ("short tasks' wait p95 (ms)", f"{plain.short_p95_s * 1000:.0f}",
         f"{aitp.short_p95_s * 1000:.0f}", ratio(aitp.short_p95_s, plain.short_p95_s)),
        ("mean bounded slowdown", f"{plain.mean_slowdown:.2f}", f"{aitp.mean_slowdown:.2f}",
         ratio(aitp.mean_slowdown, plain.mean_slowdown)),
        ("long tasks' longest wait (s)", f"{plain.long_max_s:.2f}", f"{aitp.long_max_s:.2f}",
         ratio(aitp.long_max_s, plain.long_max_s)),
        ("tasks (lost)", f"{plain.tasks} ({plain.lost})", f"{aitp.tasks} ({aitp.lost})", ""),
    ]
    table("the same workload, side by side", ["", "plain Celery", "celery_aitp", "ratio"], rows)


def compare(stack_worker: Any, broker_url: str, seconds: float, seed: int) -> None:
    """Both runs on ``broker_url``; prints the side-by-side table."""
    env = dict(os.environ, AITP_DEMO_BROKER=broker_url,
               AITP_DEMO_PREFIX=f"aitp-versus-{os.getpid()}")
    os.environ.update(AITP_DEMO_BROKER=broker_url, AITP_DEMO_PREFIX=env["AITP_DEMO_PREFIX"])
    from celery_aitp.demo import versus_app

    items = workload(seconds, 0.85, seed)
    long = sum(1 for i in items if i.task == "transcode")
    console.print(f"workload: {len(items)} undeclared tasks over {seconds:g}s "
                  f"({len(items) - long} short, {long} long), about 85% of {SLOTS} slots")
    console.print("run 1: plain Celery (one FIFO queue)")
    plain = run_once(stack_worker, versus_app.plain, "celery_aitp.demo.versus_app:plain",
                     PLAIN_WORKER, env, items)
    console.print("run 2: celery_aitp, default policy, takeover (nothing declared, no model)")
    store = versus_app.aitp.aitp.store
    store.write_stage({"stage": "takeover", "split": {}}, who="celery-aitp demo")
    aitp = run_once(stack_worker, versus_app.aitp, "celery_aitp.demo.versus_app:aitp",
                    AITP_WORKER, env, items)
    print_side_by_side(plain, aitp)
    versus_app.aitp.aitp.close()
